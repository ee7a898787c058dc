//! Reading the backlog's figures and retention's state for `outbox status`, scrapes and the console.

use super::*;

/// A query of the backlog's figures, run by [`read_backlog`].
pub(crate) type BacklogQuery<'q> =
    sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>;

/// Runs `query` in a [`READ_BEGIN`] transaction on `pool`: the rows it returns.
pub(crate) async fn read_backlog(
    pool: &PgPool,
    query: BacklogQuery<'_>,
) -> std::result::Result<Vec<sqlx::postgres::PgRow>, sqlx::Error> {
    let (mut tx, _) = crate::begin::begin_with(pool, READ_BEGIN).await?;
    let rows = query.fetch_all(&mut *tx).await?;
    tx.commit().await?;
    Ok(rows)
}

/// [`read_backlog`] of a query that returns one row.
pub(crate) async fn read_backlog_row(
    pool: &PgPool,
    query: BacklogQuery<'_>,
) -> std::result::Result<sqlx::postgres::PgRow, sqlx::Error> {
    read_backlog(pool, query)
        .await?
        .into_iter()
        .next()
        .ok_or(sqlx::Error::RowNotFound)
}

/// Groups of pending messages (partition, aggregate type, event type, topic) `status_detail`
/// reads at most, oldest first.
pub(super) const STATUS_GROUPS: i64 = 10_000;

/// The retention part of `outbox status` from the row of `status_retention.sql`: the oldest
/// segment, why it is kept, and what pins the horizon. A running transaction pins it when its
/// id is at or below the horizon (every position taken while it runs stops there); otherwise
/// the partition with the oldest position does.
pub(super) fn retention_status(
    r: &sqlx::postgres::PgRow,
) -> std::result::Result<RetentionStatus, sqlx::Error> {
    let next_xid: i64 = r.try_get("next_xid")?;
    let horizon: Option<i64> = r.try_get("horizon")?;
    let oldest_segment = match r.try_get::<Option<String>, _>("oldest_name")? {
        Some(name) => Some(Segment {
            name,
            lo: r.try_get("oldest_lo")?,
            hi: r.try_get("oldest_hi")?,
            closed_at: r.try_get("oldest_closed_at")?,
            bytes: r.try_get("oldest_bytes")?,
        }),
        None => None,
    };
    let kept_because = oldest_segment.as_ref().map(|s| {
        if s.hi > next_xid || s.closed_at.is_none() {
            KeptBecause::Open
        } else if horizon.is_none_or(|h| h < s.hi) {
            KeptBecause::Horizon
        } else {
            KeptBecause::Retention
        }
    });
    let running: Option<i64> = r.try_get("running_xid")?;
    let pinned_by = match (running, horizon) {
        (Some(xid), Some(h)) if xid <= h => Some(RetentionPin::Transaction {
            xid,
            pid: r.try_get("running_pid")?,
            age_seconds: r.try_get("running_age_seconds")?,
            state: r.try_get("running_state")?,
            application_name: r.try_get("running_application")?,
            database: r.try_get("running_database")?,
            user: r.try_get("running_user")?,
            prepared: r.try_get("running_prepared")?,
        }),
        (_, Some(_)) => Some(RetentionPin::Partition {
            partition: r.try_get("pin_partition")?,
            owner: r.try_get("pin_owner")?,
            done_at: r.try_get("pin_done_at")?,
            behind_seconds: r.try_get("pin_behind_seconds")?,
        }),
        (_, None) => None,
    };
    Ok(RetentionStatus {
        segments: r.try_get("segments")?,
        bytes: r.try_get("bytes")?,
        next_xid,
        horizon,
        oldest_segment,
        kept_because,
        pinned_by,
    })
}
