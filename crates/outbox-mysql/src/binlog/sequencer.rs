//! The binlog route's sequencer: it reads committed outbox rows from the binlog, in commit
//! order, and gives each its partition (the key's hash, as the trigger computed it) and the
//! next position there, into `outbox_sequence`. The polling engine then relays by those
//! positions exactly as it does by the trigger's, while writers run no trigger and lock nothing.
//!
//! Guarantees (docs/engine-mysql.md, "The binlog route"):
//!
//! - **Commit order, gapless.** Positions are handed out in binlog order, which is commit order,
//!   by one sequencer at a time; each batch's positions and the binlog position it read through
//!   are written in one transaction, so after a crash the sequencer resumes exactly where its
//!   last batch ended: no row gets two positions, none is skipped.
//! - **One sequencer.** The lease row (`outbox_sequencer`) names the owner and an epoch bumped at
//!   each new owner; every write checks both, so a sequencer that lost its lease (frozen, cut
//!   off) writes nothing more.
//! - **Nothing the binlog lacks is lost.** A seal raises `sequenced_below`: it reads
//!   `AUTO_INCREMENT` (S), waits for the transactions that were writing then to end, reads where
//!   the binlog ends (P), and once the sequencer passed P counts the rows below S in the table
//!   and in `outbox_sequence`. A row the binlog did not carry (written with `sql_log_bin = 0`,
//!   or logged as a statement) is sequenced from the table then, late but not lost.
//! - **The first start** reads the binlog from where `outbox migrate --binlog` saw it end just
//!   before the trigger went: every row written since comes from the stream, in commit order;
//!   the rows the trigger positioned keep their positions (copied once the writers that could
//!   still hold one have ended), and the stream skips them.
//! - **A purged binlog**: the rows from `sequenced_below` up are taken from the table (P read
//!   first, then S, then the writers of that moment waited for), in seq order, positions the
//!   trigger gave kept; the stream then starts at P, and rows it carries that the table gave
//!   already are skipped.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::FutureExt as _;
use outbox_core::{Error, ErrorKind, Result};
use sqlx::{MySql, MySqlPool, QueryBuilder, Row as _};
use tokio::sync::watch;
use tracing::{info, warn};

use super::reader::{BinlogReader, Item, ReadError, ReadOptions};
use super::{server, BinlogPosition};
use crate::error::map_sqlx_error;
use crate::schema::Schema;

/// How long a sequencer's lease lasts without a write; renewed every [`TICK`] × 10.
const LEASE: Duration = Duration::from_secs(10);

/// How often the sequencer looks at its lease and its seal between binlog events.
const TICK: Duration = Duration::from_millis(100);

/// Rows sequenced in one transaction at most.
const BATCH: usize = 5_000;

/// Rows per `INSERT` statement (three values each, under the protocol's 65,535).
const ROWS_PER_STATEMENT: usize = 4_000;

/// How often a seal is taken while rows are sequenced; with none, every [`SEAL_IDLE`].
const SEAL_EVERY: Duration = Duration::from_secs(1);
const SEAL_IDLE: Duration = Duration::from_secs(10);

/// How long [`Sequencer::stop`] waits for the task to reach a safe point.
const STOP_WAIT: Duration = Duration::from_secs(5);

/// How long an idle sequencer leaves its binlog position unwritten.
const SAVE_IDLE: Duration = Duration::from_secs(5);

/// A writer still open this long after a seal began is named in a warning (once per seal).
const LONG_WRITER: Duration = Duration::from_secs(30);

/// The partition of a key: `CRC32(key) % 64`, as the trigger and the writer compute it.
pub fn partition(key: &str) -> i16 {
    (crc32fast::hash(key.as_bytes()) % crate::PARTITIONS as u32) as i16
}

/// What the sequencer has done, as its store sees it.
#[derive(Debug, Clone, Default)]
pub struct Progress {
    /// Every outbox row the binlog carried before this position has its position.
    pub through: Option<BinlogPosition>,
    /// Every row with a lower `seq` has its position or was rolled back.
    pub sequenced_below: i64,
    /// Rows this process sequenced from the binlog.
    pub sequenced: u64,
    /// Rows this process sequenced from the table: after a purge, at the switch, or because
    /// the binlog did not carry them.
    pub from_table: u64,
    /// Whether this process holds the lease.
    pub leading: bool,
    /// The last error, until the next batch goes through.
    pub error: Option<String>,
}

struct Inner {
    pool: MySqlPool,
    schema: Schema,
    url: String,
    owner: String,
    progress: watch::Sender<Progress>,
    /// Set to stop: the task ends at its next safe point (never inside a transaction).
    stop: watch::Sender<bool>,
}

impl Inner {
    fn stopping(&self) -> bool {
        *self.stop.borrow()
    }

    fn stopped(&self) -> Error {
        Error::new(ErrorKind::Other, "the binlog sequencer was stopped")
    }
}

/// A sequencer for one outbox, started by its store when it relays (see the module docs).
pub struct Sequencer {
    inner: Arc<Inner>,
    task: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl std::fmt::Debug for Sequencer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sequencer")
            .field("schema", &self.inner.schema)
            .field("owner", &self.inner.owner)
            .finish_non_exhaustive()
    }
}

impl Sequencer {
    /// A sequencer (not started) for `schema`'s outbox, reading the binlog through `url`.
    pub fn new(pool: MySqlPool, schema: Schema, url: &str) -> Result<Self> {
        if !url.contains("://") {
            return Err(Error::config(format!(
                "database URL `{}` is not a MySQL URL",
                outbox_core::redact::url(url)
            )));
        }
        Ok(Self {
            inner: Arc::new(Inner {
                pool,
                schema,
                url: url.to_string(),
                owner: format!("sequencer-{:016x}", fastrand::u64(..)),
                progress: watch::channel(Progress::default()).0,
                stop: watch::channel(false).0,
            }),
            task: std::sync::Mutex::new(None),
        })
    }

    /// Starts it, unless it runs already. It takes the lease as soon as no other holds it.
    pub fn start(&self) {
        let mut task = self.task.lock().unwrap_or_else(|e| e.into_inner());
        if task.as_ref().is_some_and(|t| !t.is_finished()) {
            return;
        }
        self.inner.stop.send_replace(false);
        let inner = self.inner.clone();
        *task = Some(tokio::spawn(async move { run(inner).await }));
    }

    /// Stops it (between transactions: a batch in hand is saved or not, never half) and gives
    /// its lease up, so another relay's sequencer takes over at once.
    pub async fn stop(&self) {
        self.inner.stop.send_replace(true);
        let task = self.task.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(mut task) = task {
            if tokio::time::timeout(STOP_WAIT, &mut task).await.is_err() {
                // Stuck on the database: its transaction, if any, ends with its connection.
                task.abort();
                let _ = task.await;
            }
        }
        let _ = sqlx::query(
            &self
                .inner
                .schema
                .render(include_str!("../../queries/sequencer_release.sql")),
        )
        .bind(&self.inner.owner)
        .execute(&self.inner.pool)
        .await;
        self.inner.progress.send_modify(|p| p.leading = false);
    }

    /// What it has done; changes after every batch.
    pub fn progress(&self) -> watch::Receiver<Progress> {
        self.inner.progress.subscribe()
    }

    /// Waits until every outbox row committed before now has its position: the binlog's end now
    /// is passed by this sequencer, or by whichever holds the lease (read from its row), within
    /// `limit`.
    pub async fn wait_until_sequenced(&self, limit: Duration) -> Result<()> {
        let end = server::end_position(&self.inner.pool).await?;
        let until = Instant::now() + limit;
        let mut progress = self.progress();
        loop {
            if progress
                .borrow()
                .through
                .as_ref()
                .is_some_and(|t| *t >= end)
            {
                return Ok(());
            }
            if let Some(saved) = saved_position(&self.inner).await? {
                if saved >= end {
                    return Ok(());
                }
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                let error = progress.borrow().error.clone();
                return Err(Error::new(
                    ErrorKind::Timeout,
                    format!(
                        "the outbox's binlog sequencer did not pass {end} within {limit:?}{}; is \
                         a relay running on this outbox?",
                        error
                            .map(|e| format!(" (its last error: {e})"))
                            .unwrap_or_default()
                    ),
                ));
            }
            let _ = tokio::time::timeout(left.min(Duration::from_millis(200)), progress.changed())
                .await;
        }
    }
}

impl Sequencer {
    /// Waits until the row `seq` has its position, within `limit`.
    pub async fn wait_until_positioned(&self, seq: i64, limit: Duration) -> Result<()> {
        let until = Instant::now() + limit;
        let mut progress = self.progress();
        let sql = self
            .inner
            .schema
            .render(include_str!("../../queries/sequence_exists.sql"));
        loop {
            let there: bool = sqlx::query_scalar(&sql)
                .bind(seq)
                .fetch_one(&self.inner.pool)
                .await
                .map_err(|e| map_sqlx_error("looking for a row's position", e))?;
            if there {
                return Ok(());
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                let error = progress.borrow().error.clone();
                return Err(Error::new(
                    ErrorKind::Timeout,
                    format!(
                        "the outbox's binlog sequencer did not position row {seq} within \
                         {limit:?}{}; is a relay running on this outbox?",
                        error
                            .map(|e| format!(" (its last error: {e})"))
                            .unwrap_or_default()
                    ),
                ));
            }
            let _ = tokio::time::timeout(left.min(Duration::from_millis(100)), progress.changed())
                .await;
        }
    }
}

impl Drop for Sequencer {
    /// The task ends at its next safe point; its lease runs out (another takes over then).
    fn drop(&mut self) {
        self.inner.stop.send_replace(true);
    }
}

async fn saved_position(inner: &Inner) -> Result<Option<BinlogPosition>> {
    let row: Option<(Option<String>, Option<i64>)> = sqlx::query_as(
        &inner
            .schema
            .render(include_str!("../../queries/sequencer_read_position.sql")),
    )
    .fetch_optional(&inner.pool)
    .await
    .map_err(|e| map_sqlx_error("reading the sequencer's position", e))?;
    Ok(match row {
        Some((Some(file), Some(offset))) => Some(BinlogPosition::new(
            file,
            u64::try_from(offset).unwrap_or(0),
        )),
        _ => None,
    })
}

/// Leads whenever it can, until stopped: an error is reported, waited out and retried.
async fn run(inner: Arc<Inner>) {
    let mut backoff = Duration::from_millis(200);
    let mut stop = inner.stop.subscribe();
    loop {
        let error = match lead(&inner).await {
            Ok(()) => return,
            Err(_) if inner.stopping() => return,
            Err(e) => e,
        };
        inner.progress.send_modify(|p| {
            p.leading = false;
            p.error = Some(error.to_string());
        });
        warn!(error = %error, "the outbox's binlog sequencer stopped; it takes its lease again (once free) and goes on from its last saved position");
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = stop_asked(&mut stop) => return,
        }
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

/// Returns once a stop is asked for (or the sequencer is gone).
async fn stop_asked(stop: &mut watch::Receiver<bool>) {
    loop {
        let asked = *stop.borrow_and_update();
        if asked || stop.changed().await.is_err() {
            return;
        }
    }
}

/// Takes the lease (waiting while another sequencer holds it), then sequences until an error.
async fn lead(inner: &Arc<Inner>) -> Result<()> {
    // Checked at every start, not only at the switch: a server set otherwise since (a DBA
    // shrinking the binlog, a restart with another configuration) would make rows reach the
    // sequencer late or never; refused here with what to set, rather than relayed out of order.
    server::settings(&inner.pool)
        .await?
        .check()
        .map_err(|why| {
            Error::config(format!(
                "the binlog sequencer cannot read this server: {why}"
            ))
        })?;
    // A relay upgraded in place before `outbox migrate` ran: the sequencer's table gains the
    // columns this version saves (the relay's documented grants include ALTER), so the route
    // keeps flowing instead of failing on a column it lacks. Idempotent and cheap when done.
    super::route::upgrade(&inner.pool, &inner.schema).await?;
    let epoch = acquire(inner).await?;
    let mut s = Session::start(inner, epoch).await?;
    let options = ReadOptions::default();
    let mut resumed = None;
    let from = match s.position.clone() {
        // The position was read on another server (a failover, a restore): it means nothing
        // here. MariaDB: the GTID state saved with it finds the same place in this server's
        // binlog (a promoted replica holds the primary's transactions under their GTIDs, in
        // commit order); without one, or when this server lacks it, it is made good as a
        // purged binlog is.
        Some(p) if s.identity_changed() => match s.resume_by_gtid(&options).await? {
            Some(reader) => {
                resumed = Some(reader);
                p
            }
            None => {
                warn!(position = %p, saved = s.saved_identity.as_deref().unwrap_or(""), now = %s.identity, "the binlog position the sequencer saved was read on another server (a failover or a restore) and no GTID state was saved with it: the rows since its last seal are taken from the table (in seq order), then this server's binlog is read from its end");
                s.take_from_table("another server").await?
            }
        },
        Some(p) => {
            if !s.trigger_rows_taken {
                s.take_trigger_rows().await?;
            }
            p
        }
        // Not recorded by `migrate --binlog` (an outbox switched by an older one): every row
        // not passed comes from the table, in seq order.
        None => s.take_from_table("its first start").await?,
    };
    let mut reader = match resumed {
        Some(r) => r,
        None => open_or_recover(inner, &mut s, &from, &options).await?,
    };
    info!(schema = inner.schema.as_str(), from = %reader.position(), epoch, "the outbox's binlog sequencer is reading");
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut stop = inner.stop.subscribe();
    loop {
        tokio::select! {
            _ = stop_asked(&mut stop) => return Ok(()),
            item = reader.next() => {
                let mut rows = Vec::new();
                let mut end = None;
                let mut failed = None;
                match item {
                    Ok(item) => s.take(item, &mut rows, &mut end),
                    // The server says so at the first read: nothing was taken from it yet.
                    Err(ReadError::Purged { position, message }) => {
                        let from = recover(&mut s, &position, &message).await?;
                        reader = open_or_recover(inner, &mut s, &from, &options).await?;
                        continue;
                    }
                    Err(e) => return Err(read_error(e)),
                }
                // What else is ready, up to a batch: one transaction for all of it.
                while rows.len() < BATCH {
                    match reader.next().now_or_never() {
                        Some(Ok(item)) => s.take(item, &mut rows, &mut end),
                        Some(Err(e)) => {
                            failed = Some(e);
                            break;
                        }
                        None => break,
                    }
                }
                if let Some(end) = end {
                    s.holding = reader.holding();
                    // The reader's GTID state is `end`'s, or later only by transactions
                    // without outbox rows (one with rows would have been handed back): resuming
                    // after them skips nothing of ours.
                    s.gtid = reader.gtid_state();
                    s.save(rows, end).await?;
                }
                if let Some(e) = failed {
                    return Err(read_error(e));
                }
            }
            _ = tick.tick() => s.tick().await?,
        }
    }
}

/// A reader from `from`, or, if the server no longer holds it, from the binlog's end once the
/// rows since the last seal were taken from the table.
async fn open_or_recover(
    inner: &Inner,
    s: &mut Session,
    from: &BinlogPosition,
    options: &ReadOptions,
) -> Result<BinlogReader> {
    match BinlogReader::open_at(&inner.url, &inner.schema, from, s.gtid.as_deref(), options).await {
        Ok(r) => Ok(r),
        Err(ReadError::Purged { position, message }) => {
            let from = recover(s, &position, &message).await?;
            BinlogReader::open(&inner.url, &inner.schema, &from, options)
                .await
                .map_err(read_error)
        }
        Err(ReadError::Other(e)) => Err(e),
    }
}

async fn recover(
    s: &mut Session,
    position: &BinlogPosition,
    message: &str,
) -> Result<BinlogPosition> {
    warn!(%position, %message, "the binlog the outbox's sequencer stopped at was purged: the rows since its last seal are taken from the table (in seq order, not commit order), then the binlog is read from its end");
    s.take_from_table("a purged binlog").await
}

fn read_error(e: ReadError) -> Error {
    match e {
        ReadError::Other(e) => e,
        purged @ ReadError::Purged { .. } => Error::new(ErrorKind::Connection, purged.to_string()),
    }
}

/// Takes the lease when it is free or expired, bumping the epoch; waits while another holds it.
async fn acquire(inner: &Inner) -> Result<i64> {
    let err = |e| map_sqlx_error("taking the binlog sequencer's lease", e);
    loop {
        let mut tx = inner.pool.begin().await.map_err(err)?;
        let took = sqlx::query(
            &inner
                .schema
                .render(include_str!("../../queries/sequencer_acquire.sql")),
        )
        .bind(&inner.owner)
        .bind(micros(LEASE))
        .bind(&inner.owner)
        .execute(&mut *tx)
        .await
        .map_err(err)?;
        if took.rows_affected() == 1 {
            let epoch: i64 = sqlx::query_scalar(
                &inner
                    .schema
                    .render(include_str!("../../queries/sequencer_epoch.sql")),
            )
            .fetch_one(&mut *tx)
            .await
            .map_err(err)?;
            tx.commit().await.map_err(err)?;
            inner.progress.send_modify(|p| {
                p.leading = true;
                p.error = None;
            });
            return Ok(epoch);
        }
        drop(tx);
        if inner.stopping() {
            return Err(inner.stopped());
        }
        tokio::time::sleep(LEASE / 4).await;
    }
}

fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

/// Where a seal stands (see the module docs).
enum Seal {
    /// None running; the next is taken at `at`.
    Idle { at: Instant },
    /// `AUTO_INCREMENT` read: the writers of that moment are taken from the first snapshot of
    /// the transaction cache that lists the canary, opened after the read.
    Drawn { below: i64, canary: Box<Canary> },
    /// Waiting for `writers` to end.
    Waiting {
        below: i64,
        writers: Vec<String>,
        since: Instant,
        warned: bool,
    },
    /// Every row below `below` is committed or rolled back, and in the binlog before `end`
    /// if it is there at all: done once the sequencer passed `end`.
    Reading { below: i64, end: BinlogPosition },
}

/// One lease's work: the counters, what was saved, the seal.
struct Session {
    inner: Arc<Inner>,
    epoch: i64,
    /// The last position handed out, per partition.
    counters: Vec<i64>,
    /// The binlog position saved (or to be saved) with the last batch.
    position: Option<BinlogPosition>,
    position_saved: bool,
    last_save: Instant,
    sequenced_below: i64,
    /// Whether the rows the trigger positioned before the switch have their entries.
    trigger_rows_taken: bool,
    /// Rows below this seq may have been sequenced from the table: the stream checks them.
    table_high: i64,
    seal: Seal,
    /// Rows sequenced since the last seal began.
    since_seal: u64,
    /// The server this session reads ([`server::identity`]), and the one the saved position
    /// was read on (`None`: not recorded yet).
    identity: String,
    saved_identity: Option<String>,
    /// When the reader last said it had read everything the server had written (an idle
    /// report): until a little after, a save counts as caught up even if the position did not
    /// move. A reader that stopped hearing from the server stops refreshing it.
    last_idle: Option<Instant>,
    /// The reader holds an XA transaction still prepared: the position saved stays before its
    /// group, so after a restart the stream carries again rows positioned since.
    holding: bool,
    /// The highest seq this session positioned.
    max_placed: i64,
    /// MariaDB's GTID state at `position` (`None`: not known), saved with it: a failover's
    /// promoted replica is read on from there.
    gtid: Option<String>,
}

/// How long after an idle report a save still counts the sequencer as caught up: a few
/// heartbeats.
const CAUGHT_UP: Duration = Duration::from_secs(3);

impl Session {
    async fn start(inner: &Arc<Inner>, epoch: i64) -> Result<Self> {
        let err = |e| map_sqlx_error("reading the binlog sequencer's state", e);
        let row = sqlx::query(
            &inner
                .schema
                .render(include_str!("../../queries/sequencer_state.sql")),
        )
        .fetch_one(&inner.pool)
        .await
        .map_err(err)?;
        let file: Option<String> = row.try_get("file").map_err(err)?;
        let offset: Option<i64> = row.try_get("binlog_offset").map_err(err)?;
        let sequenced_below: i64 = row.try_get("sequenced_below").map_err(err)?;
        let trigger_rows_taken: i8 = row.try_get("trigger_rows_taken").map_err(err)?;
        let saved_identity: Option<String> = row.try_get("server_identity").map_err(err)?;
        let identity = server::identity(&inner.pool).await?;
        // Set when the saved position stopped before an XA transaction still prepared: the
        // stream then carries again rows positioned after it, all below this; it checks them
        // before placing.
        let reread_below: Option<i64> = row.try_get("reread_below").map_err(err)?;
        let gtid: Option<String> = row.try_get("binlog_gtid").map_err(err)?;
        let mut s = Self {
            inner: inner.clone(),
            epoch,
            counters: vec![0; crate::PARTITIONS as usize],
            position: file
                .zip(offset)
                .map(|(f, o)| BinlogPosition::new(f, u64::try_from(o).unwrap_or(4))),
            position_saved: true,
            last_save: Instant::now(),
            sequenced_below,
            trigger_rows_taken: trigger_rows_taken != 0,
            table_high: sequenced_below.max(reread_below.unwrap_or(0)),
            seal: Seal::Idle {
                at: Instant::now() + SEAL_EVERY,
            },
            since_seal: 0,
            identity,
            saved_identity,
            last_idle: None,
            holding: false,
            max_placed: 0,
            gtid,
        };
        s.read_counters().await?;
        inner.progress.send_modify(|p| {
            p.through = s.position.clone();
            p.sequenced_below = sequenced_below;
        });
        Ok(s)
    }

    /// After a failover (the saved position was read on another server): a reader of this
    /// server's binlog from just after the transactions the saved GTID state names, which are
    /// the ones whose rows have positions. `None` when no state was saved (a MySQL server, an
    /// older version) or this server cannot serve it (its binlog lacks one of those
    /// transactions, or was purged past them): the caller then takes the rows from the table.
    /// Until the first save, no position is kept for this server (a lease renewal saves none),
    /// so a restart meanwhile resumes by GTID again; rows the stream carries below the next
    /// `seq` are checked for a position first, so none is positioned twice.
    async fn resume_by_gtid(&mut self, options: &ReadOptions) -> Result<Option<BinlogReader>> {
        let Some(gtid) = self.gtid.clone() else {
            return Ok(None);
        };
        let shown = self
            .position
            .as_ref()
            .map(|p| p.to_string())
            .unwrap_or_default();
        match BinlogReader::open_after_gtid(&self.inner.url, &self.inner.schema, &gtid, options)
            .await
        {
            Ok(reader) => {
                let below = next_seq(&self.inner.pool, &self.inner.schema).await?;
                self.table_high = self.table_high.max(below);
                self.position = None;
                warn!(position = %shown, saved = self.saved_identity.as_deref().unwrap_or(""), now = %self.identity, %gtid, "the binlog position the sequencer saved was read on another server (a failover or a restore): this server's binlog is read on from the same transactions by their GTIDs, in commit order");
                Ok(Some(reader))
            }
            // A lost connection is retried as any other; the server's refusal is final.
            Err(ReadError::Other(e)) if e.kind() == ErrorKind::Connection => Err(e),
            Err(e) => {
                warn!(%gtid, error = %e, "this server cannot be read on by the GTID state saved with the position");
                Ok(None)
            }
        }
    }

    /// Whether the saved position was read on another server than this one.
    fn identity_changed(&self) -> bool {
        self.saved_identity
            .as_deref()
            .is_some_and(|saved| saved != self.identity)
    }

    /// Adds what the reader handed back to the batch in hand.
    fn take(
        &mut self,
        item: Item,
        rows: &mut Vec<(i64, String)>,
        end: &mut Option<BinlogPosition>,
    ) {
        match item {
            Item::Committed(c) => {
                rows.extend(c.rows.into_iter().map(|r| (r.seq, r.aggregate_id)));
                *end = Some(c.end);
            }
            Item::Idle(p) => {
                self.last_idle = Some(Instant::now());
                *end = Some(p);
            }
        }
    }

    /// The `SET` part and binds that save binlog position `p` read on this session's server:
    /// `advanced_at` moves when the position does, or while the reader is caught up (so how
    /// long it has not moved is how long a stuck reader has been stuck, not how long the
    /// server was idle).
    fn position_set(&self, p: &BinlogPosition) -> (&'static str, Vec<Bind>) {
        let caught_up = self.last_idle.is_some_and(|t| t.elapsed() < CAUGHT_UP);
        // While the reader holds a prepared XA group, rows positioned since lie below this.
        let reread_below = if self.holding {
            self.table_high.max(self.max_placed + 1)
        } else {
            0
        };
        (
            "advanced_at = IF(? OR NOT (binlog_file <=> ? AND binlog_offset <=> ?), \
             UTC_TIMESTAMP(6), advanced_at), binlog_file = ?, binlog_offset = ?, \
             server_identity = ?, reread_below = NULLIF(?, 0), binlog_gtid = ?",
            vec![
                Bind::Int(i64::from(caught_up)),
                Bind::Text(p.file.clone()),
                Bind::Int(p.offset as i64),
                Bind::Text(p.file.clone()),
                Bind::Int(p.offset as i64),
                Bind::Text(self.identity.clone()),
                Bind::Int(reread_below),
                Bind::OptText(self.gtid.clone()),
            ],
        )
    }

    /// The last position of each partition: the highest sequenced, the trigger's last one, or
    /// the partition's `passed` (retention drops the positions it passed, so the highest
    /// sequenced one can go with them, and a position must never be handed out twice).
    async fn read_counters(&mut self) -> Result<()> {
        let rows: Vec<(i16, i64)> = sqlx::query_as(
            &self
                .inner
                .schema
                .render(include_str!("../../queries/sequencer_counters.sql")),
        )
        .fetch_all(&self.inner.pool)
        .await
        .map_err(|e| map_sqlx_error("reading the partitions' last positions", e))?;
        for (part, n) in rows {
            if let Some(c) = usize::try_from(part)
                .ok()
                .and_then(|p| self.counters.get_mut(p))
            {
                *c = n;
            }
        }
        Ok(())
    }

    /// Gives `rows` (`seq`, key; in commit order) their positions and saves them with `end`,
    /// the binlog position read through, in one transaction under the lease.
    async fn save(&mut self, mut rows: Vec<(i64, String)>, end: BinlogPosition) -> Result<()> {
        if rows.is_empty() && !self.due_to_save() {
            self.position = Some(end.clone());
            self.position_saved = false;
            self.inner
                .progress
                .send_modify(|p| p.through = Some(end.clone()));
            return Ok(());
        }
        let err = |e| map_sqlx_error("saving sequenced positions", e);
        let mut tx = self.inner.pool.begin().await.map_err(err)?;
        let low: Vec<i64> = rows
            .iter()
            .map(|(seq, _)| *seq)
            .filter(|seq| *seq < self.table_high)
            .collect();
        if !low.is_empty() {
            // Taken from the table already (a purge, the switch, a seal's net).
            let have = sequenced(&mut tx, &self.inner.schema, &low).await?;
            rows.retain(|(seq, _)| !have.contains(seq));
        }
        let mut counters = self.counters.clone();
        let placed = place(&mut counters, rows);
        insert_positions(&mut tx, &self.inner.schema, &placed).await?;
        let top = placed.iter().map(|(seq, _, _)| *seq).max().unwrap_or(0);
        self.max_placed = self.max_placed.max(top);
        let (set, binds) = self.position_set(&end);
        self.fenced_update(&mut tx, set, &binds).await?;
        tx.commit().await.map_err(err)?;
        self.saved_identity = Some(self.identity.clone());
        self.counters = counters;
        self.position = Some(end.clone());
        self.position_saved = true;
        self.last_save = Instant::now();
        self.since_seal += placed.len() as u64;
        let n = placed.len() as u64;
        self.inner.progress.send_modify(|p| {
            p.through = Some(end);
            p.sequenced += n;
            p.error = None;
        });
        Ok(())
    }

    fn due_to_save(&self) -> bool {
        !self.position_saved && self.last_save.elapsed() >= SAVE_IDLE
    }

    /// Runs `UPDATE outbox_sequencer SET <set>, <lease renewed> WHERE <ours>` in `tx`; fails
    /// as fenced when the lease is no longer this sequencer's.
    async fn fenced_update(
        &self,
        tx: &mut sqlx::Transaction<'_, MySql>,
        set: &str,
        binds: &[Bind],
    ) -> Result<()> {
        let sql = self.inner.schema.render(
            &include_str!("../../queries/sequencer_fenced_update.sql").replace("{set}", set),
        );
        let mut q = sqlx::query(&sql);
        for b in binds {
            q = match b {
                Bind::Int(v) => q.bind(*v),
                Bind::Text(v) => q.bind(v.clone()),
                Bind::OptText(v) => q.bind(v.clone()),
            };
        }
        let done = q
            .bind(micros(LEASE))
            .bind(&self.inner.owner)
            .bind(self.epoch)
            .execute(&mut **tx)
            .await
            .map_err(|e| map_sqlx_error("renewing the binlog sequencer's lease", e))?;
        if done.rows_affected() != 1 {
            return Err(Error::new(
                ErrorKind::Other,
                "another sequencer took this outbox's lease; this one wrote nothing of its last batch",
            ));
        }
        Ok(())
    }

    /// Renews the lease (fenced), without moving anything.
    async fn keep_lease(&self) -> Result<()> {
        let err = |e| map_sqlx_error("renewing the binlog sequencer's lease", e);
        let mut tx = self.inner.pool.begin().await.map_err(err)?;
        self.fenced_update(&mut tx, "id = id", &[]).await?;
        tx.commit().await.map_err(err)
    }

    /// Between events: keeps the lease, saves an idle position now and then, moves the seal on.
    async fn tick(&mut self) -> Result<()> {
        if self.last_save.elapsed() >= LEASE / 4 || self.due_to_save() {
            let err = |e| map_sqlx_error("renewing the binlog sequencer's lease", e);
            let mut tx = self.inner.pool.begin().await.map_err(err)?;
            match self.position.clone() {
                Some(p) => {
                    let (set, binds) = self.position_set(&p);
                    self.fenced_update(&mut tx, set, &binds).await?
                }
                None => self.fenced_update(&mut tx, "id = id", &[]).await?,
            }
            tx.commit().await.map_err(err)?;
            self.position_saved = true;
            self.last_save = Instant::now();
        }
        self.step_seal().await
    }

    async fn step_seal(&mut self) -> Result<()> {
        let now = Instant::now();
        let pool = &self.inner.pool;
        let schema = &self.inner.schema;
        self.seal = match std::mem::replace(&mut self.seal, Seal::Idle { at: now }) {
            Seal::Idle { at } if now < at => Seal::Idle { at },
            Seal::Idle { .. } => {
                self.since_seal = 0;
                let below = next_seq(pool, schema).await?;
                Seal::Drawn {
                    below,
                    canary: Box::new(Canary::open(&self.inner).await?),
                }
            }
            Seal::Drawn { below, mut canary } => match canary.look(pool).await? {
                None => Seal::Drawn { below, canary },
                Some(writers) => {
                    canary.close().await;
                    Seal::Waiting {
                        below,
                        writers,
                        since: now,
                        warned: false,
                    }
                }
            },
            Seal::Waiting {
                below,
                writers,
                since,
                mut warned,
            } => {
                // A snapshot older than the last one never comes back, and a writer that has
                // ended is in none taken since: absent from one, it has ended.
                let open = if writers.is_empty() {
                    Vec::new()
                } else {
                    let now_open = writers_of(pool).await?;
                    writers
                        .into_iter()
                        .filter(|w| now_open.contains(w))
                        .collect::<Vec<_>>()
                };
                if open.is_empty() {
                    Seal::Reading {
                        below,
                        end: server::end_position(pool).await?,
                    }
                } else {
                    if !warned && since.elapsed() >= LONG_WRITER {
                        warned = true;
                        warn!(transactions = ?open, "a transaction that was writing when the sequencer's seal began is still open after {LONG_WRITER:?}: retention and the check for rows the binlog did not carry wait for it (messages still flow)");
                    }
                    Seal::Waiting {
                        below,
                        writers: open,
                        since,
                        warned,
                    }
                }
            }
            Seal::Reading { below, end } if self.position.as_ref().is_none_or(|p| *p < end) => {
                Seal::Reading { below, end }
            }
            Seal::Reading { below, .. } => {
                self.close_seal(below).await?;
                let wait = if self.since_seal > 0 {
                    SEAL_EVERY
                } else {
                    SEAL_IDLE
                };
                Seal::Idle { at: now + wait }
            }
        };
        Ok(())
    }

    /// Every row below `below` that the binlog carried is sequenced: any row of the window
    /// the table holds without a position (the binlog did not carry it) is sequenced from the
    /// table now, row by row; then `sequenced_below` is raised.
    ///
    /// Row by row, not by comparing counts: a position without a row (a row deleted by hand,
    /// an unfinished group a crash left) would balance one row the binlog did not carry, and
    /// that row, never positioned, would be dropped by retention with its range: a loss. The
    /// anti-join costs the same range scan the two counts did.
    async fn close_seal(&mut self, below: i64) -> Result<()> {
        if below <= self.sequenced_below {
            return Ok(());
        }
        let lo = self.sequenced_below;
        let n = self.sequence_table(lo, below, false).await?;
        if n > 0 {
            warn!(rows = n, from = lo, below, "rows the binlog did not carry (written with sql_log_bin = 0, logged as statements, or unreadable in the binlog) were taken from the table; they are relayed now, in seq order, after their keys' later messages that the binlog carried");
        }
        self.raise_sequenced_below(below).await
    }

    async fn raise_sequenced_below(&mut self, below: i64) -> Result<()> {
        let err = |e| map_sqlx_error("raising sequenced_below", e);
        let mut tx = self.inner.pool.begin().await.map_err(err)?;
        self.fenced_update(
            &mut tx,
            "sequenced_below = GREATEST(sequenced_below, ?)",
            &[Bind::Int(below)],
        )
        .await?;
        tx.commit().await.map_err(err)?;
        self.sequenced_below = self.sequenced_below.max(below);
        self.inner
            .progress
            .send_modify(|p| p.sequenced_below = p.sequenced_below.max(below));
        Ok(())
    }

    /// The first start after `migrate --binlog`, which recorded where the binlog ended just
    /// before the trigger went (the stream starts there): the rows the trigger positioned that
    /// are not passed get their entries with the trigger's positions, once every writer that
    /// could still hold one has ended; the counters go on from them. Rows without a position
    /// are left to the stream, which gives them theirs in commit order (the copied ones it
    /// carries too are skipped: their seqs lie below what the table gave).
    async fn take_trigger_rows(&mut self) -> Result<()> {
        let pool = self.inner.pool.clone();
        let schema = self.inner.schema.clone();
        let below = next_seq(&pool, &schema).await?;
        self.wait_for_writers(below, "its first start").await?;
        let lo = self.window_start().await?;
        let kept = self
            .copy_trigger_positions(lo, below, "trigger_rows_taken = 1")
            .await?;
        self.table_high = self.table_high.max(below);
        self.trigger_rows_taken = true;
        info!(
            rows = kept,
            from = lo,
            below,
            "the binlog sequencer took the positions the trigger gave (its first start)"
        );
        Ok(())
    }

    /// Where a window taken from the table starts: `sequenced_below`, or `passed_below` if
    /// higher (every row below that is passed, and its range may be gone).
    async fn window_start(&self) -> Result<i64> {
        let passed_below: i64 = sqlx::query_scalar(
            &self
                .inner
                .schema
                .render(include_str!("../../queries/passed_below_get.sql")),
        )
        .fetch_one(&self.inner.pool)
        .await
        .map_err(|e| map_sqlx_error("reading passed_below", e))?;
        Ok(self.sequenced_below.max(passed_below))
    }

    /// Gives the rows of `[lo, below)` the trigger positioned and that have no entry yet their
    /// entries, with the trigger's positions, setting `set` on the sequencer's row in the same
    /// fenced transaction; then reads the counters again. Returns how many.
    async fn copy_trigger_positions(&mut self, lo: i64, below: i64, set: &str) -> Result<u64> {
        let err = |e| map_sqlx_error("copying the trigger's positions", e);
        let mut tx = self.inner.pool.begin().await.map_err(err)?;
        let kept = sqlx::query(
            &self
                .inner
                .schema
                .render(include_str!("../../queries/sequence_backfill.sql")),
        )
        .bind(lo)
        .bind(below)
        .execute(&mut *tx)
        .await
        .map_err(err)?;
        self.fenced_update(&mut tx, set, &[]).await?;
        tx.commit().await.map_err(err)?;
        self.read_counters().await?;
        Ok(kept.rows_affected())
    }

    /// Waits until every transaction that was writing when `AUTO_INCREMENT` read `below` has
    /// ended (keeping the lease meanwhile).
    async fn wait_for_writers(&mut self, below: i64, why: &str) -> Result<()> {
        let pool = self.inner.pool.clone();
        let drawn = Instant::now();
        let mut canary = Canary::open(&self.inner).await?;
        let mut writers = loop {
            tokio::time::sleep(CANARY_LOOK).await;
            self.keep_lease().await?;
            if let Some(writers) = canary.look(&pool).await? {
                break writers;
            }
        };
        canary.close().await;
        let mut warned = false;
        while !writers.is_empty() {
            if self.inner.stopping() {
                return Err(self.inner.stopped());
            }
            if !warned && drawn.elapsed() >= LONG_WRITER {
                warned = true;
                warn!(transactions = ?writers, below, "the binlog sequencer waits for transactions that were writing when it began ({why})");
            }
            tokio::time::sleep(CANARY_LOOK).await;
            // Held while it waits, however long a writer takes.
            self.keep_lease().await?;
            let open = writers_of(&pool).await?;
            writers.retain(|w| open.contains(w));
        }
        Ok(())
    }

    /// A purged binlog (or a first start with no recorded position): the binlog's end now
    /// (P), then `AUTO_INCREMENT` (S), then the writers of that moment waited for. Every row
    /// committed before P has a `seq` below S and is in the table by then; those from
    /// `sequenced_below` (or `passed_below`, if higher) up to S with no position get one from
    /// the table, the trigger's kept. Returns P, where the stream starts.
    async fn take_from_table(&mut self, why: &str) -> Result<BinlogPosition> {
        // The stream starts at the server's end, whose GTID state the reader learns as it goes.
        self.gtid = None;
        let pool = self.inner.pool.clone();
        let schema = self.inner.schema.clone();
        let end = server::end_position(&pool).await?;
        let below = next_seq(&pool, &schema).await?;
        self.wait_for_writers(below, why).await?;
        let lo = self.window_start().await?;
        // Counters now: every writer the trigger positioned has ended.
        self.read_counters().await?;
        let n = self.sequence_table(lo, below, true).await?;
        // The stream starts at `end`; saved with the seal, so a restart begins there too.
        let err = |e| map_sqlx_error("saving where the binlog sequencer starts", e);
        let mut tx = pool.begin().await.map_err(err)?;
        let (set, mut binds) = self.position_set(&end);
        binds.push(Bind::Int(below));
        self.fenced_update(
            &mut tx,
            &format!(
                "{set}, sequenced_below = GREATEST(sequenced_below, ?), trigger_rows_taken = 1"
            ),
            &binds,
        )
        .await?;
        tx.commit().await.map_err(err)?;
        self.saved_identity = Some(self.identity.clone());
        self.position = Some(end.clone());
        self.position_saved = true;
        self.sequenced_below = self.sequenced_below.max(below);
        self.inner.progress.send_modify(|p| {
            p.through = Some(end.clone());
            p.sequenced_below = p.sequenced_below.max(below);
        });
        info!(rows = n, from = lo, below, start = %end, "the binlog sequencer took the rows it had no binlog for from the table ({why})");
        Ok(end)
    }

    /// Gives every row of `[lo, below)` without a position one, in `seq` order, in batches;
    /// with `keep_trigger`, a row the trigger positioned keeps its position. Returns how many.
    async fn sequence_table(&mut self, lo: i64, below: i64, keep_trigger: bool) -> Result<u64> {
        let pool = self.inner.pool.clone();
        let schema = self.inner.schema.clone();
        let err = |e| map_sqlx_error("sequencing rows from the table", e);
        let mut total = 0u64;
        if keep_trigger {
            total += self.copy_trigger_positions(lo, below, "id = id").await?;
        }
        self.table_high = self.table_high.max(below);
        let mut from = lo;
        loop {
            let rows: Vec<(i64, String)> =
                sqlx::query_as(&schema.render(include_str!("../../queries/sequence_missing.sql")))
                    .bind(from)
                    .bind(below)
                    .bind(BATCH as i64)
                    .fetch_all(&pool)
                    .await
                    .map_err(err)?;
            let Some(last) = rows.last().map(|(seq, _)| *seq) else {
                break;
            };
            let mut tx = pool.begin().await.map_err(err)?;
            let mut counters = self.counters.clone();
            let placed = place(&mut counters, rows);
            insert_positions(&mut tx, &schema, &placed).await?;
            self.fenced_update(
                &mut tx,
                "from_table = from_table + ?",
                &[Bind::Int(placed.len() as i64)],
            )
            .await?;
            tx.commit().await.map_err(err)?;
            self.counters = counters;
            total += placed.len() as u64;
            let n = placed.len() as u64;
            self.inner.progress.send_modify(|p| p.from_table += n);
            from = last + 1;
        }
        Ok(total)
    }
}

enum Bind {
    Int(i64),
    Text(String),
    OptText(Option<String>),
}

/// `(seq, part, part_seq)` for `rows` in order, drawing from `counters`.
fn place(counters: &mut [i64], rows: Vec<(i64, String)>) -> Vec<(i64, i16, i64)> {
    rows.into_iter()
        .map(|(seq, key)| {
            let part = partition(&key);
            let c = &mut counters[part as usize];
            *c += 1;
            (seq, part, *c)
        })
        .collect()
}

async fn insert_positions(
    tx: &mut sqlx::Transaction<'_, MySql>,
    schema: &Schema,
    placed: &[(i64, i16, i64)],
) -> Result<()> {
    let head = schema.render(include_str!("../../queries/sequence_insert_head.sql"));
    for chunk in placed.chunks(ROWS_PER_STATEMENT) {
        let mut insert = QueryBuilder::<MySql>::new(&head);
        insert.push_values(chunk, |mut row, (seq, part, part_seq)| {
            row.push_bind(*seq).push_bind(*part).push_bind(*part_seq);
        });
        insert
            .build()
            .execute(&mut **tx)
            .await
            .map_err(|e| map_sqlx_error("saving sequenced positions", e))?;
    }
    Ok(())
}

/// Which of `seqs` have a position already.
async fn sequenced(
    tx: &mut sqlx::Transaction<'_, MySql>,
    schema: &Schema,
    seqs: &[i64],
) -> Result<HashSet<i64>> {
    let mut have = HashSet::new();
    for chunk in seqs.chunks(ROWS_PER_STATEMENT) {
        let mut q = QueryBuilder::<MySql>::new(
            schema.render(include_str!("../../queries/sequence_present_head.sql")),
        );
        let mut each = q.separated(", ");
        for seq in chunk {
            each.push_bind(*seq);
        }
        q.push(")");
        let found: Vec<i64> = q
            .build_query_scalar()
            .fetch_all(&mut **tx)
            .await
            .map_err(|e| map_sqlx_error("looking for rows sequenced already", e))?;
        have.extend(found);
    }
    Ok(have)
}

/// The `seq` the next outbox row will draw: no row below it can be drawn any more.
pub(crate) async fn next_seq(pool: &MySqlPool, schema: &Schema) -> Result<i64> {
    let err = |e| map_sqlx_error("reading the outbox's next seq", e);
    let mut conn = pool.acquire().await.map_err(err)?;
    // MySQL 8 serves information_schema's table figures from a cache kept for a day by
    // default; this session reads them live. MariaDB always does (and has no such variable).
    let _ = sqlx::query(include_str!("../../queries/stats_expiry_off.sql"))
        .execute(&mut *conn)
        .await;
    let next: Option<i64> = sqlx::query_scalar(include_str!("../../queries/next_seq.sql"))
        .bind(schema.as_str())
        .fetch_one(&mut *conn)
        .await
        .map_err(err)?;
    next.ok_or_else(|| {
        Error::new(
            ErrorKind::Schema,
            format!("database `{}` has no outbox table", schema.as_str()),
        )
    })
}

/// `information_schema.INNODB_TRX` as InnoDB's cache last saw it: each transaction's session,
/// and an identity for those that may have drawn an outbox `seq` and not ended (they have
/// written, wait for a lock, or run a statement that is not a read). A session that only holds
/// a snapshot open, or runs a long `SELECT` (a dump), is not among them.
///
/// The cache is refreshed only when it has not been read for 0.1 s, so a snapshot can be older
/// than the call: see [`Canary`].
async fn transactions(pool: &MySqlPool) -> Result<Vec<(u64, Option<String>)>> {
    sqlx::query_as(include_str!("../../queries/open_transactions.sql"))
        .fetch_all(pool)
        .await
        .map_err(|e| map_sqlx_error("reading the transactions in progress", e))
}

/// The writers of the cache's current snapshot.
async fn writers_of(pool: &MySqlPool) -> Result<Vec<String>> {
    Ok(writers(&transactions(pool).await?, 0))
}

/// The writers among `transactions`.
fn writers(all: &[(u64, Option<String>)], canary: u64) -> Vec<String> {
    all.iter()
        .filter(|(thread, _)| *thread != canary)
        .filter_map(|(_, w)| w.clone())
        .collect()
}

/// A transaction opened after `AUTO_INCREMENT` was read: a snapshot of `INNODB_TRX` that lists
/// it was taken after that read, so the writers it lists are all that could hold a lower `seq`
/// (an older snapshot could miss one).
struct Canary {
    tx: sqlx::Transaction<'static, MySql>,
    thread: u64,
    /// The last look at the cache: looks closer than [`CANARY_LOOK`] keep it from refreshing.
    looked: Instant,
}

/// How often a canary looks for itself in `INNODB_TRX` (the cache refreshes after 0.1 s unread).
const CANARY_LOOK: Duration = Duration::from_millis(250);

impl Canary {
    async fn open(inner: &Inner) -> Result<Self> {
        let err = |e| map_sqlx_error("opening the seal's canary transaction", e);
        let mut tx = inner.pool.begin().await.map_err(err)?;
        let thread: u64 = sqlx::query_scalar(include_str!("../../queries/connection_id.sql"))
            .fetch_one(&mut *tx)
            .await
            .map_err(err)?;
        // An InnoDB read starts the transaction: from here it is listed.
        sqlx::query(
            &inner
                .schema
                .render(include_str!("../../queries/sequencer_read.sql")),
        )
        .fetch_optional(&mut *tx)
        .await
        .map_err(err)?;
        Ok(Self {
            tx,
            thread,
            looked: Instant::now(),
        })
    }

    /// The writers of a snapshot that lists the canary, if this look found one.
    async fn look(&mut self, pool: &MySqlPool) -> Result<Option<Vec<String>>> {
        if self.looked.elapsed() < CANARY_LOOK {
            return Ok(None);
        }
        self.looked = Instant::now();
        let all = transactions(pool).await?;
        Ok(all
            .iter()
            .any(|(thread, _)| *thread == self.thread)
            .then(|| writers(&all, self.thread)))
    }

    async fn close(self) {
        let _ = self.tx.rollback().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partitions_are_the_triggers_crc32_modulo_64() {
        // SELECT CRC32('order-1') % 64, CRC32('') % 64, CRC32('é') % 64 on MariaDB 10.11.
        assert_eq!(partition(""), 0);
        assert_eq!(
            partition("order-1"),
            (crc32fast::hash(b"order-1") % 64) as i16
        );
    }

    #[test]
    fn rows_take_the_next_positions_of_their_partitions_in_order() {
        let mut counters = vec![0i64; 64];
        let a = partition("a") as usize;
        counters[a] = 7;
        let placed = place(
            &mut counters,
            vec![(30, "a".into()), (10, "a".into()), (20, "b".into())],
        );
        assert_eq!(placed[0], (30, a as i16, 8));
        assert_eq!(placed[1], (10, a as i16, 9));
        assert_eq!(placed[2].0, 20);
        assert_eq!(counters[a], 9);
    }
}
