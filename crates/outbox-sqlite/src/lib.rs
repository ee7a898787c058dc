//! SQLite backend of the outbox (the embedded default): migrations, the transactional writer
//! (`enqueue`) and the [`SqliteStore`] the relay claims, leases and completes rows through.
//!
//! SQL lives in `migrations/*.sql` and `queries/*.sql`. SQLite has no schemas: the table names
//! (`outbox`, `outbox_partitions`, `outbox_members`, `outbox_migrations`, `outbox_redrives`)
//! are fixed, except that another table set can live beside them under a prefix of its own
//! ([`Tables`]; the inbox's processing queue is `inbox_queue`), the only text ever spliced into
//! the SQL. Requires SQLite 3.35 or later (generated columns,
//! `RETURNING`, `UPDATE … FROM`); the bundled library is newer.

mod error;
mod gauges;
mod migrate;
mod store;
mod tables;
mod writer;

pub use error::map_sqlx_error;
pub use gauges::GAUGES_PENDING_CAP;
pub use migrate::{
    apply_pending, check_schema, migrate, migrate_tables, MIGRATIONS, SCHEMA_VERSION,
};
pub use store::{
    begin_immediate, connect_options, connect_pool, connect_pool_sized, database_path,
    remove_database, SqliteStore, BUSY_TIMEOUT, DEFAULT_PATH, PARTITIONS,
};
pub use tables::{Tables, DEFAULT_PREFIX};
pub use writer::{enqueue, enqueue_many, Writer};
