//! Reading the outbox's figures for `outbox status`, scrapes and the console: counts, members,
//! blocked keys, the status detail, failed messages.

use super::*;

/// Groups of pending messages (partition, aggregate type, event type, topic) `status_detail`
/// reads at most, oldest first.
const STATUS_GROUPS: i64 = 10_000;

impl SqliteStore {
    /// [`Store::stats`]: the counts, the members and the blocked keys.
    pub(super) async fn read_stats(&self) -> Result<Stats> {
        let err = |e| map_sqlx_error("reading outbox counts", e);
        let now = now_ms();
        let r = sqlx::query(&self.q.stats)
            .bind(now)
            .fetch_one(&self.pool)
            .await
            .map_err(err)?;
        let members = sqlx::query(&self.q.members)
            .bind(now)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| map_sqlx_error("reading relay members", e))?
            .iter()
            .map(|m| {
                let get = |e| map_sqlx_error("reading relay members", e);
                let member: String = m.try_get("member").map_err(get)?;
                let beat: i64 = m.try_get("heartbeat_at").map_err(get)?;
                let heartbeat_at = DateTime::from_timestamp_millis(beat).ok_or_else(|| {
                    malformed(format!(
                        "member {member}: heartbeat_at {beat} is not a time"
                    ))
                })?;
                Ok(MemberStatus {
                    partitions: m.try_get("partitions").map_err(get)?,
                    circuit: m.try_get("circuit").map_err(get)?,
                    sink_error: m.try_get("sink_error").map_err(get)?,
                    member,
                    heartbeat_at,
                })
            })
            .collect::<Result<Vec<_>>>()?;
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
            pending: r.try_get("pending").map_err(err)?,
            oldest_pending_age_seconds: r.try_get("oldest_pending_age_seconds").map_err(err)?,
            failed: r.try_get("failed").map_err(err)?,
            published: r.try_get("published").map_err(err)?,
            retrying: r.try_get("retrying").map_err(err)?,
            blocked_keys: r.try_get("blocked_keys").map_err(err)?,
            parked: r.try_get::<i64, _>("retrying").map_err(err)?
                + r.try_get::<i64, _>("failed").map_err(err)?,
            partitions_at_parking_cap: 0,
            waiting: r.try_get("waiting").map_err(err)?,
            oldest_waiting_age_seconds: r.try_get("oldest_waiting_age_seconds").map_err(err)?,
            members,
            blocked,
        })
    }

    /// [`Store::status_detail`]: partitions with their owners and the backlog by type.
    pub(super) async fn read_status_detail(&self) -> Result<StatusDetail> {
        let err = |e| map_sqlx_error("reading the status detail", e);
        let now = now_ms();
        let pending = sqlx::query(&self.q.status_pending)
            .bind(now)
            .bind(STATUS_GROUPS)
            .fetch_all(&self.pool)
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
            .map_err(err)?;
        let partitions = sqlx::query(&self.q.status_partitions)
            .bind(now)
            .fetch_all(&self.pool)
            .await
            .map_err(err)?
            .iter()
            .map(|r| {
                let lease: Option<i64> = r.try_get("lease_until")?;
                Ok(PartitionStatus {
                    partition: r.try_get("partition")?,
                    owner: r.try_get("owner")?,
                    epoch: r.try_get("epoch")?,
                    lease_until: lease.and_then(DateTime::from_timestamp_millis),
                    pending: 0,
                    oldest_pending_age_seconds: None,
                    parked: r.try_get("parked")?,
                    failed: r.try_get("failed")?,
                    position: None,
                })
            })
            .collect::<std::result::Result<Vec<_>, sqlx::Error>>()
            .map_err(err)?;
        Ok(StatusDetail {
            partitions,
            retention: None,
            pending,
            cdc_slots: Vec::new(),
            binlog_sequencer: None,
        })
    }

    /// [`Store::failed`]: the oldest failed messages.
    pub(super) async fn read_failed(&self, limit: usize) -> Result<Vec<FailedMessage>> {
        let err = |e| map_sqlx_error("listing failed messages", e);
        let rows = sqlx::query(&self.q.failed)
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .fetch_all(&self.pool)
            .await
            .map_err(err)?;
        rows.iter()
            .map(|r| {
                let m = message_from_row(r)?;
                Ok(FailedMessage {
                    id: m.id,
                    seq: m.seq,
                    aggregate_type: m.aggregate_type,
                    aggregate_id: m.aggregate_id,
                    event_type: m.event_type,
                    attempts: m.attempts,
                    last_error: r.try_get("last_error").map_err(err)?,
                    created_at: m.created_at,
                })
            })
            .collect()
    }

    /// [`Store::failed_matching`]: a page of failed messages matching `filter`.
    pub(super) async fn read_failed_matching(
        &self,
        filter: &FailedFilter,
        after: Option<i64>,
        limit: usize,
    ) -> Result<FailedPage> {
        let err = |e| map_sqlx_error("listing failed messages", e);
        let rows = sqlx::query(&self.q.failed_matching)
            .bind(filter.key.as_deref())
            .bind(filter.kind.as_deref().map(str::to_lowercase))
            .bind(filter.error.as_deref().map(str::to_lowercase))
            .bind(after)
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .fetch_all(&self.pool)
            .await
            .map_err(err)?;
        let mut page = FailedPage::default();
        for r in &rows {
            page.total = r.try_get("total").map_err(err)?;
            if r.try_get::<Option<i64>, _>("seq").map_err(err)?.is_none() {
                continue;
            }
            let m = message_from_row(r)?;
            page.messages.push(FailedMessage {
                id: m.id,
                seq: m.seq,
                aggregate_type: m.aggregate_type,
                aggregate_id: m.aggregate_id,
                event_type: m.event_type,
                attempts: m.attempts,
                last_error: r.try_get("last_error").map_err(err)?,
                created_at: m.created_at,
            });
        }
        Ok(page)
    }
}
