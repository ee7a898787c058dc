//! The writer API: enqueue messages inside the caller's own transaction.
//!
//! Guarantee: the rows exist iff the caller's transaction commits. Nothing here touches anything
//! beyond the caller's own connection, and each call is one `INSERT`.

use outbox_core::{Error, ErrorKind, NewMessage, Result};
use sqlx::{Sqlite, Transaction};
use uuid::Uuid;

use crate::error::map_sqlx_error;
use crate::tables::Tables;

const ENQUEUE_SQL: &str = include_str!("../queries/enqueue.sql");

/// Writes outbox rows into the database's `outbox` table (or another table set's, see
/// [`Writer::for_tables`]).
#[derive(Debug, Clone)]
pub struct Writer {
    sql: std::borrow::Cow<'static, str>,
}

impl Default for Writer {
    fn default() -> Self {
        Self {
            sql: std::borrow::Cow::Borrowed(ENQUEUE_SQL),
        }
    }
}

impl Writer {
    /// A writer for the `outbox` table.
    pub fn new() -> Self {
        Self::default()
    }

    /// A writer for the message table of `tables`.
    pub fn for_tables(tables: &Tables) -> Self {
        Self {
            sql: std::borrow::Cow::Owned(tables.render(ENQUEUE_SQL)),
        }
    }

    /// Adds `message` to the outbox inside `tx`. See [`Writer::enqueue_many`].
    pub async fn enqueue(
        &self,
        tx: &mut Transaction<'_, Sqlite>,
        message: &NewMessage,
    ) -> Result<Uuid> {
        self.enqueue_many(tx, std::slice::from_ref(message)).await?;
        Ok(message.id)
    }

    /// Adds `messages` to the outbox inside `tx`, in one statement, keeping their order (the
    /// batch goes in as one JSON array parameter, so its size meets no bound-parameter limit).
    /// Payloads and headers are stored as `serde_json` writes them and published byte for byte.
    ///
    /// Ordering: SQLite admits one writing transaction at a time per database file, so a second
    /// transaction that writes the same key waits (up to the busy timeout) until the first has
    /// committed before it draws its `seq`: `seq` order within a key is commit order without any
    /// lock of ours. Open transactions that will write with [`crate::begin_immediate`] (a
    /// `BEGIN IMMEDIATE` that a dropped caller cannot leave open): a deferred transaction that
    /// read before it writes can fail with `SQLITE_BUSY` (an [`ErrorKind::Timeout`]) when
    /// another writer committed in between, where an immediate one would simply have waited.
    ///
    /// A message whose id already exists fails with [`ErrorKind::UniqueViolation`].
    pub async fn enqueue_many(
        &self,
        tx: &mut Transaction<'_, Sqlite>,
        messages: &[NewMessage],
    ) -> Result<()> {
        if messages.is_empty() {
            return Ok(());
        }
        let rows: Vec<_> = messages
            .iter()
            .map(|m| {
                (
                    m.id.to_string(),
                    m.aggregate_type.as_str(),
                    m.aggregate_id.as_str(),
                    m.event_type.as_str(),
                    m.payload.to_string(),
                    serde_json::Value::Object(m.headers.clone()).to_string(),
                    m.topic.as_deref(),
                )
            })
            .collect();
        let rows = serde_json::to_string(&rows).map_err(|e| {
            Error::with_source(ErrorKind::Other, "encoding outbox messages as JSON", e)
        })?;
        sqlx::query(&self.sql)
            .bind(rows)
            .execute(&mut **tx)
            .await
            .map_err(|e| {
                let e = map_sqlx_error("enqueueing outbox messages", e);
                if e.kind() == ErrorKind::UniqueViolation {
                    Error::new(
                        ErrorKind::UniqueViolation,
                        "an outbox message with this id already exists",
                    )
                } else {
                    e
                }
            })?;
        Ok(())
    }
}

/// Adds `message` to the `outbox` table inside `tx`. See [`Writer::enqueue_many`].
pub async fn enqueue(tx: &mut Transaction<'_, Sqlite>, message: &NewMessage) -> Result<Uuid> {
    Writer::new().enqueue(tx, message).await
}

/// Adds `messages` to the `outbox` table inside `tx`, in one statement, keeping their order.
/// See [`Writer::enqueue_many`].
pub async fn enqueue_many(tx: &mut Transaction<'_, Sqlite>, messages: &[NewMessage]) -> Result<()> {
    Writer::new().enqueue_many(tx, messages).await
}
