//! PostgreSQL backend of the outbox: migrations, the transactional writer (`enqueue`) and the
//! [`PgStore`] the relay claims, leases and completes rows through.
//!
//! SQL lives in `migrations/*.sql` and `queries/*.sql`; the schema name is the only thing spliced
//! into it, and only after [`Schema::new`] validated it.

mod begin;
pub mod cdc;
pub mod debezium;
mod error;
mod gauges;
mod grants;
mod journey;
mod migrate;
mod retention;
mod schema;
pub mod servers;
mod store;
mod ticket;
mod writer;

pub use cdc::emit::{emit, Emitter};
pub use error::map_sqlx_error;
pub use gauges::GAUGES_PENDING_CAP;
pub use grants::{create_login, drop_login, grant, let_own};
pub use migrate::{
    apply_pending, check_schema, migrate, notify_installed, set_notify, MIGRATIONS, SCHEMA_VERSION,
};
pub use retention::LOOKAHEAD_SEGMENTS;
pub use schema::Schema;
pub use store::{
    connect_error, connect_options, connect_options_with, connect_pool, connect_pool_with,
    statement_timeout_for, HeldCompletion, PgStore, DEFAULT_STORE_DEADLINE, PARTITIONS,
    PENDING_COUNT_CAP,
};
pub use writer::{enqueue, enqueue_many, Writer};
