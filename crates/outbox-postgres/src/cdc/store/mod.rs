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

use std::collections::{HashMap, HashSet, VecDeque};
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
use crate::cdc::stream::{self, Item, Stream};
use crate::cdc::sync::Gate;

mod recover;
use crate::error::map_sqlx_error;
use crate::store::{PgStore, PARTITIONS};

/// How long a wake-up waits for more of the stream before the relay claims (see `listen`):
/// the price in latency of batching a trickle.
const LINGER: Duration = Duration::from_millis(2);

/// Messages the relay holds back at most (waiting for a retry of their key's head, or behind
/// it) before it stops reading the stream; their payloads are bounded too, at four times the
/// worker's byte share.
const MAX_HELD: usize = 10_000;

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

/// Where a handed-out message came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Origin {
    /// The stream: the transaction it belongs to (an index that only grows).
    Stream(u64),
    /// A row of `outbox_parked`, already durable.
    Parked { partition: i16, seq: i64 },
}

/// A message the store holds: handed out, or waiting in its key's queue.
#[derive(Debug, Clone)]
struct Held {
    message: Message,
    origin: Origin,
    /// Not handed out before this.
    due: Instant,
    /// When the relay took it from the stream (or the parked table): how long it has waited.
    taken: Instant,
    /// Stream order (0 for parked rows): a key's messages are handed out and parked in it.
    order: u64,
    /// Why it cannot be published as written: it is never handed out, and is parked as
    /// `failed` when its turn comes (behind its key's earlier messages, never ahead of them).
    malformed: Option<String>,
    /// The seq of the table row it came from (`None` for a logical message): parked, a row
    /// keeps it, so a polling relay that meets the same row parks it at the same place and a
    /// key's parked rows sort as polling sorts them.
    row_seq: Option<i64>,
}

/// A transaction of the stream not yet confirmed.
#[derive(Debug)]
struct Txn {
    /// Commit end position, once its Commit was read.
    end: Option<u64>,
    /// Its messages neither published nor parked.
    open: usize,
    /// Its messages.
    messages: usize,
    /// When it committed.
    committed_at: chrono::DateTime<chrono::Utc>,
}

/// How long a message may wait in the relay's memory (its key's sink down, or a retry) while
/// other messages flow, before it is parked in `outbox_parked` so its transaction, and the
/// slot's confirmed position, can move on (see [`CdcStore::with_park_after`]).
pub const DEFAULT_PARK_AFTER: Duration = Duration::from_secs(60);

/// A message to write into `outbox_parked`: `state` is `failed`, `waiting` or `retrying`.
struct ToPark {
    held: Held,
    state: &'static str,
    error: Option<String>,
}

/// `Instant` `at` as a wall-clock time (for a parked row's next attempt).
fn wall(at: Instant) -> chrono::DateTime<chrono::Utc> {
    let now = Instant::now();
    let ahead = at.saturating_duration_since(now);
    chrono::Utc::now() + chrono::Duration::from_std(ahead).unwrap_or_default()
}

impl ToPark {
    /// A malformed message is parked `failed` with its reason, whatever `state` its key's
    /// turn would give it: redriven as `waiting`, it would be published as written.
    fn new(mut held: Held, state: &'static str, error: Option<String>) -> Self {
        match held.malformed.take() {
            Some(why) => Self {
                held,
                state: "failed",
                error: Some(why),
            },
            None => Self { held, state, error },
        }
    }
}

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

#[derive(Default)]
struct State {
    stream: Option<Stream>,
    /// Handed out and not completed, by handout number.
    inflight: HashMap<i64, Held>,
    /// Keys whose next messages wait (a retry, or messages behind one), in order.
    held: HashMap<String, VecDeque<Held>>,
    /// Keys that have rows in `outbox_parked`: their new messages are parked behind them.
    parked_keys: HashSet<String>,
    next_parked_poll: Option<Instant>,
    txns: VecDeque<Txn>,
    /// Index of `txns[0]`.
    txn_base: u64,
    /// Handout numbers (the `seq` the worker sees); never reused, across reconnections.
    next_handout: i64,
    /// The last stream order given (see [`Held::order`]).
    next_order: u64,
    confirmed: u64,
    /// The last claim's `on_failed`, for its outcomes.
    on_failed: OnFailed,
    /// The checkpoint waiting for the slot to pass it.
    mark: Option<Mark>,
    /// Messages of confirmed transactions since the last mark, and since the last maintenance:
    /// with none, maintenance sends no statement (an idle relay is silent).
    handled_since_mark: usize,
    handled_since_maintain: usize,
    /// `confirmed` at the last maintenance round that ran a statement.
    confirmed_at_maintain: u64,
    /// Set while a claim or a complete awaits the database with memory already changed: found
    /// set by the next call, that call was dropped mid-way (the relay's store deadline), and
    /// what it held is only in the WAL now: the stream is read again from the confirmed
    /// position.
    writing: bool,
    /// A transaction's Begin read from the stream that the synchronous-standby gate holds back:
    /// it and everything after it wait until a barrier covers it (see [`crate::cdc::sync`]).
    peek: Option<Item>,
    /// When a message was last published: a key held while others flow is parked after
    /// [`CdcStore::with_park_after`]; while nothing flows at all (every sink down) nothing is.
    last_published: Option<Instant>,
    /// The slot's read position (restart, confirmed) last written to `outbox_settings`.
    persisted: Option<(u64, u64)>,
    /// `confirmed` when the read position was last written by [`CdcStore::save_soon`], and
    /// when.
    saved_confirmed: u64,
    saved_at: Option<Instant>,
}

/// A point the polling positions may move to once the slot confirmed `lsn` (cdc_mark.sql).
#[derive(Debug, Clone)]
struct Mark {
    snapshot: String,
    floor: i64,
    /// A transaction id assigned after the floor was read (the checkpoint's `done_bound`).
    bound: String,
    lsn: u64,
    at: chrono::DateTime<chrono::Utc>,
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

    /// How many partitions hold a message written before the slot was created that the
    /// polling positions have not passed (cdc_before_slot.sql); `None` where the slot's start
    /// is not recorded (a setup older than the checkpoints: the catch-up cannot tell, and does
    /// not run, as before).
    async fn before_slot(&self) -> Result<Option<i64>> {
        before_slot(&self.pool, &self.names).await
    }

    /// The snapshot taken just after the slot was created (recorded by `outbox migrate --cdc`).
    async fn slot_start(&self) -> Result<Option<String>> {
        slot_start(&self.pool, &self.names).await
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

    /// Ends the catch-up once every message written before the slot was created is passed
    /// (asked at most every [`CATCH_UP_CHECK`]): hands back `member`'s partitions, so the
    /// checkpoints may move their positions behind the stream, and lets the stream start.
    /// Called only from a claim or a rebalance, which the worker makes between batches, so the
    /// last batch of the catch-up was completed by the polling engine that handed it out.
    async fn catch_up_done(&self, member: &MemberId) -> Result<bool> {
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
    /// statement) and at every round of a catch-up, and falls back to the polling engine: the table's messages are delivered
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

    async fn beat(&self) {
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

    /// Moves the polling positions to the last mark once the slot passed it, then takes the
    /// next mark: only when messages were handled since, so an idle relay sends nothing.
    async fn checkpoint(&self) -> Result<()> {
        let (apply, take) = {
            let s = self.state.lock().await;
            let apply = s.mark.clone().filter(|m| s.confirmed >= m.lsn);
            let free = s.mark.is_none() || apply.is_some();
            (apply, free && s.handled_since_mark > 0)
        };
        if let Some(m) = apply {
            match self.slot_start().await? {
                Some(start) => {
                    let moved: Vec<i16> =
                        sqlx::query_scalar(&self.names.schema.render(CHECKPOINT_SQL))
                            .bind(&m.snapshot)
                            .bind(m.floor)
                            .bind(m.at)
                            .bind(&start)
                            .bind(&m.bound)
                            .fetch_all(&self.pool)
                            .await
                            .map_err(|e| map_sqlx_error("recording a CDC checkpoint", e))?;
                    tracing::debug!(partitions = moved.len(), "CDC checkpoint recorded");
                }
                None => warn!(
                    slot = %self.names.slot,
                    "where the CDC slot starts is not recorded: run `outbox migrate --cdc` once \
                     more, so the polling positions (status, retention, fallback) follow the relay"
                ),
            }
            self.state.lock().await.mark = None;
        }
        if take {
            use sqlx::Row as _;
            let r = sqlx::query(&self.names.schema.render(MARK_SQL))
                .fetch_one(&self.pool)
                .await
                .map_err(|e| map_sqlx_error("marking a CDC checkpoint", e))?;
            let err = |e| map_sqlx_error("marking a CDC checkpoint", e);
            let lsn: String = r.try_get("lsn").map_err(err)?;
            let mark = Mark {
                snapshot: r.try_get("snapshot").map_err(err)?,
                floor: r.try_get("floor").map_err(err)?,
                bound: r.try_get("bound").map_err(err)?,
                lsn: parse_lsn(&lsn).ok_or_else(|| {
                    Error::new(
                        ErrorKind::Database,
                        format!("the server's WAL position `{lsn}` is not an LSN"),
                    )
                })?,
                at: chrono::Utc::now(),
            };
            let mut s = self.state.lock().await;
            s.mark = Some(mark);
            s.handled_since_mark = 0;
        }
        Ok(())
    }

    /// Starts the stream when there is none: every message not confirmed comes again from the
    /// server, so what was held or in flight from an earlier stream is dropped.
    async fn connect(&self, s: &mut State) -> Result<()> {
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

    async fn refresh_parked_keys(&self, s: &mut State) -> Result<()> {
        // Under block a failed row holds its key; under skip only rows still to publish do.
        // The table is read again while it holds any row, failed ones included: a redrive
        // turns one back to `retrying` from another process, under either policy.
        let rows: Vec<(Option<String>, i64)> = sqlx::query_as(
            &self
                .names
                .schema
                .render(include_str!("../../../queries/cdc_parked_keys.sql")),
        )
        .bind(s.on_failed == OnFailed::Block)
        .fetch_all(&self.pool)
        .await
        .map_err(|e| map_sqlx_error("reading the parked keys", e))?;
        let any = rows.first().is_some_and(|(_, n)| *n > 0);
        s.parked_keys = rows.into_iter().filter_map(|(k, _)| k).collect();
        s.next_parked_poll = any.then(|| Instant::now() + PARKED_POLL);
        Ok(())
    }

    /// Parks what the relay holds of keys whose head has waited longer than the park-after
    /// bound while other messages were published (a route's sink down beside busy ones): the
    /// head `retrying`, due when it was, the rest `waiting` behind it. Their transactions can
    /// then be confirmed and the slot's WAL released; the parked path publishes them once due.
    /// Nothing is parked while nothing is published at all (every sink down): the slot keeps the
    /// WAL then, as the design has it, bounded by the slot's limits.
    fn stuck_to_park(&self, s: &mut State, now: Instant) -> Vec<ToPark> {
        let flowing = s
            .last_published
            .is_some_and(|at| now.duration_since(at) < self.park_after);
        if !flowing {
            return Vec::new();
        }
        let stuck: Vec<String> = s
            .held
            .iter()
            .filter(|(_, q)| {
                q.front().is_some_and(|h| {
                    matches!(h.origin, Origin::Stream(_))
                        && h.malformed.is_none()
                        && now.duration_since(h.taken) >= self.park_after
                })
            })
            .map(|(k, _)| k.clone())
            .collect();
        let mut out = Vec::new();
        for key in stuck {
            let Some(queue) = s.held.remove(&key) else {
                continue;
            };
            s.parked_keys.insert(key.clone());
            let mut first = true;
            for h in queue {
                if matches!(h.origin, Origin::Parked { .. }) {
                    continue; // durable already
                }
                let state = if first { "retrying" } else { "waiting" };
                first = false;
                out.push(ToPark::new(h, state, None));
            }
            warn!(key = %key, "a key held back for over {:?} while other keys flow (its sink down?) is parked, so the slot's WAL is released; it is published from outbox_parked once its sink is back", self.park_after);
        }
        out
    }

    /// Writes `rows` into `outbox_parked` in stream order, once each (by id). Returns where
    /// each came from, to resolve once the write committed.
    async fn park(&self, rows: Vec<ToPark>) -> Result<Vec<Origin>> {
        park_rows(&self.pool, &self.names, rows).await
    }

    /// Marks the transaction of `origin` one message closer to confirmable.
    fn resolve(s: &mut State, origin: Origin) {
        if let Origin::Stream(t) = origin {
            if let Some(txn) = t
                .checked_sub(s.txn_base)
                .and_then(|i| s.txns.get_mut(i as usize))
            {
                txn.open = txn.open.saturating_sub(1);
            }
        }
    }

    /// Confirms the commit end of every leading transaction that is fully handled.
    fn advance(s: &mut State) {
        let mut to = None;
        while let Some(t) = s.txns.front() {
            match t.end {
                Some(end) if t.open == 0 => {
                    to = Some(end);
                    s.handled_since_mark += t.messages;
                    s.handled_since_maintain += t.messages;
                    s.txns.pop_front();
                    s.txn_base += 1;
                }
                _ => break,
            }
        }
        if let Some(end) = to {
            Self::confirm(s, end);
        }
    }

    fn confirm(s: &mut State, lsn: u64) {
        if lsn > s.confirmed {
            s.confirmed = lsn;
            if let Some(stream) = &s.stream {
                stream.confirm.send_replace(lsn);
            }
        }
    }

    /// A message read from the stream, counted in its (current) transaction and given its
    /// stream order.
    fn accept(s: &mut State, message: Message, now: Instant) -> Held {
        let txn = s.txn_base + s.txns.len() as u64 - 1;
        if let Some(t) = s.txns.back_mut() {
            t.open += 1;
            t.messages += 1;
        }
        s.next_order += 1;
        // A row of the table carries its seq; a logical message has none (0).
        let row_seq = (message.seq > 0).then_some(message.seq);
        Held {
            message,
            origin: Origin::Stream(txn),
            due: now,
            taken: now,
            order: s.next_order,
            malformed: None,
            row_seq,
        }
    }

    /// Everything handed out and not completed.
    fn drain_inflight(s: &mut State) -> Vec<Held> {
        s.inflight.drain().map(|(_, h)| h).collect()
    }

    /// Puts `back` at the front of their keys' queues, each key in stream order.
    fn requeue(s: &mut State, mut back: Vec<Held>) {
        back.sort_by_key(|h| h.order);
        for h in back.into_iter().rev() {
            s.held
                .entry(h.message.aggregate_id.clone())
                .or_default()
                .push_front(h);
        }
    }

    fn hand_out(s: &mut State, mut held: Held, out: &mut Vec<Message>) {
        s.next_handout += 1;
        let n = s.next_handout;
        let mut m = held.message.clone();
        m.seq = n;
        held.message.seq = n;
        s.inflight.insert(n, held);
        out.push(m);
    }

    /// Whether a message of `key` is handed out and not completed. A scan of what is in flight
    /// (a batch at most): only a malformed message asks, and those are rare.
    fn in_flight(s: &State, key: &str) -> bool {
        s.inflight.values().any(|h| h.message.aggregate_id == key)
    }

    /// Parks `to_park` (nothing to do when empty) and resolves them. On an error `writing`
    /// stays set: those messages are in the WAL only now, and the next call reads it again
    /// from the confirmed position rather than wait for them.
    async fn park_now(&self, s: &mut State, to_park: Vec<ToPark>) -> Result<()> {
        if to_park.is_empty() {
            return Ok(());
        }
        s.writing = true;
        let origins = self.park(to_park).await?;
        s.writing = false;
        for o in origins {
            Self::resolve(s, o);
        }
        s.next_parked_poll
            .get_or_insert(Instant::now() + PARKED_POLL);
        Self::advance(s);
        Ok(())
    }

    /// Redriven parked rows of keys the store does not hold, in key order.
    async fn parked_due(&self, s: &mut State, room: usize) -> Result<Vec<Held>> {
        // Keys the relay holds (in flight, or waiting for a retry) are left out in SQL, so
        // they cannot fill the batch and starve the others.
        let busy: Vec<String> = s
            .inflight
            .values()
            .map(|h| h.message.aggregate_id.clone())
            .chain(s.held.keys().cloned())
            .collect::<HashSet<String>>()
            .into_iter()
            .collect();
        let rows: Vec<ParkedRow> = sqlx::query_as(&self.names.schema.render(PARKED_READ_SQL))
            .bind(i64::try_from(room).unwrap_or(i64::MAX))
            .bind(s.on_failed == OnFailed::Block)
            .bind(&busy)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| map_sqlx_error("reading redriven parked messages", e))?;
        let now = Instant::now();
        Ok(rows
            .into_iter()
            .map(|r| Held {
                origin: Origin::Parked {
                    partition: r.partition,
                    seq: r.seq,
                },
                message: Message {
                    seq: 0,
                    id: r.id,
                    aggregate_type: r.aggregate_type,
                    aggregate_id: r.aggregate_id,
                    event_type: r.event_type,
                    payload: Bytes::from(r.payload),
                    headers: r.headers,
                    topic: r.topic,
                    created_at: r.created_at,
                    attempts: r.attempts,
                },
                due: now,
                taken: now,
                order: 0,
                malformed: None,
                row_seq: None,
            })
            .collect())
    }
}

#[derive(sqlx::FromRow)]
struct ParkedRow {
    partition: i16,
    seq: i64,
    id: uuid::Uuid,
    aggregate_type: String,
    aggregate_id: String,
    event_type: String,
    payload: String,
    headers: String,
    topic: Option<String>,
    created_at: chrono::DateTime<chrono::Utc>,
    attempts: i32,
}

/// Writes `rows` into `outbox_parked` in stream order, once each (by id). Returns where each
/// came from, to resolve once the write committed.
async fn park_rows(pool: &PgPool, names: &CdcNames, mut rows: Vec<ToPark>) -> Result<Vec<Origin>> {
    if rows.is_empty() {
        return Ok(Vec::new());
    }
    // A key's failure first, then what waits behind it.
    rows.sort_by_key(|r| r.held.order);
    let origins = rows.iter().map(|r| r.held.origin).collect();
    let mut cols = ParkColumns::with_capacity(rows.len());
    for r in rows {
        cols.push(r);
    }
    sqlx::query(&names.schema.render(PARK_SQL))
        .bind(&cols.keys)
        .bind(&cols.ids)
        .bind(&cols.types)
        .bind(&cols.events)
        .bind(&cols.payloads)
        .bind(&cols.headers)
        .bind(&cols.topics)
        .bind(&cols.created)
        .bind(&cols.states)
        .bind(&cols.attempts)
        .bind(&cols.errors)
        .bind(&cols.seqs)
        .bind(&cols.next_attempts)
        .execute(pool)
        .await
        .map_err(|e| map_sqlx_error("parking messages the CDC relay could not publish", e))?;
    Ok(origins)
}

/// How many partitions hold a message written before the slot was created that the polling
/// positions have not passed (cdc_before_slot.sql); `None` where the slot's start is not
/// recorded.
async fn before_slot(pool: &PgPool, names: &CdcNames) -> Result<Option<i64>> {
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
async fn slot_start(pool: &PgPool, names: &CdcNames) -> Result<Option<String>> {
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

/// `outbox_parked` rows as the arrays of one `INSERT … SELECT FROM unnest(…)`.
struct ParkColumns {
    keys: Vec<String>,
    ids: Vec<uuid::Uuid>,
    types: Vec<String>,
    events: Vec<String>,
    payloads: Vec<String>,
    headers: Vec<String>,
    topics: Vec<Option<String>>,
    created: Vec<chrono::DateTime<chrono::Utc>>,
    states: Vec<&'static str>,
    attempts: Vec<i32>,
    errors: Vec<Option<String>>,
    seqs: Vec<Option<i64>>,
    next_attempts: Vec<Option<chrono::DateTime<chrono::Utc>>>,
    /// Keys with a logical message in the batch so far.
    after_emit: HashSet<String>,
}

impl ParkColumns {
    fn with_capacity(n: usize) -> Self {
        Self {
            keys: Vec::with_capacity(n),
            ids: Vec::with_capacity(n),
            types: Vec::with_capacity(n),
            events: Vec::with_capacity(n),
            payloads: Vec::with_capacity(n),
            headers: Vec::with_capacity(n),
            topics: Vec::with_capacity(n),
            created: Vec::with_capacity(n),
            states: Vec::with_capacity(n),
            attempts: Vec::with_capacity(n),
            errors: Vec::with_capacity(n),
            seqs: Vec::with_capacity(n),
            next_attempts: Vec::with_capacity(n),
            after_emit: HashSet::new(),
        }
    }

    fn push(&mut self, r: ToPark) {
        // A row keeps its seq unless a logical message of its key is parked before it in this
        // batch: that one draws a fresh seq, and the row must sort after it.
        let key = &r.held.message.aggregate_id;
        let seq = match r.held.row_seq {
            Some(seq) if !self.after_emit.contains(key) => Some(seq),
            Some(_) => None,
            None => {
                self.after_emit.insert(key.clone());
                None
            }
        };
        self.seqs.push(seq);
        self.next_attempts
            .push((r.state == "retrying").then(|| wall(r.held.due)));
        let m = r.held.message;
        // A malformed message keeps what it carried: JSON as it is, anything else as a JSON
        // string, so the row can be stored and read.
        let json = |b: &[u8]| match serde_json::from_slice::<serde_json::Value>(b) {
            Ok(v) => v.to_string(),
            Err(_) => {
                serde_json::Value::String(String::from_utf8_lossy(b).into_owned()).to_string()
            }
        };
        self.keys.push(m.aggregate_id);
        self.ids.push(m.id);
        self.types.push(m.aggregate_type);
        self.events.push(m.event_type);
        self.payloads.push(json(&m.payload));
        self.headers.push(json(m.headers.as_bytes()));
        self.topics.push(m.topic);
        self.created.push(m.created_at);
        self.states.push(r.state);
        self.attempts.push(m.attempts);
        self.errors.push(r.error);
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
        let mut s = self.state.lock().await;
        s.on_failed = on_failed;
        if std::mem::take(&mut s.writing) {
            s.stream = None;
        }
        // Handed out by a claim whose answer never reached the worker (it failed after handing
        // out, or was dropped): back to their keys' queues, in order, before anything new.
        let leftover = Self::drain_inflight(&mut s);
        Self::requeue(&mut s, leftover);
        self.connect(&mut s).await?;
        let mut out = Vec::new();
        let mut bytes = 0usize;
        let fits = |bytes: usize, m: &Message, n: usize| {
            n == 0 || (n < limits.rows && bytes.saturating_add(m.payload.len()) <= limits.bytes)
        };
        // Due heads of held keys first: they are older than anything the stream still has.
        let now = Instant::now();
        // Oldest head first: the batch stays in stream (commit) order across keys too.
        let mut due: Vec<(u64, String)> = s
            .held
            .iter()
            .filter_map(|(k, q)| {
                q.front()
                    .filter(|h| h.due <= now)
                    .map(|h| (h.order, k.clone()))
            })
            .collect();
        due.sort_unstable();
        let due: Vec<String> = due.into_iter().map(|(_, k)| k).collect();
        let mut to_park = Vec::new();
        for key in due {
            // The key's due prefix, in order: the worker sends a key's messages one after the
            // other and leaves those behind a failure without an outcome.
            // A malformed head waits until nothing of its key is in flight (the message before
            // it may still fail, and must be parked first).
            while let Some(h) = s.held.get(&key).and_then(|q| q.front()) {
                let ready = if h.malformed.is_some() {
                    !Self::in_flight(&s, &key)
                } else {
                    h.due <= now && fits(bytes, &h.message, out.len())
                };
                if !ready {
                    break;
                }
                let Some(q) = s.held.get_mut(&key) else { break };
                let Some(h) = q.pop_front() else { break };
                if q.is_empty() {
                    s.held.remove(&key);
                }
                if h.malformed.is_some() {
                    // Its key's earlier messages are done: its turn to be parked as failed,
                    // and under block, what the relay holds of the key behind it.
                    to_park.push(ToPark::new(h, "failed", None));
                    if on_failed == OnFailed::Block {
                        s.parked_keys.insert(key.clone());
                        for behind in s.held.remove(&key).into_iter().flatten() {
                            to_park.push(ToPark::new(behind, "waiting", None));
                        }
                    }
                    continue;
                }
                bytes += h.message.payload.len();
                Self::hand_out(&mut s, h, &mut out);
            }
        }
        to_park.extend(self.stuck_to_park(&mut s, now));
        // Written before the parked rows are read again below, which resets the parked keys
        // from the table.
        self.park_now(&mut s, std::mem::take(&mut to_park)).await?;
        // Redriven parked rows, only while `outbox_parked` has rows.
        if s.next_parked_poll.is_some_and(|t| t <= now) && out.len() < limits.rows {
            let room = limits.rows - out.len();
            s.writing = true;
            let rows = self.parked_due(&mut s, room).await?;
            for h in rows {
                if !fits(bytes, &h.message, out.len()) {
                    break;
                }
                bytes += h.message.payload.len();
                Self::hand_out(&mut s, h, &mut out);
            }
            self.refresh_parked_keys(&mut s).await?;
            s.writing = false;
        }
        // Then the stream, unless the relay already holds as much as it may: a key waiting for
        // a retry keeps its later messages here, and so does a lane whose sink is down; past
        // the bound the relay stops reading and the server waits (memory stays bounded, the
        // slot keeps the WAL).
        let (held_n, held_bytes) = s
            .held
            .values()
            .flatten()
            .fold((0usize, 0usize), |(n, b), h| {
                (n + 1, b.saturating_add(h.message.payload.len()))
            });
        let full = held_n >= MAX_HELD || held_bytes >= limits.bytes.saturating_mul(4);
        let mut ended = None;
        // Messages read from the stream by this claim, handed out or not: a claim never takes
        // more than a batch from the stream, so what waits in memory stays bounded.
        let mut taken = 0usize;
        let mut gated = false;
        while !full && out.len() < limits.rows && taken < limits.rows {
            let item = match s.peek.take() {
                Some(item) => item,
                None => {
                    let Some(stream) = s.stream.as_mut() else {
                        break;
                    };
                    match stream.items.try_recv() {
                        Ok(b) => b.item,
                        Err(_) => break,
                    }
                }
            };
            match item {
                // A transaction the synchronous standby may not have yet waits, with all after
                // it, until a barrier covers it (crate::cdc::sync): never published for a
                // commit a failover could undo.
                Item::Begin {
                    commit_time,
                    final_lsn,
                } if !self.gate.passes(final_lsn) => {
                    s.peek = Some(Item::Begin {
                        commit_time,
                        final_lsn,
                    });
                    gated = true;
                    break;
                }
                Item::Begin { commit_time, .. } => s.txns.push_back(Txn {
                    end: None,
                    open: 0,
                    messages: 0,
                    committed_at: commit_time,
                }),
                Item::Commit { end_lsn } => {
                    if let Some(t) = s.txns.back_mut() {
                        t.end = Some(end_lsn);
                    }
                    Self::advance(&mut s);
                }
                Item::Idle { wal_end } => {
                    if s.txns.is_empty() {
                        Self::confirm(&mut s, wal_end);
                    }
                }
                Item::Ended(e) => {
                    ended = Some(e);
                    break;
                }
                Item::Message(m) | Item::Malformed(m, _)
                    if s.txns.back().is_none_or(|t| t.end.is_some()) =>
                {
                    // The stream promises Begin first; a message outside one is a protocol
                    // error, handled as a broken stream (it comes again).
                    let _ = m;
                    ended = Some(Error::new(
                        ErrorKind::Other,
                        "CDC stream: a message outside a transaction; will reconnect",
                    ));
                    break;
                }
                Item::Message(m) => {
                    taken += 1;
                    let held = Self::accept(&mut s, *m, now);
                    let key = held.message.aggregate_id.clone();
                    if s.parked_keys.contains(&key) {
                        to_park.push(ToPark::new(held, "waiting", None));
                    } else if let Some(q) = s.held.get_mut(&key) {
                        q.push_back(held);
                    } else if fits(bytes, &held.message, out.len()) {
                        bytes += held.message.payload.len();
                        Self::hand_out(&mut s, held, &mut out);
                    } else {
                        s.held.entry(key).or_default().push_back(held);
                        break;
                    }
                }
                Item::Malformed(m, why) => {
                    taken += 1;
                    warn!(id = %m.id, aggregate_id = %m.aggregate_id, error = %why, "a CDC message cannot be published as written; parked as failed behind its key's earlier messages");
                    let mut held = Self::accept(&mut s, *m, now);
                    held.malformed = Some(why);
                    let key = held.message.aggregate_id.clone();
                    let earlier_held = s.held.contains_key(&key) || Self::in_flight(&s, &key);
                    if earlier_held && !s.parked_keys.contains(&key) {
                        // Earlier messages of its key are in flight or waiting for a retry:
                        // parked now, it would be redriven ahead of them.
                        s.held.entry(key).or_default().push_back(held);
                    } else {
                        if on_failed == OnFailed::Block {
                            s.parked_keys.insert(key);
                        }
                        to_park.push(ToPark::new(held, "failed", None));
                    }
                }
            }
        }
        self.park_now(&mut s, to_park).await?;
        if let Some(e) = ended {
            warn!(error = %e, "CDC stream ended; reconnecting from the confirmed position");
            s.stream = None;
            if out.is_empty() {
                return Err(e);
            }
        }
        self.save_soon(&mut s);
        let more = !gated && s.stream.as_ref().is_some_and(|st| !st.items.is_empty());
        self.more.store(more, Ordering::Relaxed);
        Ok(out)
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
        let mut s = self.state.lock().await;
        if std::mem::take(&mut s.writing) {
            // The last call was dropped mid-way: the stream is read again, and these outcomes
            // are of messages that come again (see `State::writing`).
            s.stream = None;
            return Ok(0);
        }
        let on_failed = s.on_failed;
        let now = Instant::now();
        let mut changed = 0u64;
        let mut done_parked: (Vec<i16>, Vec<i64>) = (Vec::new(), Vec::new());
        let mut failed_parked: (Vec<i16>, Vec<i64>, Vec<String>, Vec<i32>) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let mut to_park = Vec::new();
        let mut back = Vec::new();
        // Keys a failure blocked in this batch: everything of theirs the relay still holds is
        // parked behind the failure, so nothing of the key overtakes it.
        let mut blocked: Vec<String> = Vec::new();
        for o in outcomes {
            let Some(mut h) = s.inflight.remove(&o.seq()) else {
                continue; // handed out by an earlier stream, or recorded already
            };
            changed += 1;
            if matches!(o, Outcome::Published { .. }) {
                s.last_published = Some(now);
            }
            match o {
                Outcome::Published { .. } => match h.origin {
                    Origin::Stream(_) => Self::resolve(&mut s, h.origin),
                    Origin::Parked { partition, seq } => {
                        done_parked.0.push(partition);
                        done_parked.1.push(seq);
                    }
                },
                Outcome::Retry { delay, .. } | Outcome::Deferred { delay, .. } => {
                    if matches!(o, Outcome::Retry { .. }) {
                        h.message.attempts += 1;
                    }
                    h.due = now + *delay;
                    back.push(h);
                }
                Outcome::Failed { error, .. } => {
                    h.message.attempts += 1;
                    if on_failed == OnFailed::Block {
                        s.parked_keys.insert(h.message.aggregate_id.clone());
                        blocked.push(h.message.aggregate_id.clone());
                    }
                    match h.origin {
                        Origin::Stream(_) => {
                            to_park.push(ToPark::new(h, "failed", Some(error.clone())))
                        }
                        Origin::Parked { partition, seq } => {
                            failed_parked.0.push(partition);
                            failed_parked.1.push(seq);
                            failed_parked.2.push(error.clone());
                            failed_parked.3.push(h.message.attempts);
                        }
                    }
                }
            }
        }
        // Handed out without an outcome (behind a failure of their key, or not tried): they go
        // back to their key's queue, in order, due now.
        back.extend(Self::drain_inflight(&mut s));
        // A key a failure blocked: what the relay holds of it from the stream is parked behind
        // the failure; its parked rows are in the table already, behind it, and come back
        // after the next redrive.
        for key in &blocked {
            back.extend(s.held.remove(key).into_iter().flatten());
        }
        let mut requeued = Vec::with_capacity(back.len());
        for h in back {
            let key = &h.message.aggregate_id;
            match h.origin {
                Origin::Stream(_) if s.parked_keys.contains(key) => {
                    to_park.push(ToPark::new(h, "waiting", None))
                }
                Origin::Parked { .. } if blocked.contains(key) => {}
                _ => requeued.push(h),
            }
        }
        Self::requeue(&mut s, requeued);
        // On an error `writing` stays set: what was to be parked is in the WAL only, and a
        // parked row published or failed again keeps its old state (it is published again,
        // never lost); the next call reads the stream again from the confirmed position.
        s.writing = true;
        let written = async {
            let origins = self.park(to_park).await?;
            if !done_parked.0.is_empty() {
                sqlx::query(&self.names.schema.render(PARKED_DONE_SQL))
                    .bind(&done_parked.0)
                    .bind(&done_parked.1)
                    .execute(&self.pool)
                    .await
                    .map_err(|e| map_sqlx_error("deleting published parked messages", e))?;
            }
            if !failed_parked.0.is_empty() {
                sqlx::query(&self.names.schema.render(PARKED_FAIL_SQL))
                    .bind(&failed_parked.0)
                    .bind(&failed_parked.1)
                    .bind(&failed_parked.2)
                    .bind(&failed_parked.3)
                    .execute(&self.pool)
                    .await
                    .map_err(|e| map_sqlx_error("marking parked messages failed", e))?;
            }
            Ok::<_, Error>(origins)
        }
        .await?;
        s.writing = false;
        // The parked table holds rows now (a failure under skip holds no key, and a redrive
        // from another process must still be read): it is looked at while it does.
        let parked_any = !written.is_empty() || !failed_parked.0.is_empty();
        for o in written {
            Self::resolve(&mut s, o);
        }
        if parked_any || !s.parked_keys.is_empty() {
            s.next_parked_poll.get_or_insert(now + PARKED_POLL);
        }
        Self::advance(&mut s);
        self.save_soon(&mut s);
        Ok(changed)
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
