//! The writer API: enqueue messages inside the caller's own transaction.
//!
//! Guarantee: the rows exist iff the caller's transaction commits. Nothing here touches the
//! network beyond the caller's own database connection, and each call is one `INSERT`.

use outbox_core::{Error, ErrorKind, NewMessage, Result};
use sqlx::{Postgres, Transaction};
use uuid::Uuid;

use crate::error::map_sqlx_error;
use crate::schema::Schema;

const ENQUEUE_SQL: &str = include_str!("../queries/enqueue.sql");
const ENQUEUE_ONE_SQL: &str = include_str!("../queries/enqueue_one.sql");

/// Writes outbox rows into one schema's `outbox` table.
#[derive(Debug, Clone)]
pub struct Writer {
    sql: String,
    one: String,
}

impl Default for Writer {
    fn default() -> Self {
        Self::new(&Schema::default())
    }
}

impl Writer {
    /// A writer for `schema`.
    pub fn new(schema: &Schema) -> Self {
        Self {
            sql: schema.render(ENQUEUE_SQL),
            one: schema.render(ENQUEUE_ONE_SQL),
        }
    }

    /// Adds `message` to the outbox inside `tx`. See [`Writer::enqueue_many`].
    pub async fn enqueue(
        &self,
        tx: &mut Transaction<'_, Postgres>,
        message: &NewMessage,
    ) -> Result<Uuid> {
        let m = message;
        sqlx::query(&self.one)
            .bind(m.id)
            .bind(m.aggregate_type.as_str())
            .bind(m.aggregate_id.as_str())
            .bind(m.event_type.as_str())
            .bind(m.payload.to_string())
            .bind(serde_json::Value::Object(m.headers.clone()).to_string())
            .bind(m.topic.as_deref())
            .execute(&mut **tx)
            .await
            .map_err(|e| map_sqlx_error("enqueueing an outbox message", e))?;
        Ok(message.id)
    }

    /// Adds `messages` to the outbox inside `tx`, in one statement, keeping their order.
    ///
    /// Ordering: the statement takes a transaction-scoped advisory lock per ordering key before
    /// it draws sequence numbers, so for two transactions that write the same key, the one that
    /// commits first has the smaller sequences and is delivered first. Call it after the
    /// business write, in the same transaction.
    pub async fn enqueue_many(
        &self,
        tx: &mut Transaction<'_, Postgres>,
        messages: &[NewMessage],
    ) -> Result<()> {
        if messages.is_empty() {
            return Ok(());
        }
        let n = messages.len();
        let (mut ids, mut types, mut keys, mut events) = (
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
        );
        let (mut payloads, mut headers, mut topics) = (
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
        );
        for m in messages {
            ids.push(m.id);
            types.push(m.aggregate_type.as_str());
            keys.push(m.aggregate_id.as_str());
            events.push(m.event_type.as_str());
            payloads.push(m.payload.to_string());
            headers.push(serde_json::Value::Object(m.headers.clone()).to_string());
            topics.push(m.topic.as_deref());
        }
        sqlx::query(&self.sql)
            .bind(&ids)
            .bind(&types)
            .bind(&keys)
            .bind(&events)
            .bind(&payloads)
            .bind(&headers)
            .bind(&topics)
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

/// Adds `message` to the `outbox` table of the `public` schema inside `tx`.
pub async fn enqueue(tx: &mut Transaction<'_, Postgres>, message: &NewMessage) -> Result<Uuid> {
    Writer::default().enqueue(tx, message).await
}

/// Adds `messages` to the `outbox` table of the `public` schema inside `tx`, in one statement.
pub async fn enqueue_many(
    tx: &mut Transaction<'_, Postgres>,
    messages: &[NewMessage],
) -> Result<()> {
    Writer::default().enqueue_many(tx, messages).await
}
