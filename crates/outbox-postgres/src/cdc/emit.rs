//! The table-less writer: a message written as a transactional logical message
//! (`pg_logical_emit_message(true, 'outbox', …)`) in the caller's transaction. It reaches the
//! WAL and nothing else: no row, no index entry, no vacuum. The CDC relay publishes it once the
//! transaction commits, in commit order with the table's rows; a rollback discards it.
//!
//! What this gives up against the table: nothing of it is visible to SQL (no pending count, no
//! `outbox journey` of a message not yet published), and it lives only in the WAL. Only a CDC
//! relay can publish it.
//!
//! It goes through `{schema}.outbox_emit` (made by `outbox migrate --cdc`), which refuses the
//! message, failing the caller's transaction, while the relay group has no valid slot: a message
//! no relay would ever read is never accepted silently.

use outbox_core::{NewMessage, Result};
use serde_json::{json, Value};
use sqlx::{Postgres, Transaction};
use uuid::Uuid;

use crate::error::map_sqlx_error;
use crate::schema::Schema;

/// The call every writer makes (see `queries/cdc_emit_function.sql`).
const EMIT_SQL: &str = include_str!("../../queries/cdc_emit.sql");

/// The logical message's content: a JSON object with the columns of an outbox row (`id`,
/// `aggregate_type`, `aggregate_id`, `event_type`, `payload`, `headers`, `topic`). Only
/// `aggregate_type`, `aggregate_id`, `event_type` and `payload` are required; without an `id`
/// the relay derives one from the message's WAL position (the same on every redelivery).
pub fn content(message: &NewMessage) -> String {
    let m = message;
    let mut v = json!({
        "id": m.id,
        "aggregate_type": m.aggregate_type,
        "aggregate_id": m.aggregate_id,
        "event_type": m.event_type,
        "payload": m.payload,
    });
    if !m.headers.is_empty() {
        v["headers"] = Value::Object(m.headers.clone());
    }
    if let Some(t) = &m.topic {
        v["topic"] = Value::String(t.clone());
    }
    v.to_string()
}

/// Writes logical messages for one schema's CDC relay.
#[derive(Debug, Clone)]
pub struct Emitter {
    sql: String,
}

impl Default for Emitter {
    fn default() -> Self {
        Self::new(&Schema::default())
    }
}

impl Emitter {
    /// An emitter for the CDC relay of `schema` (prefix `outbox`, or `outbox:<schema>`).
    pub fn new(schema: &Schema) -> Self {
        Self {
            sql: schema.render(EMIT_SQL),
        }
    }

    /// Writes `message` into the WAL inside `tx`: published by the CDC relay iff `tx` commits,
    /// after every message of transactions that committed before it. One round trip, no row.
    /// Fails (and with it `tx`) while the relay group has no valid slot: the message would
    /// never be published (docs/cdc.md, "When the slot is lost").
    pub async fn emit(
        &self,
        tx: &mut Transaction<'_, Postgres>,
        message: &NewMessage,
    ) -> Result<Uuid> {
        sqlx::query(&self.sql)
            .bind(content(message))
            .execute(&mut **tx)
            .await
            .map_err(|e| map_sqlx_error("emitting an outbox logical message", e))?;
        Ok(message.id)
    }
}

/// Writes `message` as a logical message for the CDC relay of the `public` schema, inside `tx`.
/// See [`Emitter::emit`].
pub async fn emit(tx: &mut Transaction<'_, Postgres>, message: &NewMessage) -> Result<Uuid> {
    Emitter::default().emit(tx, message).await
}
