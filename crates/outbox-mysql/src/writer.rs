//! The transactional writer: adds messages to the outbox inside the caller's transaction.

use std::collections::BTreeSet;

use outbox_core::{NewMessage, Result};
use sqlx::{MySql, QueryBuilder, Transaction};
use uuid::Uuid;

use crate::error::map_sqlx_error;
use crate::schema::Schema;

/// Rows per `INSERT`: far below MySQL's 65,535 placeholders (7 per row), and a batch of
/// ordinary messages stays well inside the default `max_allowed_packet`.
const ROWS_PER_STATEMENT: usize = 1000;

/// Adds `message` to the outbox in `schema` inside `tx`; returns its id. See [`enqueue_many`].
pub async fn enqueue(
    tx: &mut Transaction<'_, MySql>,
    schema: &Schema,
    message: &NewMessage,
) -> Result<Uuid> {
    enqueue_many(tx, schema, std::slice::from_ref(message)).await?;
    Ok(message.id)
}

/// Adds `messages` to the outbox in `schema` inside `tx`, keeping their order, one `INSERT`
/// per thousand messages. They exist once `tx` commits, together with the caller's other
/// writes, or not at all.
///
/// Ordering: the table's trigger gives each row a position in its key's partition from a
/// counter row that `tx` keeps locked until it ends, so a key's messages are relayed in commit
/// order (a rollback gives its positions back). The lock makes other writers of the same
/// partition (a 64th of the keys) wait for this transaction to end, so **enqueue last**, just
/// before the commit, not before a slow part of the transaction.
///
/// Messages of several keys take their partitions' counters first, in partition order, so two
/// such batches never deadlock on each other's counters (rows are inserted in the caller's
/// order, which would lock them in any order).
pub async fn enqueue_many(
    tx: &mut Transaction<'_, MySql>,
    schema: &Schema,
    messages: &[NewMessage],
) -> Result<()> {
    lock_partitions_in_order(tx, schema, messages).await?;
    let head = schema.render(include_str!("../queries/enqueue_head.sql"));
    for chunk in messages.chunks(ROWS_PER_STATEMENT) {
        let mut insert = QueryBuilder::<MySql>::new(&head);
        insert.push_values(chunk, |mut row, m| {
            row.push_bind(m.id.to_string())
                .push_bind(m.aggregate_type.as_str())
                .push_bind(m.aggregate_id.as_str())
                .push_bind(m.event_type.as_str())
                .push_bind(m.payload.to_string())
                .push_bind(serde_json::Value::Object(m.headers.clone()).to_string())
                .push_bind(m.topic.as_deref());
        });
        insert
            .build()
            .execute(&mut **tx)
            .await
            .map_err(|e| map_sqlx_error("adding messages to the outbox", e))?;
    }
    Ok(())
}

/// Takes the position counters of the partitions `messages` fall in, in partition order, when
/// they span more than one key. Past [`crate::PARTITIONS`] distinct keys it takes them all.
async fn lock_partitions_in_order(
    tx: &mut Transaction<'_, MySql>,
    schema: &Schema,
    messages: &[NewMessage],
) -> Result<()> {
    let keys: BTreeSet<&str> = messages.iter().map(|m| m.aggregate_id.as_str()).collect();
    if keys.len() < 2 {
        return Ok(());
    }
    let mut lock = QueryBuilder::<MySql>::new(
        schema.render(include_str!("../queries/enqueue_lock_partitions_head.sql")),
    );
    if keys.len() <= crate::PARTITIONS as usize {
        lock.push(" WHERE part IN (");
        let mut each = lock.separated(", ");
        for key in keys {
            each.push("CRC32(")
                .push_bind_unseparated(key)
                .push_unseparated(format!(") % {}", crate::PARTITIONS));
        }
        lock.push(")");
    }
    lock.push(" ORDER BY part FOR UPDATE");
    lock.build()
        .fetch_all(&mut **tx)
        .await
        .map_err(|e| map_sqlx_error("taking the partitions' position counters", e))?;
    Ok(())
}
