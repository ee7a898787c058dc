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

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::FutureExt as _;
use outbox_core::{Error, ErrorKind, Result};
use sqlx::MySqlPool;
use tokio::sync::watch;
use tracing::{info, warn};

use super::reader::{BinlogReader, ReadError, ReadOptions};
use super::session::Session;
use super::{server, BinlogPosition};
use crate::error::map_sqlx_error;
use crate::schema::Schema;

/// How long a sequencer's lease lasts without a write; renewed every [`TICK`] × 10.
pub(super) const LEASE: Duration = Duration::from_secs(10);

/// How often the sequencer looks at its lease and its seal between binlog events.
pub(super) const TICK: Duration = Duration::from_millis(100);

/// Rows sequenced in one transaction at most.
pub(super) const BATCH: usize = 5_000;

/// Rows per `INSERT` statement (three values each, under the protocol's 65,535).
pub(super) const ROWS_PER_STATEMENT: usize = 4_000;

/// How long [`Sequencer::stop`] waits for the task to reach a safe point.
pub(super) const STOP_WAIT: Duration = Duration::from_secs(5);

/// How long an idle sequencer leaves its binlog position unwritten.
pub(super) const SAVE_IDLE: Duration = Duration::from_secs(5);

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

pub(super) struct Inner {
    pub(super) pool: MySqlPool,
    pub(super) schema: Schema,
    pub(super) url: String,
    pub(super) owner: String,
    pub(super) progress: watch::Sender<Progress>,
    /// Set to stop: the task ends at its next safe point (never inside a transaction).
    pub(super) stop: watch::Sender<bool>,
}

impl Inner {
    pub(super) fn stopping(&self) -> bool {
        *self.stop.borrow()
    }

    pub(super) fn stopped(&self) -> Error {
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

pub(super) async fn saved_position(inner: &Inner) -> Result<Option<BinlogPosition>> {
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

pub(super) fn read_error(e: ReadError) -> Error {
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

pub(super) fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
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
}
