//! The error type shared by stores and the relay, with a `kind()` callers can match on.

use std::fmt;

/// Result alias used across the outbox crates.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What sort of failure an [`Error`] is, so callers can decide to retry, reconnect or give up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The database or broker could not be reached or the connection dropped; retry later.
    Connection,
    /// An operation did not finish in time; retry later.
    Timeout,
    /// Configuration is invalid (bad URL, identifier, template); fix the config.
    Config,
    /// The schema is missing or older than this binary expects; run `outbox migrate`.
    Schema,
    /// A row or message cannot be processed as stored (malformed headers, bad destination).
    Malformed,
    /// A unique constraint was violated (duplicate message id).
    UniqueViolation,
    /// Anything else reported by the database.
    Database,
    /// Anything else.
    Other,
}

impl ErrorKind {
    /// Whether retrying the same operation later may succeed without anyone changing anything.
    pub fn is_transient(self) -> bool {
        matches!(
            self,
            ErrorKind::Connection | ErrorKind::Timeout | ErrorKind::Database
        )
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            ErrorKind::Connection => "connection",
            ErrorKind::Timeout => "timeout",
            ErrorKind::Config => "config",
            ErrorKind::Schema => "schema",
            ErrorKind::Malformed => "malformed",
            ErrorKind::UniqueViolation => "unique violation",
            ErrorKind::Database => "database",
            ErrorKind::Other => "other",
        };
        f.write_str(s)
    }
}

/// An error from a store or the relay. Its message never contains a password or a payload.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Error {
    kind: ErrorKind,
    message: String,
    #[source]
    source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
}

impl Error {
    /// A new error of `kind`; `message` says what failed and what to do.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: crate::redact::sanitize(&message.into()),
            source: None,
        }
    }

    /// A new error of `kind` that keeps `source` for `Error::source()` chains.
    pub fn with_source(
        kind: ErrorKind,
        message: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Self {
            kind,
            message: crate::redact::sanitize(&message.into()),
            source: Some(Box::new(source)),
        }
    }

    /// A configuration error.
    pub fn config(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Config, message)
    }

    /// What sort of error this is.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// Whether retrying later may succeed.
    pub fn is_transient(&self) -> bool {
        self.kind.is_transient()
    }
}
