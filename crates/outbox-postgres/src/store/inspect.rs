//! Reading the backlog's figures, the status detail and retention's state for `outbox status`,
//! scrapes and the console.

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

impl PgStore {
    /// [`Store::stats`]: the counts, the members and the blocked keys.
    pub(super) async fn read_stats(&self) -> Result<Stats> {
        let r = read_backlog_row(
            &self.pool,
            sqlx::query(&self.q.stats)
                .bind(PENDING_COUNT_CAP)
                .bind(self.parked_cap),
        )
        .await
        .map_err(|e| map_sqlx_error("reading outbox counts", e))?;
        let get = |name: &str| -> Result<i64> {
            r.try_get::<i64, _>(name)
                .map_err(|e| map_sqlx_error("reading outbox counts", e))
        };
        let members = sqlx::query(&self.q.members)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| map_sqlx_error("reading relay members", e))?
            .into_iter()
            .map(|m| -> std::result::Result<MemberStatus, sqlx::Error> {
                Ok(MemberStatus {
                    member: m.try_get("member")?,
                    heartbeat_at: m.try_get::<DateTime<Utc>, _>("heartbeat_at")?,
                    partitions: m.try_get("partitions")?,
                    circuit: m.try_get("circuit")?,
                    sink_error: m.try_get("sink_error")?,
                })
            })
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| map_sqlx_error("reading relay members", e))?;
        let blocked = sqlx::query_as::<_, (String, String, i32, Option<String>)>(&self.q.blocked)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| map_sqlx_error("reading blocked keys", e))?
            .into_iter()
            .map(|(key, state, attempts, last_error)| BlockedKey {
                key,
                state,
                attempts,
                last_error,
            })
            .collect();
        Ok(Stats {
            pending: get("pending")?,
            oldest_pending_age_seconds: r
                .try_get::<Option<f64>, _>("oldest_pending_age_seconds")
                .map_err(|e| map_sqlx_error("reading outbox counts", e))?,
            failed: get("failed")?,
            published: get("published")?,
            retrying: get("retrying")?,
            blocked_keys: get("blocked_keys")?,
            parked: get("parked")?,
            partitions_at_parking_cap: get("partitions_at_parking_cap")?,
            waiting: get("waiting")?,
            oldest_waiting_age_seconds: r
                .try_get::<Option<f64>, _>("oldest_waiting_age_seconds")
                .map_err(|e| map_sqlx_error("reading outbox counts", e))?,
            members,
            blocked,
        })
    }

    /// [`Store::pending_by_type`]: the backlog by partition, type and topic, oldest first.
    pub(super) async fn read_pending_by_type(&self, cap: i64) -> Result<Vec<PendingCell>> {
        let err = |e| map_sqlx_error("reading the backlog by type", e);
        read_backlog(
            &self.pool,
            sqlx::query(&self.q.status_pending)
                .bind(cap)
                .bind(STATUS_GROUPS),
        )
        .await
        .map_err(err)?
        .iter()
        .map(|r| {
            Ok(PendingCell {
                partition: r.try_get("partition")?,
                aggregate_type: r.try_get("aggregate_type")?,
                event_type: r.try_get("event_type")?,
                topic: r.try_get("topic")?,
                pending: r.try_get("pending")?,
                oldest_pending_age_seconds: r.try_get("oldest_pending_age_seconds")?,
            })
        })
        .collect::<std::result::Result<Vec<_>, sqlx::Error>>()
        .map_err(err)
    }

    /// [`Store::status_detail`]: partitions, retention, the backlog by type and CDC slots.
    pub(super) async fn read_status_detail(&self) -> Result<StatusDetail> {
        let err = |e| map_sqlx_error("reading the status detail", e);
        let pending = self.read_pending_by_type(PENDING_COUNT_CAP).await?;
        let partitions = sqlx::query(&self.q.status_partitions)
            .fetch_all(&self.pool)
            .await
            .map_err(err)?
            .iter()
            .map(|r| {
                let position = match r.try_get::<Option<DateTime<Utc>>, _>("done_at")? {
                    Some(done_at) => Some(Position {
                        done_xmin: r.try_get("done_xmin")?,
                        done_xmax: r.try_get("done_xmax")?,
                        cursor: r.try_get("cursor")?,
                        done_at,
                        published: r.try_get("published")?,
                    }),
                    None => None,
                };
                Ok(PartitionStatus {
                    partition: r.try_get("partition")?,
                    owner: r.try_get("owner")?,
                    epoch: r.try_get("epoch")?,
                    lease_until: r.try_get("lease_until")?,
                    pending: 0,
                    oldest_pending_age_seconds: None,
                    parked: r.try_get("parked")?,
                    failed: r.try_get("failed")?,
                    position,
                })
            })
            .collect::<std::result::Result<Vec<_>, sqlx::Error>>()
            .map_err(err)?;
        let r = sqlx::query(&self.q.status_retention)
            .fetch_one(&self.pool)
            .await
            .map_err(err)?;
        let retention = retention_status(&r).map_err(err)?;
        Ok(StatusDetail {
            partitions,
            retention: Some(retention),
            pending,
            cdc_slots: crate::cdc::setup::slots(&self.pool, &self.schema).await?,
            binlog_sequencer: None,
        })
    }
}
