//! The SQLite inbox: the same tables in one file, with the processing queue as a second outbox
//! table set (`inbox_queue…`) beside the application's `outbox…`.

use outbox_sqlite::Tables;

/// The prefix of the processing queue's tables in a SQLite inbox.
pub const QUEUE_PREFIX: &str = "inbox_queue";

/// The processing queue's table set.
pub fn queue_tables() -> Tables {
    // A fixed, valid identifier.
    Tables::new(QUEUE_PREFIX).unwrap_or_default()
}
