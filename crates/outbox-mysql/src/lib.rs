//! MySQL/MariaDB backend of the outbox: migrations, the transactional writer (`enqueue`) and
//! the relay's store ([`MysqlStore`]).
//!
//! Every message row gets a gapless position in its partition, drawn in commit order by a
//! trigger, so a relay can read each partition as a plain index range without snapshots (see
//! `docs/engine-mysql.md`, which also records the measurements behind the design).
//!
//! SQL lives in `migrations/*.sql`; the database name is the only thing spliced into it, and
//! only after [`Schema::new`] validated it.

pub mod binlog;
pub mod debezium;
mod error;
pub mod grants;
mod migrate;
mod queries;
pub mod ranges;
mod schema;
mod store;
mod ticket;
mod writer;

pub use error::map_sqlx_error;
pub use migrate::{apply_migrations, check_schema, migrate, MIGRATIONS, SCHEMA_VERSION};
pub use schema::Schema;
pub use store::{connect_options, connect_pool, url_database, MysqlStore, PARKED_CAP};
pub use writer::{enqueue, enqueue_many};

/// How many partitions the messages are spread over (by a hash of the key): the trigger's
/// modulus and the number of counter rows.
pub const PARTITIONS: i32 = 64;
