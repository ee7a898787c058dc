//! The SQLite inbox: the same tables in one file, with the processing queue as a second outbox
//! table set (`inbox_queue…`) beside the application's `outbox…`.

/// The prefix of the processing queue's tables in a SQLite inbox.
pub const QUEUE_PREFIX: &str = "inbox_queue";
