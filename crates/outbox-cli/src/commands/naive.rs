//! The naive relay of the seed articles, kept as the benchmark's baseline: select 100 rows
//! `FOR UPDATE SKIP LOCKED`, publish them one at a time waiting for each acknowledgement, one
//! `UPDATE` per row, all inside the claiming transaction.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use async_nats::jetstream;
use sqlx::{PgPool, Row};

/// Drains every pending row of `schema` to subjects `prefix.<event_type>`; returns the time taken
/// and the number of rows published.
pub async fn drain(
    pool: &PgPool,
    schema: &str,
    js: &jetstream::Context,
    prefix: &str,
) -> anyhow::Result<(Duration, u64)> {
    let select = format!(
        "SELECT seq, id, event_type, payload::text AS payload FROM {schema}.outbox
         WHERE state = 'pending' ORDER BY seq LIMIT 100 FOR UPDATE SKIP LOCKED"
    );
    // clock_timestamp(), not now(): now() is the transaction start and would flatter the
    // naive relay's latency.
    let update = format!(
        "UPDATE {schema}.outbox SET state = 'published', published_at = clock_timestamp(), attempts = attempts + 1
         WHERE seq = $1"
    );
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
            let seq: i64 = row.try_get("seq")?;
            let id: uuid::Uuid = row.try_get("id")?;
            let event_type: String = row.try_get("event_type")?;
            let payload: String = row.try_get("payload")?;
            let mut headers = async_nats::HeaderMap::new();
            headers.insert("Nats-Msg-Id", id.to_string().as_str());
            js.publish_with_headers(format!("{prefix}.{event_type}"), headers, payload.into())
                .await
                .context("naive publish")?
                .await
                .context("naive publish ack")?;
            sqlx::query(&update).bind(seq).execute(&mut *tx).await?;
            published += 1;
        }
        tx.commit().await?;
    }
    Ok((started.elapsed(), published))
}
