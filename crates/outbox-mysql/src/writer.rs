//! The transactional writer: adds messages to the outbox inside the caller's transaction.

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
pub async fn enqueue_many(
    tx: &mut Transaction<'_, MySql>,
    schema: &Schema,
    messages: &[NewMessage],
) -> Result<()> {
    let head = schema.render(
        "INSERT INTO {schema}.outbox \
         (id, aggregate_type, aggregate_id, event_type, payload, headers, topic) ",
    );
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
