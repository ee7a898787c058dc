//! MySQL/MariaDB backend of the outbox: migrations and the transactional writer (`enqueue`).
//!
//! Every message row gets a gapless position in its partition, drawn in commit order by a
//! trigger, so a relay can read each partition as a plain index range without snapshots (see
//! `docs/engine-mysql.md`, which also records the measurements behind the design). The store
//! the relay claims through comes next; until then `outbox` commands refuse `mysql://` URLs.
//!
//! SQL lives in `migrations/*.sql`; the database name is the only thing spliced into it, and
//! only after [`Schema::new`] validated it.

mod error;
mod migrate;
mod schema;
mod writer;

pub use error::map_sqlx_error;
pub use migrate::{migrate, MIGRATIONS, SCHEMA_VERSION};
pub use schema::Schema;
pub use writer::{enqueue, enqueue_many};

/// How many partitions the messages are spread over (by a hash of the key): the trigger's
/// modulus and the number of counter rows.
pub const PARTITIONS: i32 = 64;
