//! Maps sqlx / MySQL errors (server error numbers) to outbox error kinds.

use outbox_core::{Error, ErrorKind};

/// Converts a sqlx error into an outbox [`Error`] whose kind tells retry from fix, with
/// `context` saying what was being done.
///
/// A lost or refused connection is [`ErrorKind::Connection`] (retried); a lock wait past
/// `innodb_lock_wait_timeout` is [`ErrorKind::Timeout`]; a missing table or database is
/// [`ErrorKind::Schema`] with a hint to run `outbox migrate`; a refused login is
/// [`ErrorKind::Config`]; a duplicate key is [`ErrorKind::UniqueViolation`].
pub fn map_sqlx_error(context: &str, err: sqlx::Error) -> Error {
    let kind = match &err {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => ErrorKind::Connection,
        sqlx::Error::PoolTimedOut => ErrorKind::Timeout,
        sqlx::Error::Configuration(_) => ErrorKind::Config,
        // The server's error number, not `code()`: sqlx gives the SQLSTATE there, which
        // many numbers share (`HY000`) and which never equals a number.
        sqlx::Error::Database(db) => match db
            .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
            .map(|e| e.number())
        {
            // ER_DUP_ENTRY
            Some(1062) => ErrorKind::UniqueViolation,
            // ER_NO_SUCH_TABLE, ER_BAD_FIELD_ERROR, ER_SP_DOES_NOT_EXIST
            Some(1146) | Some(1054) | Some(1305) => ErrorKind::Schema,
            // ER_LOCK_WAIT_TIMEOUT: a row lock past `innodb_lock_wait_timeout`, or a table's
            // metadata lock past `lock_wait_timeout`
            Some(1205) => ErrorKind::Timeout,
            // ER_CON_COUNT_ERROR, ER_SERVER_SHUTDOWN, ER_QUERY_INTERRUPTED,
            // ER_CONNECTION_KILLED, the client's lost-connection numbers
            Some(1040) | Some(1053) | Some(1317) | Some(1927) | Some(2002) | Some(2003)
            | Some(2006) | Some(2013) => ErrorKind::Connection,
            // ER_ACCESS_DENIED_ERROR, ER_DBACCESS_DENIED_ERROR, ER_BAD_DB_ERROR
            Some(1045) | Some(1044) | Some(1049) => ErrorKind::Config,
            _ => ErrorKind::Database,
        },
        _ => ErrorKind::Other,
    };
    let hint = match kind {
        ErrorKind::Schema => "; run `outbox migrate` for this database",
        ErrorKind::Connection => "; will retry",
        _ => "",
    };
    Error::with_source(kind, format!("{context}: {err}{hint}"), err)
}
