//! [`Store::gauges`](outbox_core::Store::gauges) and [`Store::ping`](outbox_core::Store::ping)
//! for SQLite: the figures of a metrics scrape in one statement (`queries/gauges.sql`). SQLite
//! has no segments and no retention horizon (published rows are deleted by age), so those
//! figures are absent.

use outbox_core::{Gauges, Result};
use sqlx::{Row, SqlitePool};

use crate::error::map_sqlx_error;
use crate::tables::Tables;

/// Pending rows a scrape counts at most: past it the gauge says "at least"
/// (`pending_capped`). The same total as PostgreSQL's (64 partitions × 1000).
pub const GAUGES_PENDING_CAP: i64 = 64_000;

/// Reads the scrape's figures from the table set `tables`; `now_ms` is the current time in
/// unix milliseconds.
pub(crate) async fn read(pool: &SqlitePool, tables: &Tables, now_ms: i64) -> Result<Gauges> {
    let err = |e| map_sqlx_error("reading the outbox gauges", e);
    let r = sqlx::query(&tables.render(include_str!("../queries/gauges.sql")))
        .bind(now_ms)
        .bind(GAUGES_PENDING_CAP)
        .fetch_one(pool)
        .await
        .map_err(err)?;
    let pending: i64 = r.try_get("pending").map_err(err)?;
    let retrying: i64 = r.try_get("retrying").map_err(err)?;
    let failed: i64 = r.try_get("failed").map_err(err)?;
    Ok(Gauges {
        pending,
        pending_capped: pending >= GAUGES_PENDING_CAP,
        oldest_pending_age_seconds: r
            .try_get::<Option<f64>, _>("oldest_pending_age_seconds")
            .map_err(err)?
            .map(|s| s.max(0.0)),
        retrying,
        published: None,
        parked: retrying + failed,
        failed,
        partitions_at_parking_cap: 0,
        segments: None,
        retention_pins: Vec::new(),
        cdc_slot: None,
        binlog_sequencer: None,
    })
}

/// `SELECT 1` through the pool.
pub(crate) async fn ping(pool: &SqlitePool) -> Result<()> {
    sqlx::query(include_str!("../queries/ping.sql"))
        .execute(pool)
        .await
        .map(drop)
        .map_err(|e| map_sqlx_error("asking the database whether it answers", e))
}
