//! When the slot is lost: the relay makes it again, salvages what it had not delivered, and
//! goes back to the stream on its own.
//!
//! A slot is lost when it is dropped over `--cdc-max-retained-wal`, invalidated by PostgreSQL
//! (`max_slot_wal_keep_size`, or another reason on PostgreSQL 17 and later), dropped by hand, or
//! missing on a standby that was just promoted (before PostgreSQL 17, slots do not follow a
//! failover). Then, in order:
//!
//! 1. The relay stops reading and works as the polling engine (the table's messages flow).
//!    Meanwhile `outbox_emit` refuses every message (no valid slot), so a writer sees the error.
//! 2. It makes the slot again and reads, with `pg_walinspect`, the WAL between where the lost
//!    slot stood (its restart position, kept in `outbox_settings` at every maintenance round)
//!    and where the new slot starts; the `emit` messages committed there and not yet confirmed
//!    are parked in commit order (see [`crate::cdc::salvage`]). What WAL is gone is named.
//! 3. Its catch-up delivers the table's messages the polling positions have not passed (those
//!    since the last checkpoint), then it reads the new slot's stream.
//!
//! Messages published before the loss may be published again (same ids): at least once.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use outbox_core::{Error, ErrorKind, MemberId, Result};
use tracing::{error, info, warn};

use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;

use sqlx::PgPool;

use super::{before_slot, park_rows, CdcStore, Held, Origin, State, ToPark, RECOUNT_SQL};
use crate::cdc::salvage::{self, lsn_text};
use crate::cdc::setup::CdcNames;
use crate::cdc::stream::Item;
use crate::error::map_sqlx_error;

/// How long after a failed recovery (the server down, a privilege missing) it is tried again.
const RECOVERY_RETRY: Duration = Duration::from_secs(5);

/// How often, at most, the slot's read position is written while the relay confirms.
const SAVE_EVERY: Duration = Duration::from_secs(1);

/// Writes the slot's restart and confirmed positions, as the server has them, to
/// `outbox_settings` (see `queries/cdc_read_position_save.sql`).
async fn save_position(pool: &PgPool, names: &CdcNames) -> Result<()> {
    sqlx::query(&names.schema.render(READ_SETTING_SQL))
        .bind(names.read_setting())
        .bind(&names.slot)
        .execute(pool)
        .await
        .map_err(|e| map_sqlx_error("recording where the CDC slot stands", e))?;
    Ok(())
}

const READ_SETTING_SQL: &str = include_str!("../../../queries/cdc_read_position_save.sql");

impl CdcStore {
    /// Whether the slot is lost and not made again yet (calls go to the polling engine).
    pub fn recovering(&self) -> bool {
        self.recovering.load(Ordering::Relaxed)
    }

    /// The slot is lost (`why`): says so loudly, forgets what the stream held (it is in the WAL,
    /// or salvaged) and starts the recovery at the next call.
    pub(super) fn lose_slot(&self, s: &mut State, why: &Error) {
        error!(
            slot = %self.names.slot,
            error = %why,
            "CDC SLOT LOST: the relay delivers the table's messages by polling meanwhile, makes \
             the slot again, publishes the emit messages the lost slot had not delivered (read \
             back from the WAL), then reads the stream again; outbox_emit refuses messages until \
             the new slot exists"
        );
        let confirmed = s.confirmed;
        let persisted = s.persisted;
        *s = State::default();
        s.confirmed = confirmed;
        s.persisted = persisted;
        self.recounted.store(false, Ordering::Release);
        self.recovering.store(true, Ordering::Relaxed);
        *self.next_recovery.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
    }

    /// While the slot is lost: starts the recovery when due, on a task of its own (a relay's
    /// call is abandoned at its store deadline, and making a slot waits for every transaction
    /// then running: it must not be cut off half-way); `true` while calls must still go to the
    /// polling engine for it (the catch-up that follows is the caller's to run).
    pub(super) async fn recovering_now(&self, _member: &MemberId) -> Result<bool> {
        if !self.recovering() {
            return Ok(false);
        }
        {
            let mut next = self.next_recovery.lock().unwrap_or_else(|e| e.into_inner());
            if Instant::now() < *next || self.recovery_running.swap(true, Ordering::AcqRel) {
                return Ok(true);
            }
            *next = Instant::now() + RECOVERY_RETRY;
        }
        let (confirmed, persisted) = {
            let s = self.state.lock().await;
            (s.confirmed, s.persisted)
        };
        let task = Recovery {
            pool: self.pool.clone(),
            names: self.names.clone(),
            recovering: self.recovering.clone(),
            recounted: self.recounted.clone(),
            catching_up: self.catching_up.clone(),
            unread_wal: self.unread_wal.clone(),
            confirmed,
            persisted,
        };
        let running = self.recovery_running.clone();
        tokio::spawn(async move {
            let slot = task.names.slot.clone();
            if let Err(e) = task.run().await {
                warn!(slot = %slot, error = %e, "CDC slot recovery failed; delivering by polling meanwhile, will try again");
            }
            running.store(false, Ordering::Release);
        });
        Ok(true)
    }

    /// Whether a relay of the group holds the recovery lock now (making the slot again).
    pub(super) async fn recovery_running(&self) -> Result<bool> {
        let mut tx = self
            .pool
            .begin()
            .await
            .map_err(|e| map_sqlx_error("looking at the CDC recovery lock", e))?;
        let free: bool =
            sqlx::query_scalar(include_str!("../../../queries/try_advisory_xact_lock.sql"))
                .bind(recovery_key(&self.names))
                .fetch_one(&mut *tx)
                .await
                .map_err(|e| map_sqlx_error("looking at the CDC recovery lock", e))?;
        let _ = tx.rollback().await;
        Ok(!free)
    }

    /// Writes the slot's read position soon after the relay confirmed more, at most once a
    /// second and off the claim's path: what a failover or an invalidation leaves to read back
    /// is then a second of WAL at most behind the slot.
    pub(super) fn save_soon(&self, s: &mut State) {
        if s.confirmed == s.saved_confirmed
            || s.saved_at.is_some_and(|at| at.elapsed() < SAVE_EVERY)
        {
            return;
        }
        s.saved_confirmed = s.confirmed;
        s.saved_at = Some(Instant::now());
        let (pool, names) = (self.pool.clone(), self.names.clone());
        tokio::spawn(async move {
            if let Err(e) = save_position(&pool, &names).await {
                tracing::debug!(error = %e, "the CDC slot's position was not recorded; the next one will");
            }
        });
    }

    /// Writes the slot's read position (restart, confirmed) to `outbox_settings` at a
    /// maintenance round, when it moved since the last write.
    pub(super) async fn save_read_position(&self) -> Result<()> {
        let position: Option<(String, String)> =
            sqlx::query_as(include_str!("../../../queries/cdc_slot_read_position.sql"))
                .bind(&self.names.slot)
                .fetch_optional(&self.pool)
                .await
                .map_err(|e| map_sqlx_error("reading the CDC slot's position", e))?;
        let Some((r, c)) = position else {
            return Ok(());
        };
        let now = (
            super::parse_lsn(&r).unwrap_or(0),
            super::parse_lsn(&c).unwrap_or(0),
        );
        if self.state.lock().await.persisted == Some(now) {
            return Ok(());
        }
        save_position(&self.pool, &self.names).await?;
        self.state.lock().await.persisted = Some(now);
        Ok(())
    }

    /// When the slot's own lag (WAL written since its confirmed position) is over `limit`:
    /// takes the emitters' lock (so every `emit` that passed its check is in the WAL read
    /// back), ends the stream, drops the slot, and recovers as from any loss. Returns whether it
    /// dropped it. The lag is measured from the confirmed position, not from the restart
    /// position: a transaction held open anywhere in the cluster holds the latter back without
    /// the relay being behind (warned about apart).
    pub(super) async fn over_limit_drops(&self, limit: u64) -> Result<bool> {
        let lag: Option<(Option<i64>, Option<i64>)> =
            sqlx::query_as(include_str!("../../../queries/cdc_slot_retained.sql"))
                .bind(&self.names.slot)
                .fetch_optional(&self.pool)
                .await
                .map_err(|e| map_sqlx_error("reading the CDC slot's lag", e))?;
        let Some((Some(lag), held_back)) = lag else {
            return Ok(false); // gone already: the next claim finds out
        };
        if held_back.is_some_and(|h| u64::try_from(h).unwrap_or(0) > limit) {
            warn!(
                slot = %self.names.slot,
                held_back = held_back.unwrap_or(0),
                "the slot keeps more WAL than its confirmed position needs: a transaction open \
                 for long somewhere in the cluster (or a prepared one) holds its restart position \
                 back; see pg_stat_activity's oldest backend_xid and pg_prepared_xacts, and set \
                 idle_in_transaction_session_timeout"
            );
        }
        let lag = u64::try_from(lag).unwrap_or(0);
        if lag <= limit {
            return Ok(false);
        }
        let mut s = self.state.lock().await;
        // This session's stream ends first: a slot in use cannot be dropped.
        s.stream = None;
        if !self.drop_slot_locked().await? {
            return Ok(false);
        }
        let why = Error::new(
            ErrorKind::Config,
            format!(
                "the slot `{}` was {lag} bytes of WAL behind, over the relay's limit of {limit} \
                 (--cdc-max-retained-wal): the relay dropped it",
                self.names.slot
            ),
        );
        self.lose_slot(&mut s, &why);
        Ok(true)
    }

    /// One try of [`CdcStore::drop_slot_locked`]: the emitters' lock, then the drop, in one
    /// transaction (the lock is let go at its end).
    async fn try_drop_slot_locked(&self) -> std::result::Result<(), sqlx::Error> {
        let mut tx = self.pool.begin().await?;
        sqlx::query(include_str!("../../../queries/cdc_slot_lock.sql"))
            .bind(&self.names.slot)
            .execute(&mut *tx)
            .await?;
        sqlx::query(include_str!("../../../queries/cdc_drop_slot.sql"))
            .bind(&self.names.slot)
            .execute(&mut *tx)
            .await?;
        tx.commit().await
    }

    /// Drops the slot holding the emitters' lock exclusively (see `outbox_emit`), so no `emit`
    /// that passed its check commits after the drop. `false` when it could not be dropped yet
    /// (this relay's own WAL sender still holding it).
    async fn drop_slot_locked(&self) -> Result<bool> {
        let until = Instant::now() + super::SLOT_RELEASE;
        loop {
            match self.try_drop_slot_locked().await {
                Ok(_) => return Ok(true),
                Err(e) if Instant::now() >= until => {
                    warn!(slot = %self.names.slot, error = %map_sqlx_error("dropping the CDC slot", e), "the CDC slot is over its limit but could not be dropped yet; will try again");
                    return Ok(false);
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }
}

/// The recovery lock's key: one relay of the group makes the slot again at a time.
fn recovery_key(names: &CdcNames) -> String {
    format!("outbox-cdc-recover:{}", names.slot)
}

/// One recovery, on a task of its own: what it needs of the store, shared.
struct Recovery {
    pool: PgPool,
    names: CdcNames,
    recovering: Arc<AtomicBool>,
    recounted: Arc<AtomicBool>,
    catching_up: Arc<AtomicBool>,
    unread_wal: Arc<AtomicU64>,
    /// What this relay confirmed, and the position it last wrote (if any).
    confirmed: u64,
    persisted: Option<(u64, u64)>,
}

impl Recovery {
    /// Makes the slot again and parks what the lost one had not delivered (see the module
    /// documentation), holding the group's recovery lock (a transaction's, so it is let go
    /// whatever happens to this task); then the catch-up runs if the table holds messages
    /// before the new slot that the polling positions have not passed. Another relay holding
    /// the lock: nothing now, tried again later.
    async fn run(self) -> Result<()> {
        let mut lock = self
            .pool
            .begin()
            .await
            .map_err(|e| map_sqlx_error("taking the CDC recovery lock", e))?;
        // Making a slot waits for every transaction running then: no statement timeout.
        sqlx::query(include_str!("../../../queries/no_statement_timeout.sql"))
            .execute(&mut *lock)
            .await
            .map_err(|e| map_sqlx_error("taking the CDC recovery lock", e))?;
        let got: bool =
            sqlx::query_scalar(include_str!("../../../queries/try_advisory_xact_lock.sql"))
                .bind(recovery_key(&self.names))
                .fetch_one(&mut *lock)
                .await
                .map_err(|e| map_sqlx_error("taking the CDC recovery lock", e))?;
        if !got {
            return Err(Error::new(
                ErrorKind::Connection,
                "another relay of the group is making the slot again; will look again",
            ));
        }
        // The polling engine trusts the positions' parked counts to know which keys wait
        // behind a parked message: set right first, then it may deliver the table meanwhile.
        recount_parked(&self.pool, &self.names).await;
        self.recounted.store(true, Ordering::Release);
        let mut from = self.persisted.map_or(self.confirmed, |(r, _)| r);
        let mut confirmed = self.confirmed;
        if let Some((restart, saved)) = saved_read_position(&self.pool, &self.names).await? {
            from = if from == 0 {
                restart
            } else {
                from.min(restart)
            };
            confirmed = confirmed.max(saved);
        }
        let made = crate::cdc::setup::make_slot(&self.pool, &self.names).await?;
        let until = match made.start_lsn {
            Some(lsn) => lsn,
            None => wal_now(&self.pool).await?,
        };
        if from == 0 {
            warn!(
                slot = %self.names.slot,
                "where the lost slot stood is not known (no relay recorded it): emit messages it \
                 had not delivered cannot be read back"
            );
        } else {
            self.park_salvage(from, confirmed, until).await?;
        }
        recount_parked(&self.pool, &self.names).await;
        let behind = before_slot(&self.pool, &self.names)
            .await?
            .is_some_and(|n| n > 0);
        self.catching_up.store(behind, Ordering::Relaxed);
        self.recovering.store(false, Ordering::Relaxed);
        let _ = lock.commit().await;
        info!(
            slot = %self.names.slot,
            catching_up = behind,
            "CDC slot made again; {}",
            if behind {
                "delivering the table's messages before it by polling, then the stream"
            } else {
                "reading the stream"
            }
        );
        Ok(())
    }

    /// Reads `[from, until)` of the WAL and parks this schema's `emit` messages committed there
    /// after `confirmed`, in commit order; names what could not be read.
    async fn park_salvage(&self, from: u64, confirmed: u64, until: u64) -> Result<()> {
        let found = salvage::salvage(&self.pool, &self.names, from, confirmed, until).await?;
        if let Some((lost_from, lost_to, why)) = &found.unread {
            self.unread_wal
                .fetch_add(lost_to.saturating_sub(*lost_from), Ordering::Relaxed);
            error!(
                slot = %self.names.slot,
                from = %lsn_text(*lost_from),
                to = %lsn_text(*lost_to),
                error = %why,
                "EMIT MESSAGES LOST: the WAL between these positions could not be read back, so \
                 the emit messages committed there and not yet published are gone (table rows \
                 are not: polling delivers them). Keep max_slot_wal_keep_size above the longest \
                 outage, or write through the table"
            );
        }
        let mut rows = Vec::with_capacity(found.items.len());
        let now = Instant::now();
        for (order, item) in found.items.into_iter().enumerate() {
            let (message, malformed) = match item {
                Item::Message(m) => (*m, None),
                Item::Malformed(m, why) => (*m, Some(why)),
                _ => continue,
            };
            let held = Held {
                message,
                origin: Origin::Stream(0),
                due: now,
                taken: now,
                order: order as u64,
                malformed,
                row_seq: None,
            };
            rows.push(ToPark::new(held, "retrying", None));
        }
        let n = rows.len();
        park_rows(&self.pool, &self.names, rows).await?;
        if n > 0 {
            info!(slot = %self.names.slot, messages = n, "emit messages the lost slot had not delivered, read back from the WAL and parked to publish");
        }
        Ok(())
    }
}

/// Where the slot stood when a relay last wrote it (restart, confirmed), in `outbox_settings`:
/// what survives the relay's restart and a failover.
async fn saved_read_position(pool: &PgPool, names: &CdcNames) -> Result<Option<(u64, u64)>> {
    let text: Option<String> = sqlx::query_scalar(
        &names
            .schema
            .render(include_str!("../../../queries/setting_get.sql")),
    )
    .bind(names.read_setting())
    .fetch_optional(pool)
    .await
    .map_err(|e| map_sqlx_error("reading where the CDC slot stood", e))?;
    Ok(text.and_then(|t| {
        let (r, c) = t.split_once(' ')?;
        Some((super::parse_lsn(r)?, super::parse_lsn(c)?))
    }))
}

/// The server's flushed WAL position now.
async fn wal_now(pool: &PgPool) -> Result<u64> {
    let lsn: String = sqlx::query_scalar(include_str!("../../../queries/wal_flush_lsn.sql"))
        .fetch_one(pool)
        .await
        .map_err(|e| map_sqlx_error("reading the WAL position", e))?;
    super::parse_lsn(&lsn).ok_or_else(|| {
        Error::new(
            ErrorKind::Database,
            format!("the server's WAL position `{lsn}` is not an LSN"),
        )
    })
}

/// Sets the positions' parked counts right after the slot was lost (the stream parks without
/// them).
async fn recount_parked(pool: &PgPool, names: &CdcNames) {
    if let Err(e) = sqlx::query(&names.schema.render(RECOUNT_SQL))
        .execute(pool)
        .await
    {
        warn!(
            error = %map_sqlx_error("recounting parked messages", e),
            "the polling engine may not see messages the CDC relay parked until this succeeds; \
             will try again"
        );
    }
}
