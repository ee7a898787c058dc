//! Connecting in CDC mode: the stream started from the confirmed position (after the checks
//! that must hold first), the catch-up that delivers by polling what was written before the slot,
//! and the heartbeat that asks a silent server for a word.

use super::*;

impl CdcStore {
    /// How many partitions hold a message written before the slot was created that the
    /// polling positions have not passed (cdc_before_slot.sql); `None` where the slot's start
    /// is not recorded (a setup older than the checkpoints: the catch-up cannot tell, and does
    /// not run, as before).
    pub(super) async fn before_slot(&self) -> Result<Option<i64>> {
        before_slot(&self.pool, &self.names).await
    }

    /// The snapshot taken just after the slot was created (recorded by `outbox migrate --cdc`).
    pub(super) async fn slot_start(&self) -> Result<Option<String>> {
        slot_start(&self.pool, &self.names).await
    }

    /// Ends the catch-up once every message written before the slot was created is passed
    /// (asked at most every [`CATCH_UP_CHECK`]): hands back `member`'s partitions, so the
    /// checkpoints may move their positions behind the stream, and lets the stream start.
    /// Called only from a claim or a rebalance, which the worker makes between batches, so the
    /// last batch of the catch-up was completed by the polling engine that handed it out.
    pub(super) async fn catch_up_done(&self, member: &MemberId) -> Result<bool> {
        {
            let mut next = self
                .next_catch_up_check
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            let now = Instant::now();
            if now < *next {
                return Ok(false);
            }
            *next = now + CATCH_UP_CHECK;
        }
        if self.before_slot().await?.is_some_and(|n| n > 0) {
            return Ok(false);
        }
        self.inner.release(member).await?;
        self.catching_up.store(false, Ordering::Relaxed);
        info!(
            slot = %self.names.slot,
            "caught up: every message written before the CDC slot was created is published or \
             parked; reading the stream"
        );
        Ok(true)
    }

    pub(super) async fn beat(&self) {
        if self.polling() {
            return;
        }
        let r = sqlx::query(include_str!("../../../queries/cdc_heartbeat.sql"))
            .bind(self.names.heartbeat_prefix())
            .execute(&self.pool)
            .await;
        if let Err(error) = r {
            tracing::debug!(%error, "CDC heartbeat not written; the next one will try again");
        }
    }

    /// Starts the stream when there is none: every message not confirmed comes again from the
    /// server, so what was held or in flight from an earlier stream is dropped.
    pub(super) async fn connect(&self, s: &mut State) -> Result<()> {
        if s.stream.is_some() {
            return Ok(());
        }
        s.inflight.clear();
        s.held.retain(|_, q| {
            q.retain(|h| matches!(h.origin, Origin::Parked { .. }));
            !q.is_empty()
        });
        s.txns.clear();
        s.peek = None;
        // A publication that drifted would let rows vanish from the stream: refused, checked at
        // every connection (and the refusal kept for /readyz and status until it is mended).
        if let Err(e) = crate::cdc::checks::check_publication(&self.pool, &self.names).await {
            self.refuse(&e);
            return Err(e);
        }
        self.refuse_no_more();
        // Another relay of the group may have just made the slot again: its stream may start
        // only once the lost slot's emit messages are parked and the table's messages before
        // the slot delivered, or a key could come out of order. Checked at every connection.
        if self.recovery_running().await? {
            return Err(Error::new(
                ErrorKind::Connection,
                "another relay of the group is making the slot again; waiting for it",
            ));
        }
        if self.before_slot().await?.is_some_and(|n| n > 0) {
            self.catching_up.store(true, Ordering::Relaxed);
            return Err(Error::new(
                ErrorKind::Connection,
                "the table holds messages written before the slot that no relay delivered yet: \
                 delivering them by polling first",
            ));
        }
        // A URL naming several servers: the one the pool uses now, after a failover the new
        // primary (the pool follows it).
        let now = self.pool.connect_options();
        let at = (!crate::servers::Servers::parse(&self.url)?.is_single())
            .then(|| (now.get_host(), now.get_port()));
        let config = stream::replication_config(&self.url, &self.names, at)?;
        let started = stream::start(
            config,
            self.names.clone(),
            self.doorbell.clone(),
            s.confirmed,
            self.probe.clone(),
            self.silence,
        )
        .await;
        let stream = match started {
            Ok(stream) => stream,
            Err(e) => {
                let lost = crate::cdc::setup::slot_lost_now(&self.pool, &self.names.slot).await;
                if matches!(lost, Ok(None | Some(true))) {
                    self.lose_slot(s, &e);
                }
                return Err(e);
            }
        };
        // The parked keys first: a stream without them would let a key flow past its failure.
        self.refresh_parked_keys(s).await?;
        s.stream = Some(stream);
        info!(slot = %self.names.slot, "CDC stream started");
        Ok(())
    }
}

/// How many partitions hold a message written before the slot was created that the polling
/// positions have not passed (cdc_before_slot.sql); `None` where the slot's start is not
/// recorded.
pub(super) async fn before_slot(pool: &PgPool, names: &CdcNames) -> Result<Option<i64>> {
    let Some(start) = slot_start(pool, names).await? else {
        return Ok(None);
    };
    sqlx::query_scalar(&names.schema.render(BEFORE_SLOT_SQL))
        .bind(&start)
        .fetch_one(pool)
        .await
        .map(Some)
        .map_err(|e| map_sqlx_error("looking for messages written before the CDC slot", e))
}

/// The snapshot taken just after the slot was created (recorded by `outbox migrate --cdc`).
pub(super) async fn slot_start(pool: &PgPool, names: &CdcNames) -> Result<Option<String>> {
    sqlx::query_scalar(
        &names
            .schema
            .render(include_str!("../../../queries/setting_get.sql")),
    )
    .bind(names.start_setting())
    .fetch_optional(pool)
    .await
    .map_err(|e| map_sqlx_error("reading where the CDC slot starts", e))
}
