//! The receiving side of the outbox. At-least-once delivery makes idempotent consumers
//! mandatory; this crate gives them two layers and a full inbox (see `docs/consumers.md`):
//!
//! - **Layer 1, the dedupe claim** ([`claim`]): `processed_messages (consumer, message_id)`,
//!   inserted in the consumer's business transaction; `false` means already processed. A Redis
//!   `SET NX` variant ([`redis_dedupe`], weaker) exists for speed.
//! - **Layer 2, idempotent effects**: upserts by business key, conditional transitions,
//!   ledger entries keyed by message id ([`effects`]; examples in `docs/consumers.md` and
//!   `tests/effects.rs`).
//! - **The inbox** ([`ingest`], [`InboxProcessor`]): `inbox_messages` records each message id
//!   once; ingest queues new ones into a processing queue that is the outbox engine itself, and
//!   the processor runs registered handlers over it with the relay engine: per-key order,
//!   backoff, `failed`, redrive.
//! - **The ingest daemon** ([`daemon`], `outbox inbox`): takes messages from a broker
//!   ([`source`]) into the inbox in batches and acknowledges the broker only after the insert
//!   committed.
//! - **Request idempotency keys** ([`idempotent`]).
//!
//! Everything that takes `&mut tx` runs in the caller's `sqlx::Transaction`, PostgreSQL, MySQL
//! (MariaDB) or SQLite ([`InboxTx`]).

mod cloudevent;
pub mod daemon;
mod database;
pub mod effects;
pub mod idempotency;
mod inbox;
mod message;
mod migrate;
pub mod mysql;
pub mod processor;
#[cfg(feature = "redis")]
pub mod redis_dedupe;
pub mod retention;
pub mod source;
pub mod spans;
pub mod sqlite;
mod tables;
pub mod telemetry;
mod tx;

pub use database::InboxDatabase;
pub use idempotency::{IdempotencyError, Idempotent, Response};
pub use inbox::{claim, idempotent, ingest, Inbox};
pub use message::{position_id, InboxMessage, PayloadFormat};
pub use migrate::{
    migrate_mysql, migrate_postgres, migrate_sqlite, MYSQL_MIGRATIONS, POSTGRES_MIGRATIONS,
    SQLITE_MIGRATIONS,
};
pub use processor::{
    FnHandler, Handler, HandlerError, HandlerErrorKind, Handlers, InboxProcessor, ProcessorConfig,
};
pub use tables::{InboxSchema, PROCESSOR_CONSUMER, QUEUE_SUFFIX};
pub use tx::{InboxTx, StoredKey};
