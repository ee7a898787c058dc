//! Maps sqlx / PostgreSQL errors (SQLSTATE) to outbox error kinds.

use outbox_core::{Error, ErrorKind};

/// Converts a sqlx error into an outbox [`Error`] whose kind tells retry from fix, with
/// `context` saying what was being done.
pub fn map_sqlx_error(context: &str, err: sqlx::Error) -> Error {
    let kind = match &err {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => ErrorKind::Connection,
        sqlx::Error::PoolTimedOut => ErrorKind::Timeout,
        sqlx::Error::Configuration(_) => ErrorKind::Config,
        sqlx::Error::Database(db) => match db.code().as_deref() {
            Some("23505") => ErrorKind::UniqueViolation,
            // undefined_table, undefined_function, invalid_schema_name, undefined_column
            Some("42P01") | Some("42883") | Some("3F000") | Some("42703") => ErrorKind::Schema,
            // connection exceptions, admin shutdown, crash shutdown, cannot connect now
            Some(c) if c.starts_with("08") || c.starts_with("57P") => ErrorKind::Connection,
            Some("28P01") | Some("28000") | Some("3D000") => ErrorKind::Config,
            _ => ErrorKind::Database,
        },
        _ => ErrorKind::Other,
    };
    let hint = match kind {
        ErrorKind::Schema => "; run `outbox migrate` for this schema",
        ErrorKind::Connection => "; will retry",
        _ => "",
    };
    Error::with_source(kind, format!("{context}: {err}{hint}"), err)
}
