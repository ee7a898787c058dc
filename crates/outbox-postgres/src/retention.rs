//! Retention for the insert-only engine: segments are created ahead of the writers and dropped
//! whole once every position has passed them, never row by row.

use std::time::Duration;

use outbox_core::{Maintenance, Result};
use sqlx::{Executor as _, PgPool};

use crate::error::map_sqlx_error;
use crate::schema::Schema;

/// Index entries the floor audit reads per partition (see `queries/floor_audit.sql`).
pub const FLOOR_AUDIT_ENTRIES: i64 = 2000;

/// Counts rows that lie at or below their partition's seq floor although their transaction got
/// its id after that floor was read: rows the claim would pass over. A sampled check of the
/// transactions right after each partition's bound (see `queries/floor_audit.sql`).
pub async fn floor_audit(conn: &mut sqlx::PgConnection, schema: &Schema) -> Result<u64> {
    let below: i64 = sqlx::query_scalar(&schema.render(include_str!("../queries/floor_audit.sql")))
        .bind(FLOOR_AUDIT_ENTRIES)
        .fetch_one(&mut *conn)
        .await
        .map_err(|e| map_sqlx_error("auditing the claims' seq floors", e))?;
    Ok(u64::try_from(below).unwrap_or(0))
}

/// Segments kept ready beyond the current transaction id, in segment widths.
pub const LOOKAHEAD_SEGMENTS: i32 = 2;

/// Creates segments ahead, drops the ones every reader passed more than `retention` ago, and
/// prunes old positions. One maintainer at a time per schema (an advisory lock); a second
/// caller returns at once with nothing done.
///
/// Dropping is `DETACH … CONCURRENTLY` then `DROP`: writers and readers keep going, and the
/// detach waits for transactions that might still read the segment. If it is interrupted the
/// segment stays "pending detach" and the next run finalises it.
pub async fn run(pool: &PgPool, schema: &Schema, retention: Duration) -> Result<Maintenance> {
    let ctx = |what: &str| format!("maintaining schema `{}`: {what}", schema.as_str());
    let mut conn = pool
        .acquire()
        .await
        .map_err(|e| map_sqlx_error(&ctx("connecting"), e))?;
    let lock_key = format!("outbox-maintain:{}", schema.as_str());
    let locked: bool = sqlx::query_scalar(include_str!("../queries/try_advisory_lock.sql"))
        .bind(&lock_key)
        .fetch_one(&mut *conn)
        .await
        .map_err(|e| map_sqlx_error(&ctx("taking the maintenance lock"), e))?;
    if !locked {
        return Ok(Maintenance::default());
    }
    let result = run_locked(&mut conn, schema, retention).await;
    let _ = sqlx::query(include_str!("../queries/advisory_unlock.sql"))
        .bind(&lock_key)
        .execute(&mut *conn)
        .await;
    result
}

async fn run_locked(
    conn: &mut sqlx::PgConnection,
    schema: &Schema,
    retention: Duration,
) -> Result<Maintenance> {
    let ctx = |what: &str| format!("maintaining schema `{}`: {what}", schema.as_str());
    let mut report = Maintenance::default();
    let made: i32 =
        sqlx::query_scalar(&schema.render(include_str!("../queries/ensure_segments.sql")))
            .bind(LOOKAHEAD_SEGMENTS)
            .fetch_one(&mut *conn)
            .await
            .map_err(|e| map_sqlx_error(&ctx("creating segments"), e))?;
    report.segments_created = u64::try_from(made).unwrap_or(0);
    let names: Vec<String> =
        sqlx::query_scalar(&schema.render(include_str!("../queries/droppable.sql")))
            .bind(retention.as_secs_f64())
            .fetch_all(&mut *conn)
            .await
            .map_err(|e| map_sqlx_error(&ctx("finding passed segments"), e))?;
    for name in names {
        // Names come from our own table and were made by our own function; quote anyway.
        let pending: Option<bool> =
            sqlx::query_scalar(include_str!("../queries/segment_detach_pending.sql"))
                .bind(schema.as_str())
                .bind(&name)
                .fetch_optional(&mut *conn)
                .await
                .map_err(|e| map_sqlx_error(&ctx("reading segment state"), e))?;
        let seg = format!("{}.\"{}\"", schema.as_str(), name.replace('"', ""));
        let segment_sql = |text: &str| schema.render(text).replace("{segment}", &seg);
        let detach = match pending {
            Some(true) => segment_sql(include_str!("../queries/segment_detach_finalize.sql")),
            Some(false) => segment_sql(include_str!("../queries/segment_detach.sql")),
            None => String::new(),
        };
        if !detach.is_empty() {
            conn.execute(detach.as_str())
                .await
                .map_err(|e| map_sqlx_error(&ctx(&format!("detaching segment {name}")), e))?;
        }
        conn.execute(segment_sql(include_str!("../queries/segment_drop.sql")).as_str())
            .await
            .map_err(|e| map_sqlx_error(&ctx(&format!("dropping segment {name}")), e))?;
        sqlx::query(&schema.render(include_str!("../queries/segment_forget.sql")))
            .bind(&name)
            .execute(&mut *conn)
            .await
            .map_err(|e| map_sqlx_error(&ctx("forgetting a dropped segment"), e))?;
        report.segments_dropped += 1;
    }
    let pruned = sqlx::query(&schema.render(include_str!("../queries/prune_positions.sql")))
        .execute(&mut *conn)
        .await
        .map_err(|e| map_sqlx_error(&ctx("pruning old positions"), e))?;
    report.rows_deleted = pruned.rows_affected();
    report.rows_below_floor = floor_audit(conn, schema).await?;
    Ok(report)
}
