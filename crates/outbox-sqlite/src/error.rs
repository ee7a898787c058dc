//! Maps sqlx / SQLite errors (extended result codes) to outbox error kinds.

use outbox_core::{Error, ErrorKind};

// SQLite primary result codes (the low byte of an extended code).
const SQLITE_ERROR: i64 = 1;
const SQLITE_PERM: i64 = 3;
const SQLITE_BUSY: i64 = 5;
const SQLITE_LOCKED: i64 = 6;
const SQLITE_READONLY: i64 = 8;
const SQLITE_IOERR: i64 = 10;
const SQLITE_CORRUPT: i64 = 11;
const SQLITE_CANTOPEN: i64 = 14;
const SQLITE_CONSTRAINT: i64 = 19;
const SQLITE_AUTH: i64 = 23;
const SQLITE_NOTADB: i64 = 26;
// Extended codes of SQLITE_CONSTRAINT.
const SQLITE_CONSTRAINT_PRIMARYKEY: i64 = 1555;
const SQLITE_CONSTRAINT_UNIQUE: i64 = 2067;

/// Converts a sqlx error into an outbox [`Error`] whose kind tells retry from fix, with
/// `context` saying what was being done.
///
/// `SQLITE_BUSY` / `SQLITE_LOCKED` (another writer held the file past the busy timeout) are
/// [`ErrorKind::Timeout`], transient; a missing table or column is [`ErrorKind::Schema`] with a
/// hint to run `outbox migrate`; a duplicate id is [`ErrorKind::UniqueViolation`]; a file that
/// cannot be opened, is read-only or is not a database is [`ErrorKind::Config`].
pub fn map_sqlx_error(context: &str, err: sqlx::Error) -> Error {
    let kind = match &err {
        sqlx::Error::Io(_) | sqlx::Error::PoolClosed | sqlx::Error::WorkerCrashed => {
            ErrorKind::Connection
        }
        sqlx::Error::PoolTimedOut => ErrorKind::Timeout,
        sqlx::Error::Configuration(_) => ErrorKind::Config,
        sqlx::Error::Database(db) => {
            let code: i64 = db.code().and_then(|c| c.parse().ok()).unwrap_or(-1);
            match (code & 0xff, code) {
                (_, SQLITE_CONSTRAINT_UNIQUE | SQLITE_CONSTRAINT_PRIMARYKEY) => {
                    ErrorKind::UniqueViolation
                }
                (SQLITE_CONSTRAINT, _) => ErrorKind::Database,
                (SQLITE_BUSY | SQLITE_LOCKED, _) => ErrorKind::Timeout,
                (SQLITE_IOERR, _) => ErrorKind::Connection,
                (SQLITE_CANTOPEN | SQLITE_READONLY | SQLITE_PERM | SQLITE_AUTH, _)
                | (SQLITE_NOTADB | SQLITE_CORRUPT, _) => ErrorKind::Config,
                (SQLITE_ERROR, _) if is_missing_schema(db.message()) => ErrorKind::Schema,
                _ => ErrorKind::Database,
            }
        }
        _ => ErrorKind::Other,
    };
    let hint = match kind {
        ErrorKind::Schema => "; run `outbox migrate` for this database",
        ErrorKind::Connection => "; will retry",
        _ => "",
    };
    Error::with_source(kind, format!("{context}: {err}{hint}"), err)
}

/// Whether a generic SQLite error message says a table, column or index of the outbox is
/// missing (SQLite reports these as plain `SQLITE_ERROR`, told apart only by the text).
fn is_missing_schema(message: &str) -> bool {
    ["no such table", "no such column", "no such index"]
        .iter()
        .any(|m| message.starts_with(m))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_schema_messages_are_recognised() {
        assert!(is_missing_schema("no such table: outbox"));
        assert!(is_missing_schema("no such column: partition"));
        assert!(!is_missing_schema("near \"SELEC\": syntax error"));
    }

    #[test]
    fn pool_errors_are_transient() {
        let e = map_sqlx_error("claiming", sqlx::Error::PoolTimedOut);
        assert_eq!(e.kind(), ErrorKind::Timeout);
        assert!(e.is_transient());
        assert!(e.to_string().starts_with("claiming: "));
    }
}
