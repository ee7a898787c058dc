//! The CDC store's figures for scrapes and `outbox status`: the backlog is in the WAL, not in
//! the table, so pending counts what the relay holds and the slot's lag what is still to read.

use super::*;

impl CdcStore {
    /// [`Store::gauges`] in CDC mode (see there).
    pub(super) async fn read_gauges(&self) -> Result<outbox_core::Gauges> {
        let unread_wal_bytes =
            i64::try_from(self.unread_wal.load(Ordering::Relaxed)).unwrap_or(i64::MAX);
        if self.recovering() {
            let mut g = self.inner.gauges().await?;
            g.cdc_slot = Some(outbox_core::SlotGauges {
                lag_bytes: 0,
                retained_bytes: 0,
                lag_seconds: g.oldest_pending_age_seconds.unwrap_or(0.0),
                lost: true,
                unread_wal_bytes,
            });
            return Ok(g);
        }
        use sqlx::Row as _;
        let r = sqlx::query(&self.names.schema.render(GAUGES_SQL))
            .bind(&self.names.slot)
            .fetch_one(&self.pool)
            .await
            .map_err(|e| map_sqlx_error("reading the CDC slot's figures", e))?;
        let err = |e| map_sqlx_error("reading the CDC slot's figures", e);
        let slot = |lag_seconds| -> Result<outbox_core::SlotGauges> {
            Ok(outbox_core::SlotGauges {
                lag_bytes: r
                    .try_get::<Option<i64>, _>("lag_bytes")
                    .map_err(err)?
                    .unwrap_or(0),
                retained_bytes: r
                    .try_get::<Option<i64>, _>("retained_bytes")
                    .map_err(err)?
                    .unwrap_or(0),
                lag_seconds,
                lost: r.try_get("lost").map_err(err)?,
                unread_wal_bytes,
            })
        };
        if self.catching_up() {
            // The backlog is in the table, as in polling mode, and the slot waits unread: its
            // figures still go out, so its lag and retained WAL stay watched meanwhile.
            let mut g = self.inner.gauges().await?;
            g.cdc_slot = Some(slot(g.oldest_pending_age_seconds.unwrap_or(0.0))?);
            return Ok(g);
        }
        let parked: i64 = r.try_get("parked").map_err(err)?;
        let failed: i64 = r.try_get("failed").map_err(err)?;
        let s = self.state.lock().await;
        let held = s.held.values().map(VecDeque::len).sum::<usize>() + s.inflight.len();
        let retrying = s
            .held
            .values()
            .filter_map(|q| q.front())
            .filter(|h| h.message.attempts > 0)
            .count();
        let unresolved: usize = s.txns.iter().map(|t| t.open).sum();
        let lag_seconds = s.txns.front().map_or(0.0, |t| {
            (chrono::Utc::now() - t.committed_at)
                .num_milliseconds()
                .max(0) as f64
                / 1000.0
        });
        drop(s);
        Ok(outbox_core::Gauges {
            pending: i64::try_from(unresolved.max(held)).unwrap_or(i64::MAX) + parked - failed,
            pending_capped: false,
            oldest_pending_age_seconds: (lag_seconds > 0.0).then_some(lag_seconds),
            retrying: i64::try_from(retrying).unwrap_or(i64::MAX),
            published: None,
            parked,
            failed,
            partitions_at_parking_cap: 0,
            segments: None,
            retention_pins: Vec::new(),
            cdc_slot: Some(slot(lag_seconds)?),
            binlog_sequencer: None,
        })
    }
}
