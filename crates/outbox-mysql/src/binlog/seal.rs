//! The seal of the binlog route's sequencer: it raises `sequenced_below` once every row below
//! it is either sequenced from the binlog or taken from the table (the module docs of
//! `sequencer.rs`, "Nothing the binlog lacks is lost"); the rows taken from the table at a first
//! start or after a purged binlog; and the canary transaction that tells which writers could
//! still hold a lower `seq`.

use std::time::{Duration, Instant};

use outbox_core::{Error, ErrorKind, Result};
use sqlx::{MySql, MySqlPool};
use tracing::{info, warn};

use super::sequencer::*;
use super::session::{insert_positions, place, Bind, Session};
use super::{server, BinlogPosition};
use crate::error::map_sqlx_error;
use crate::schema::Schema;

/// How often a seal is taken while rows are sequenced; with none, every [`SEAL_IDLE`].
pub(super) const SEAL_EVERY: Duration = Duration::from_secs(1);
pub(super) const SEAL_IDLE: Duration = Duration::from_secs(10);

/// A writer still open this long after a seal began is named in a warning (once per seal).
pub(super) const LONG_WRITER: Duration = Duration::from_secs(30);

/// Where a seal stands (see the module docs).
pub(super) enum Seal {
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

impl Session {
    pub(super) async fn step_seal(&mut self) -> Result<()> {
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
    pub(super) async fn close_seal(&mut self, below: i64) -> Result<()> {
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

    pub(super) async fn raise_sequenced_below(&mut self, below: i64) -> Result<()> {
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
    pub(super) async fn take_trigger_rows(&mut self) -> Result<()> {
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
    pub(super) async fn window_start(&self) -> Result<i64> {
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
    pub(super) async fn copy_trigger_positions(
        &mut self,
        lo: i64,
        below: i64,
        set: &str,
    ) -> Result<u64> {
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
    pub(super) async fn wait_for_writers(&mut self, below: i64, why: &str) -> Result<()> {
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
    pub(super) async fn take_from_table(&mut self, why: &str) -> Result<BinlogPosition> {
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
    pub(super) async fn sequence_table(
        &mut self,
        lo: i64,
        below: i64,
        keep_trigger: bool,
    ) -> Result<u64> {
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
pub(super) async fn transactions(pool: &MySqlPool) -> Result<Vec<(u64, Option<String>)>> {
    sqlx::query_as(include_str!("../../queries/open_transactions.sql"))
        .fetch_all(pool)
        .await
        .map_err(|e| map_sqlx_error("reading the transactions in progress", e))
}

/// The writers of the cache's current snapshot.
pub(super) async fn writers_of(pool: &MySqlPool) -> Result<Vec<String>> {
    Ok(writers(&transactions(pool).await?, 0))
}

/// The writers among `transactions`.
pub(super) fn writers(all: &[(u64, Option<String>)], canary: u64) -> Vec<String> {
    all.iter()
        .filter(|(thread, _)| *thread != canary)
        .filter_map(|(_, w)| w.clone())
        .collect()
}

/// A transaction opened after `AUTO_INCREMENT` was read: a snapshot of `INNODB_TRX` that lists
/// it was taken after that read, so the writers it lists are all that could hold a lower `seq`
/// (an older snapshot could miss one).
pub(super) struct Canary {
    tx: sqlx::Transaction<'static, MySql>,
    thread: u64,
    /// The last look at the cache: looks closer than [`CANARY_LOOK`] keep it from refreshing.
    looked: Instant,
}

/// How often a canary looks for itself in `INNODB_TRX` (the cache refreshes after 0.1 s unread).
pub(super) const CANARY_LOOK: Duration = Duration::from_millis(250);

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
