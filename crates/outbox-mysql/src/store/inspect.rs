//! Reading the outbox's figures for `outbox status`, scrapes and the console: counts, members,
//! blocked keys, failed messages.

use super::*;

impl Engine {
    pub(super) async fn stats_counts(&self) -> Result<Stats> {
        let err = |e| map_sqlx_error("reading outbox status", e);
        let r = sqlx::query(&self.q.stats)
            .bind(PARKED_CAP)
            .fetch_one(&self.pool)
            .await
            .map_err(err)?;
        let unpassed: i64 = r.try_get("unpassed").map_err(err)?;
        let passed: i64 = r.try_get("passed").map_err(err)?;
        let parked: i64 = r.try_get("parked").map_err(err)?;
        let failed: i64 = r.try_get("failed").map_err(err)?;
        let oldest_us: Option<i64> = r.try_get("oldest_us").map_err(err)?;
        let oldest_waiting_us: Option<i64> = r.try_get("oldest_waiting_us").map_err(err)?;
        Ok(Stats {
            pending: unpassed + parked - failed,
            oldest_pending_age_seconds: oldest_us.map(|us| us.max(0) as f64 / 1e6),
            failed,
            published: passed - parked,
            retrying: r.try_get("retrying").map_err(err)?,
            blocked_keys: r.try_get("blocked_keys").map_err(err)?,
            parked,
            partitions_at_parking_cap: r.try_get("at_cap").map_err(err)?,
            waiting: parked - failed,
            oldest_waiting_age_seconds: oldest_waiting_us.map(|us| us.max(0) as f64 / 1e6),
            members: Vec::new(),
            blocked: Vec::new(),
        })
    }

    /// [`Store::stats`]: the counts, the members and the blocked keys.
    pub(super) async fn read_stats(&self) -> Result<Stats> {
        let err = |e| map_sqlx_error("reading outbox status", e);
        let mut stats = self.stats_counts().await?;
        for r in sqlx::query(&self.q.members)
            .fetch_all(&self.pool)
            .await
            .map_err(err)?
        {
            let heartbeat_at: NaiveDateTime = r.try_get("heartbeat_at").map_err(err)?;
            stats.members.push(MemberStatus {
                member: r.try_get("member").map_err(err)?,
                partitions: r.try_get("partitions").map_err(err)?,
                heartbeat_at: utc(heartbeat_at),
                circuit: r.try_get("circuit").map_err(err)?,
                sink_error: r.try_get("sink_error").map_err(err)?,
            });
        }
        for r in sqlx::query(&self.q.blocked)
            .fetch_all(&self.pool)
            .await
            .map_err(err)?
        {
            stats.blocked.push(BlockedKey {
                key: r.try_get("aggregate_id").map_err(err)?,
                state: r.try_get("state").map_err(err)?,
                attempts: r.try_get("attempts").map_err(err)?,
                last_error: r.try_get("last_error").map_err(err)?,
            });
        }
        Ok(stats)
    }

    /// [`Store::failed`]: the oldest failed messages, with stand-ins where a row's id or time
    /// cannot be read.
    pub(super) async fn read_failed(&self, limit: usize) -> Result<Vec<FailedMessage>> {
        let err = |e| map_sqlx_error("listing failed messages", e);
        let rows = sqlx::query(&self.q.failed)
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .fetch_all(&self.pool)
            .await
            .map_err(err)?;
        rows.iter()
            .map(|r| {
                let seq: i64 = r.try_get("seq").map_err(err)?;
                // A row failed because of its id or time is listed with stand-ins (its
                // `last_error` says what it holds).
                let (id, _) = row_id(r);
                let (created_at, _) = row_time(r);
                Ok(FailedMessage {
                    id,
                    seq,
                    aggregate_type: r.try_get("aggregate_type").map_err(err)?,
                    aggregate_id: r.try_get("aggregate_id").map_err(err)?,
                    event_type: r.try_get("event_type").map_err(err)?,
                    attempts: r.try_get("attempts").map_err(err)?,
                    last_error: r.try_get("last_error").map_err(err)?,
                    created_at,
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
        let kind = filter.kind.as_deref().map(str::to_lowercase);
        let error = filter.error.as_deref().map(str::to_lowercase);
        let rows = sqlx::query(&self.q.failed_matching)
            .bind(filter.key.as_deref())
            .bind(filter.key.as_deref())
            .bind(kind.as_deref())
            .bind(kind.as_deref())
            .bind(error.as_deref())
            .bind(error.as_deref())
            .bind(after)
            .bind(after)
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .fetch_all(&self.pool)
            .await
            .map_err(err)?;
        let mut page = FailedPage::default();
        for r in &rows {
            page.total = r.try_get("total").map_err(err)?;
            let Some(seq) = r.try_get::<Option<i64>, _>("seq").map_err(err)? else {
                continue;
            };
            let (id, _) = row_id(r);
            let (created_at, _) = row_time(r);
            page.messages.push(FailedMessage {
                id,
                seq,
                aggregate_type: r.try_get("aggregate_type").map_err(err)?,
                aggregate_id: r.try_get("aggregate_id").map_err(err)?,
                event_type: r.try_get("event_type").map_err(err)?,
                attempts: r.try_get("attempts").map_err(err)?,
                last_error: r.try_get("last_error").map_err(err)?,
                created_at,
            });
        }
        Ok(page)
    }
}
