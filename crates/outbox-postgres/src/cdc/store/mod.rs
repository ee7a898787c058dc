//! [`CdcStore`]: the relay's [`Store`] over a replication slot instead of positions. The relay's
//! worker claims, publishes and completes as in polling mode (sinks, routes, breakers, retries
//! and metrics are the same code); what differs is where messages come from and what is
//! recorded:
//!
//! - **Claims** hand out messages in the order the stream sends them: commit order, then the
//!   order within each transaction. A key with a message waiting for a retry holds its later
//!   messages back, in order; other keys flow.
//! - **The confirmed position** is the commit end of the last transaction whose messages are all
//!   published or parked, and all before it; never a position inside a transaction. With
//!   nothing unresolved, an idle position from the server is confirmed, so a quiet outbox does
//!   not hold back WAL written by other tables.
//! - **Failures park** as in polling mode: a message that ends failed is copied into
//!   `outbox_parked` (so `outbox failed`, `redrive` and the console work unchanged), and with
//!   `--on-failed block` the later messages of its key are parked behind it as `waiting`. A
//!   redriven key is read back from `outbox_parked`, in order, and deleted as it is published.
//!   That table is read only while it holds rows; an idle relay sends no query.
//! - **Leases** are the slot's: PostgreSQL lets one session read a slot at a time. A second relay
//!   of the group is refused and retries; it takes over when the first one's session ends (kill,
//!   crash, or `wal_sender_timeout` after a SIGSTOP), from the confirmed position. What the first
//!   one published past it is published again: at least once, never lost.
//!
//! Here: the store and its `Store` impl. Beside it, with the polling store's file names:
//! `connect` (the stream started, the catch-up), `claim` (due heads, redriven parked rows, the
//! stream), `complete` (outcomes, parking, checkpoints), `inspect` (the figures); `state` (the
//! state in memory, without I/O, with tests of its own) and `recover` (a lost slot).

use std::collections::{HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use outbox_core::{
    ClaimLimits, Error, ErrorKind, FailedMessage, Maintenance, MemberId, Message, NewMessage,
    OnFailed, Outcome, RedriveScope, Result, Stats, Store,
};
use sqlx::PgPool;
use tokio::sync::{watch, Mutex};
use tracing::{info, warn};

use crate::cdc::setup::{check_wal_level, max_slot_wal_keep_mb, CdcNames};
use crate::cdc::stream;
use crate::cdc::sync::Gate;

use crate::error::map_sqlx_error;
use crate::store::{PgStore, PARTITIONS};

mod claim;
mod complete;
mod connect;
mod inspect;
mod recover;
mod state;

use complete::*;
use connect::*;
use state::*;

/// How long a wake-up waits for more of the stream before the relay claims (see `listen`):
/// the price in latency of batching a trickle.
const LINGER: Duration = Duration::from_millis(2);

/// How often parked rows are looked at while there are any: a redriven key flows within this.
const PARKED_POLL: Duration = Duration::from_secs(1);

const PARK_SQL: &str = include_str!("../../../queries/cdc_park.sql");
const PARKED_READ_SQL: &str = include_str!("../../../queries/cdc_parked_read.sql");
const PARKED_DONE_SQL: &str = include_str!("../../../queries/cdc_parked_done.sql");
const PARKED_FAIL_SQL: &str = include_str!("../../../queries/cdc_parked_fail.sql");
const GAUGES_SQL: &str = include_str!("../../../queries/cdc_gauges.sql");
const MARK_SQL: &str = include_str!("../../../queries/cdc_mark.sql");
const CHECKPOINT_SQL: &str = include_str!("../../../queries/cdc_checkpoint.sql");
const RECOUNT_SQL: &str = include_str!("../../../queries/cdc_recount_parked.sql");
const BEFORE_SLOT_SQL: &str = include_str!("../../../queries/cdc_before_slot.sql");

/// How often the catch-up asks whether every message written before the slot was passed.
const CATCH_UP_CHECK: Duration = Duration::from_secs(1);

/// How long a message may wait in the relay's memory (its key's sink down, or a retry) while
/// other messages flow, before it is parked in `outbox_parked` so its transaction, and the
/// slot's confirmed position, can move on (see [`CdcStore::with_park_after`]).
pub const DEFAULT_PARK_AFTER: Duration = Duration::from_secs(60);

/// How long dropping a slot over its limit waits for this relay's own WAL sender to exit.
const SLOT_RELEASE: Duration = Duration::from_secs(10);

/// WAL the cluster writes before an idle CDC relay runs maintenance (segments ahead of the
/// transaction ids), at most. Every transaction that takes an id writes a commit record, and
/// the cheapest id, a subtransaction's, still costs 4 bytes of it: 64 MiB of WAL can use at
/// most 16.8 million ids, less than one segment width (20 million by default) of the
/// [`crate::LOOKAHEAD_SEGMENTS`] kept ahead. A schema with narrower segments gets a lower
/// threshold (see [`maintain_after_wal`]).
const MAINTAIN_AFTER_WAL: u64 = 64 << 20;

/// The WAL threshold for segments `width` transaction ids wide: at most one width of the
/// cheapest ids (4 bytes each), and never above [`MAINTAIN_AFTER_WAL`].
fn maintain_after_wal(width: i64) -> u64 {
    u64::try_from(width)
        .unwrap_or(0)
        .saturating_mul(4)
        .clamp(1, MAINTAIN_AFTER_WAL)
}

/// The relay's store in CDC mode (see the module documentation).
pub struct CdcStore {
    pool: PgPool,
    url: String,
    names: CdcNames,
    /// For what CDC mode shares with polling: status, failed, redrive, journey.
    inner: PgStore,
    state: Mutex<State>,
    /// Rung by the stream task when it has items.
    doorbell: Arc<watch::Sender<u64>>,
    more: AtomicBool,
    /// The slot is lost (missing, invalidated, dropped over its limit): calls go to the polling
    /// engine until the slot is made again and what it had not delivered is salvaged (see
    /// [`CdcStore::recover`]); then the catch-up, then the stream.
    recovering: Arc<AtomicBool>,
    /// A recovery task runs (see `recover.rs`).
    recovery_running: Arc<AtomicBool>,
    /// While recovering: the positions' parked counts are right (the stream parks without
    /// them), so the polling engine may claim without passing a parked key's head.
    recounted: Arc<AtomicBool>,
    /// When recovery is tried next.
    next_recovery: std::sync::Mutex<Instant>,
    /// The synchronous-standby gate (see [`crate::cdc::sync`]).
    gate: Gate,
    /// Rung by the stream when the server has been silent: a heartbeat asks it for a word.
    probe: Arc<watch::Sender<u64>>,
    /// See [`CdcStore::with_park_after`].
    park_after: Duration,
    /// See [`CdcStore::with_silence`].
    silence: Duration,
    /// Why the relay does not read the stream (publication drift, a setting it refuses), for
    /// `/readyz` and `outbox status`; `None` while it reads or may.
    refusal: std::sync::Mutex<Option<String>>,
    /// WAL bytes whose `emit` messages could not be read back after a slot was lost.
    unread_wal: Arc<std::sync::atomic::AtomicU64>,
    /// Write a heartbeat after this long without stream items (`None`: never).
    heartbeat: Option<Duration>,
    /// Messages written before the slot was created are not in its stream: until the polling
    /// positions have passed every one of them, the relay delivers by polling (the catch-up),
    /// then reads the stream. See [`CdcStore::new`].
    catching_up: Arc<AtomicBool>,
    /// When the catch-up next asks whether it is done (at most every [`CATCH_UP_CHECK`]).
    next_catch_up_check: std::sync::Mutex<Instant>,
    /// WAL bytes after which an idle relay runs maintenance (see [`MAINTAIN_AFTER_WAL`]).
    maintain_after_wal: u64,
    /// Retained WAL past which the relay drops its slot and falls back to polling (`None`:
    /// only PostgreSQL's `max_slot_wal_keep_size` bounds it).
    max_retained: Option<u64>,
}

impl CdcStore {
    /// A CDC store reading `names.slot` of the database at `url` (its pool, `pool`, serves the
    /// parked table and the shared reads). Checks `wal_level` and the slot now, so a missing
    /// setup is reported at start with its fix; the stream itself starts at the first claim.
    ///
    /// **Catch-up.** A slot's stream starts where the slot was created. When the table still
    /// holds messages written before that which the polling positions have not passed (a
    /// polling relay stopped before it delivered them, or never ran), the store first works as
    /// the polling engine does (partitions, leases, claims, parking) until every such message is
    /// published or parked, then releases its partitions and reads the stream from the slot's
    /// start. Messages written after the slot's creation and delivered by the catch-up come
    /// again from the stream, with the same ids: at least once, never zero times, and each key's
    /// messages of the table in order.
    pub async fn new(pool: PgPool, url: &str, names: CdcNames) -> Result<Self> {
        check_wal_level(&pool).await?;
        // Never set up: say so. Set up once and missing now (a failover to a standby that did
        // not have it, a drop): the relay makes it again (see `recover`).
        let set_up: bool = sqlx::query_scalar(
            &names
                .schema
                .render(include_str!("../../../queries/setting_exists.sql")),
        )
        .bind(names.start_setting())
        .fetch_one(&pool)
        .await
        .map_err(|e| map_sqlx_error("looking for the CDC setup", e))?;
        if !set_up && !crate::cdc::setup::slot_exists(&pool, &names.slot).await? {
            return Err(Error::new(
                ErrorKind::Schema,
                format!(
                    "the replication slot `{}` does not exist; run `outbox migrate --cdc` (same \
                     schema and group) first",
                    names.slot
                ),
            ));
        }
        crate::cdc::setup::check_one_group(&pool, &names).await?;
        crate::cdc::checks::check_publication(&pool, &names).await?;
        crate::cdc::checks::check_synchronous_standbys(&pool, &names).await?;
        if max_slot_wal_keep_mb(&pool).await?.is_none() {
            warn!(
                slot = %names.slot,
                "max_slot_wal_keep_size is unlimited (-1): while this relay is stopped its slot \
                 keeps every WAL segment, until the disk fills; set a bound (ALTER SYSTEM SET \
                 max_slot_wal_keep_size = '…') and watch outbox_cdc_slot_retained_bytes"
            );
        }
        stream::replication_config(url, &names, None)?;
        let width: i64 = sqlx::query_scalar(
            &names
                .schema
                .render(include_str!("../../../queries/segment_xids.sql")),
        )
        .fetch_one(&pool)
        .await
        .map_err(|e| map_sqlx_error("reading the segment width", e))?;
        let inner = PgStore::new(pool.clone(), names.schema.clone());
        let gate = Gate::start(pool.clone(), &names);
        let store = Self {
            maintain_after_wal: maintain_after_wal(width),
            pool,
            url: url.to_string(),
            names,
            inner,
            state: Mutex::new(State::default()),
            doorbell: Arc::new(watch::channel(0).0),
            more: AtomicBool::new(false),
            recovering: Arc::new(AtomicBool::new(false)),
            recovery_running: Arc::new(AtomicBool::new(false)),
            recounted: Arc::new(AtomicBool::new(false)),
            next_recovery: std::sync::Mutex::new(Instant::now()),
            gate,
            probe: Arc::new(watch::channel(0).0),
            park_after: DEFAULT_PARK_AFTER,
            silence: stream::SILENCE,
            refusal: std::sync::Mutex::new(None),
            unread_wal: Arc::new(std::sync::atomic::AtomicU64::new(0)),
            heartbeat: None,
            max_retained: None,
            catching_up: Arc::new(AtomicBool::new(false)),
            next_catch_up_check: std::sync::Mutex::new(Instant::now() + CATCH_UP_CHECK),
        };
        if crate::cdc::setup::slot_lost_now(&store.pool, &store.names.slot).await? != Some(false) {
            // Set up once, and the slot is missing (a failover to a standby that did not have
            // it) or lost: made again at the first claim, with what it had not delivered.
            let why = Error::new(
                ErrorKind::Config,
                format!(
                    "the slot `{}` is missing or lost at start",
                    store.names.slot
                ),
            );
            store.lose_slot(&mut *store.state.lock().await, &why);
            return Ok(store);
        }
        if let Some(partitions) = store.before_slot().await?.filter(|n| *n > 0) {
            warn!(
                slot = %store.names.slot,
                partitions,
                "the table holds messages written before the CDC slot was created, which are \
                 not in its stream, and no polling relay has passed them: this relay delivers \
                 them first, as `outbox relay` does, then reads the stream (messages written \
                 since the slot was created may go out twice, same ids)"
            );
            store.catching_up.store(true, Ordering::Relaxed);
        }
        Ok(store)
    }

    /// Whether the store still delivers messages written before the slot was created, by
    /// polling, before it reads the stream (see [`CdcStore::new`]).
    pub fn catching_up(&self) -> bool {
        self.catching_up.load(Ordering::Relaxed)
    }

    /// Whether calls go to the polling engine: after the fallback, or during the catch-up.
    fn polling(&self) -> bool {
        self.recovering() || self.catching_up.load(Ordering::Relaxed)
    }

    /// The slot, publication and prefix this store reads.
    pub fn names(&self) -> &CdcNames {
        &self.names
    }

    /// The position confirmed to the server so far (0 before the first).
    pub async fn confirmed(&self) -> u64 {
        self.state.lock().await.confirmed
    }

    /// Keeps `why` the relay does not read the stream, for `/readyz` (see [`Store::ping`]).
    fn refuse(&self, why: &Error) {
        *self.refusal.lock().unwrap_or_else(|e| e.into_inner()) = Some(why.to_string());
    }

    fn refuse_no_more(&self) {
        *self.refusal.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// A message that waits in memory longer than `after` while other messages are published
    /// (its route's sink down, or retried) is parked in `outbox_parked` with its key's later
    /// messages behind it, so its transaction is confirmed and the slot's WAL is released; the
    /// parked path publishes them in order once their sink is back. While nothing is published
    /// at all (every sink down), nothing is parked: the slot holds the WAL, bounded by
    /// `max_slot_wal_keep_size` and `--cdc-max-retained-wal`. Default [`DEFAULT_PARK_AFTER`].
    pub fn with_park_after(mut self, after: Duration) -> Self {
        self.park_after = after.max(Duration::from_secs(1));
        self
    }

    /// How long the server may say nothing before the relay asks it for a word, and then gives
    /// its connection up for dead (twice this in all). Default 20 s; tests shorten it.
    #[doc(hidden)]
    pub fn with_silence(mut self, silence: Duration) -> Self {
        self.silence = silence.max(Duration::from_millis(100));
        self
    }

    /// Drops the slot once it retains more than `bytes` of WAL, checked at each maintenance
    /// round while the relay has messages in hand or handled some (an idle relay sends no
    /// statement) and at every round of a catch-up, and falls back to the polling engine: the
    /// table's messages are delivered
    /// from the last checkpoint on, none lost; logical messages (`emit`) not yet published go
    /// with the WAL, as when PostgreSQL invalidates the slot at `max_slot_wal_keep_size`. A
    /// bound of this slot's own, acted on before the cluster-wide one. `None` (the default):
    /// no bound of ours.
    pub fn with_max_retained(mut self, bytes: Option<u64>) -> Self {
        self.max_retained = bytes;
        self
    }

    /// Writes a heartbeat into the WAL every `every` the stream is silent: a non-transactional
    /// logical message of this group, which the stream returns as a position to confirm. Off by
    /// default, since PostgreSQL's own idle positions keep the slot moving (see docs/cdc.md) and
    /// a relay that sends nothing on an idle database is worth keeping; turn it on where the
    /// slot's confirmed position must move although nothing of this database is written.
    pub fn with_heartbeat(mut self, every: Option<Duration>) -> Self {
        self.heartbeat = every.filter(|d| !d.is_zero());
        self
    }
}

#[async_trait]
impl Store for CdcStore {
    async fn rebalance(&self, member: &MemberId, lease: Duration) -> Result<Vec<i32>> {
        // The catch-up may end here too: a member the polling engine gives no partition never
        // claims. Like a claim, a rebalance comes between batches.
        if self.recovering_now(member).await? {
            if !self.recounted.load(Ordering::Acquire) {
                return Ok(Vec::new());
            }
            return self.inner.rebalance(member, lease).await;
        }
        if self.catching_up() && !self.catch_up_done(member).await? {
            return self.inner.rebalance(member, lease).await;
        }
        // The slot is the lease: whoever streams it owns every partition.
        Ok((0..PARTITIONS as i32).collect())
    }

    /// The slot is the lease: held while this relay's stream runs. A stream that ended (the
    /// server closed it: a takeover after this relay was frozen past `wal_sender_timeout`, a
    /// restart) holds nothing, so a relay resumed after a takeover stops publishing its stale
    /// batch, as a polling relay whose lease ran out does.
    async fn renew(&self, member: &MemberId, lease: Duration) -> Result<usize> {
        if self.polling() {
            return self.inner.renew(member, lease).await;
        }
        let s = self.state.lock().await;
        match &s.stream {
            Some(stream) if stream.ended() => Ok(0),
            _ => Ok(PARTITIONS),
        }
    }

    async fn claim(
        &self,
        _member: &MemberId,
        _partitions: &[i32],
        limits: ClaimLimits,
        on_failed: OnFailed,
    ) -> Result<Vec<Message>> {
        let recovering = self.recovering_now(_member).await?;
        if recovering && !self.recounted.load(Ordering::Acquire) {
            return Ok(Vec::new());
        }
        if recovering || (self.catching_up() && !self.catch_up_done(_member).await?) {
            return self
                .inner
                .claim(_member, _partitions, limits, on_failed)
                .await;
        }
        self.claim_stream(limits, on_failed).await
    }

    fn more_to_read(&self, member: &MemberId) -> bool {
        if self.polling() {
            return self.inner.more_to_read(member);
        }
        self.more.load(Ordering::Relaxed)
    }

    async fn complete(&self, member: &MemberId, outcomes: &[Outcome]) -> Result<u64> {
        if self.polling() {
            return self.inner.complete(member, outcomes).await;
        }
        self.complete_stream(outcomes).await
    }

    async fn report_health(
        &self,
        member: &MemberId,
        circuit: &str,
        sink_error: Option<&str>,
    ) -> Result<()> {
        self.inner.report_health(member, circuit, sink_error).await
    }

    async fn release(&self, member: &MemberId) -> Result<()> {
        if self.polling() {
            return self.inner.release(member).await;
        }
        // Dropping the stream ends the replication session: the slot is free for another
        // relay of the group at once.
        self.state.lock().await.stream = None;
        Ok(())
    }

    /// Wakes the relay when the stream has items, at most once per [`LINGER`]: messages that
    /// arrive meanwhile go out in the same batch (at 1,000 events/s a wake-up per message was
    /// most of the relay's CPU: task switches, not work). With a heartbeat set, writes one when
    /// the stream has been silent that long (see [`CdcStore::with_heartbeat`]).
    async fn listen(&self, wake: watch::Sender<u64>) -> Result<()> {
        let mut bell = self.doorbell.subscribe();
        let mut probe = self.probe.subscribe();
        let mut gate = self.gate.clone();
        let every = self.heartbeat.unwrap_or(Duration::MAX);
        loop {
            tokio::select! {
                rang = bell.changed() => {
                    if rang.is_err() {
                        return Ok(());
                    }
                    tokio::time::sleep(LINGER).await;
                    bell.borrow_and_update();
                    wake.send_modify(|n| *n = n.wrapping_add(1));
                }
                // A barrier covered what the relay waits for: claim again.
                _ = gate.moved() => wake.send_modify(|n| *n = n.wrapping_add(1)),
                // The stream heard nothing for a while: ask the server for a word.
                asked = probe.changed() => {
                    if asked.is_ok() {
                        self.beat().await;
                    }
                }
                _ = tokio::time::sleep(every) => self.beat().await,
            }
        }
    }

    async fn stats(&self) -> Result<Stats> {
        self.inner.stats().await
    }

    /// In CDC mode the backlog is in the WAL, not in the table: pending counts the messages the
    /// relay read and has not published or parked yet, and the parked rows still to publish;
    /// the slot's lag says how much WAL is still to read.
    async fn gauges(&self) -> Result<outbox_core::Gauges> {
        self.read_gauges().await
    }

    /// The database answers, and the relay does not refuse to read the stream (a publication
    /// that drifted): `/readyz` says which.
    async fn ping(&self) -> Result<()> {
        self.inner.ping().await?;
        match self
            .refusal
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
        {
            Some(why) => Err(Error::new(ErrorKind::Config, why)),
            None => Ok(()),
        }
    }

    /// Checkpoints (see [`CdcStore::checkpoint`]), then the polling engine's upkeep (segments
    /// ahead of the writers, retention), but only after messages were handled since the last
    /// round: an idle database gets no statement.
    async fn maintain(&self, retention: Duration) -> Result<Maintenance> {
        if self.recovering() {
            return self.inner.maintain(retention).await;
        }
        if self.catching_up() {
            // The slot waits unread meanwhile and keeps its WAL: the relay's own bound holds
            // during a long catch-up too (the slot dropped and made again, as below).
            if let Some(limit) = self.max_retained {
                self.over_limit_drops(limit).await?;
            }
            return self.inner.maintain(retention).await;
        }
        self.checkpoint().await?;
        // Due after messages were handled, or once the cluster wrote MAINTAIN_AFTER_WAL bytes of
        // WAL (the slot confirms the server's idle positions, so `confirmed` follows it): other
        // databases use transaction ids too, and segments must stay ahead of them. Anything
        // less leaves the segments ahead by far (see MAINTAIN_AFTER_WAL), so an idle outbox
        // on a busy cluster gets no statement either.
        let (due, behind) = {
            let mut s = self.state.lock().await;
            let handled = std::mem::take(&mut s.handled_since_maintain) > 0;
            let moved = s.confirmed.saturating_sub(s.confirmed_at_maintain)
                >= self.maintain_after_wal
                || s.confirmed < s.confirmed_at_maintain;
            if handled || moved {
                s.confirmed_at_maintain = s.confirmed;
            }
            // Messages in hand that are not confirmed: a relay stuck on them (a broker down)
            // handles nothing and confirms nothing, and that is when the slot's WAL grows.
            let behind = !s.txns.is_empty() || !s.held.is_empty() || !s.inflight.is_empty();
            (handled || moved, behind)
        };
        if let Some(limit) = self.max_retained.filter(|_| due || behind) {
            if self.over_limit_drops(limit).await? {
                return self.inner.maintain(retention).await;
            }
        }
        if due {
            // Where the slot stands, for a salvage if it is lost (a failover, an invalidation).
            self.save_read_position().await?;
            self.inner.maintain(retention).await
        } else {
            Ok(Maintenance::default())
        }
    }

    async fn failed(&self, limit: usize) -> Result<Vec<FailedMessage>> {
        self.inner.failed(limit).await
    }

    async fn failed_matching(
        &self,
        filter: &outbox_core::FailedFilter,
        after: Option<i64>,
        limit: usize,
    ) -> Result<outbox_core::FailedPage> {
        self.inner.failed_matching(filter, after, limit).await
    }

    async fn redrive(&self, scope: &RedriveScope, reason: &str) -> Result<u64> {
        self.inner.redrive(scope, reason).await
    }

    async fn journey(
        &self,
        query: &outbox_core::JourneyQuery,
        limit: usize,
    ) -> Result<Vec<outbox_core::Journey>> {
        self.inner.journey(query, limit).await
    }

    async fn insert(&self, messages: &[NewMessage]) -> Result<()> {
        self.inner.insert(messages).await
    }
}

/// `16/B374D848` as a number.
pub(crate) fn parse_lsn(text: &str) -> Option<u64> {
    let (hi, lo) = text.split_once('/')?;
    Some((u64::from_str_radix(hi, 16).ok()? << 32) | u64::from_str_radix(lo, 16).ok()?)
}

#[cfg(test)]
mod tests {
    #[test]
    fn idle_maintenance_waits_for_less_wal_than_one_segment_of_ids() {
        assert_eq!(super::maintain_after_wal(20_000_000), 64 << 20);
        assert_eq!(super::maintain_after_wal(1_000), 4_000);
        assert_eq!(super::maintain_after_wal(0), 1);
    }

    #[test]
    fn lsns_parse_as_the_server_writes_them() {
        assert_eq!(super::parse_lsn("0/1E40350"), Some(0x1E4_0350));
        assert_eq!(
            super::parse_lsn("16/B374D848"),
            Some((0x16 << 32) | 0xB374_D848)
        );
        assert_eq!(super::parse_lsn("nonsense"), None);
    }
}
