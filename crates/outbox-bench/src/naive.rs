//! The seed articles' outbox, kept as the benchmark's baseline: a table of its own
//! (`id uuid PRIMARY KEY DEFAULT gen_random_uuid()`, `status text DEFAULT 'PENDING'`, an index on
//! `(status, created_at)`, no trigger), and its relay: select 100 rows `FOR UPDATE SKIP LOCKED`,
//! publish them one at a time waiting for each acknowledgement, one `UPDATE` per row, all
//! inside the claiming transaction. It never touches the product's tables.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use async_nats::jetstream;
use outbox_db::Schema;
use sqlx::{PgPool, Row};
use uuid::Uuid;

use crate::latency::Latency;
use crate::sql;

/// Creates the seed-style table in `schema`.
pub async fn create(pool: &PgPool, schema: &Schema) -> anyhow::Result<()> {
    sqlx::raw_sql(&schema.render(sql::NAIVE_OUTBOX))
        .execute(pool)
        .await
        .context("creating the naive outbox table")?;
    Ok(())
}

/// Fills `rows` pending rows, 1000 per transaction, with ids from the table's own default;
/// records each commit.
pub async fn fill(
    pool: &PgPool,
    schema: &Schema,
    rows: usize,
    keys: usize,
    pad: &str,
    latency: &Arc<Latency>,
) -> anyhow::Result<()> {
    let insert = schema.render(sql::NAIVE_FILL);
    for start in (0..rows).step_by(1000) {
        let end = (start + 1000).min(rows);
        let keys: Vec<String> = (start..end)
            .map(|i| format!("key-{}", i % keys.max(1)))
            .collect();
        let payloads: Vec<String> = (start..end)
            .map(|i| serde_json::json!({ "n": i, "pad": pad }).to_string())
            .collect();
        let mut tx = pool.begin().await?;
        let ids: Vec<Uuid> = sqlx::query_scalar(&insert)
            .bind(&keys)
            .bind(&payloads)
            .fetch_all(&mut *tx)
            .await?;
        let sent = latency.stamp();
        tx.commit().await?;
        latency.committed(ids, sent);
    }
    Ok(())
}

/// Drains every pending row of `schema` to subjects `prefix.<event_type>` (message id = row
/// id); returns the time taken and the number of rows published.
pub async fn drain(
    pool: &PgPool,
    schema: &Schema,
    js: &jetstream::Context,
    prefix: &str,
) -> anyhow::Result<(Duration, u64)> {
    let select = schema.render(sql::NAIVE_CLAIM);
    let update = schema.render(sql::NAIVE_MARK_SENT);
    let started = Instant::now();
    let mut published = 0u64;
    loop {
        let mut tx = pool.begin().await?;
        let rows = sqlx::query(&select).fetch_all(&mut *tx).await?;
        if rows.is_empty() {
            tx.commit().await?;
            break;
        }
        for row in rows {
            let id: Uuid = row.try_get("id")?;
            let event_type: String = row.try_get("event_type")?;
            let payload: String = row.try_get("payload")?;
            let mut headers = async_nats::HeaderMap::new();
            headers.insert("Nats-Msg-Id", id.to_string().as_str());
            js.publish_with_headers(format!("{prefix}.{event_type}"), headers, payload.into())
                .await
                .context("naive publish")?
                .await
                .context("naive publish ack")?;
            sqlx::query(&update).bind(id).execute(&mut *tx).await?;
            published += 1;
        }
        tx.commit().await?;
    }
    Ok((started.elapsed(), published))
}
