//! One lease's work of the sequencer ([`Session`]): the counters, taking the reader's rows and
//! giving them positions, saving each batch with the binlog position it read through, and the
//! fenced update every write of the sequencer's row goes through. The seal and the rows taken
//! from the table are in `seal.rs`.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use outbox_core::{Error, ErrorKind, Result};
use sqlx::{MySql, QueryBuilder, Row as _};
use tracing::warn;

use super::reader::{BinlogReader, Item, ReadError, ReadOptions};
use super::seal::{next_seq, Seal, SEAL_EVERY};
use super::sequencer::*;
use super::{server, BinlogPosition};
use crate::error::map_sqlx_error;
use crate::schema::Schema;

/// One lease's work: the counters, what was saved, the seal.
pub(super) struct Session {
    pub(super) inner: Arc<Inner>,
    pub(super) epoch: i64,
    /// The last position handed out, per partition.
    pub(super) counters: Vec<i64>,
    /// The binlog position saved (or to be saved) with the last batch.
    pub(super) position: Option<BinlogPosition>,
    pub(super) position_saved: bool,
    pub(super) last_save: Instant,
    pub(super) sequenced_below: i64,
    /// Whether the rows the trigger positioned before the switch have their entries.
    pub(super) trigger_rows_taken: bool,
    /// Rows below this seq may have been sequenced from the table: the stream checks them.
    pub(super) table_high: i64,
    pub(super) seal: Seal,
    /// Rows sequenced since the last seal began.
    pub(super) since_seal: u64,
    /// The server this session reads ([`server::identity`]), and the one the saved position
    /// was read on (`None`: not recorded yet).
    pub(super) identity: String,
    pub(super) saved_identity: Option<String>,
    /// When the reader last said it had read everything the server had written (an idle
    /// report): until a little after, a save counts as caught up even if the position did not
    /// move. A reader that stopped hearing from the server stops refreshing it.
    pub(super) last_idle: Option<Instant>,
    /// The reader holds an XA transaction still prepared: the position saved stays before its
    /// group, so after a restart the stream carries again rows positioned since.
    pub(super) holding: bool,
    /// The highest seq this session positioned.
    pub(super) max_placed: i64,
    /// MariaDB's GTID state at `position` (`None`: not known), saved with it: a failover's
    /// promoted replica is read on from there.
    pub(super) gtid: Option<String>,
}

/// How long after an idle report a save still counts the sequencer as caught up: a few
/// heartbeats.
const CAUGHT_UP: Duration = Duration::from_secs(3);

impl Session {
    pub(super) async fn start(inner: &Arc<Inner>, epoch: i64) -> Result<Self> {
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
    pub(super) async fn resume_by_gtid(
        &mut self,
        options: &ReadOptions,
    ) -> Result<Option<BinlogReader>> {
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
    pub(super) fn identity_changed(&self) -> bool {
        self.saved_identity
            .as_deref()
            .is_some_and(|saved| saved != self.identity)
    }

    /// Adds what the reader handed back to the batch in hand.
    pub(super) fn take(
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
    pub(super) fn position_set(&self, p: &BinlogPosition) -> (&'static str, Vec<Bind>) {
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
    pub(super) async fn read_counters(&mut self) -> Result<()> {
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
    pub(super) async fn save(
        &mut self,
        mut rows: Vec<(i64, String)>,
        end: BinlogPosition,
    ) -> Result<()> {
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

    pub(super) fn due_to_save(&self) -> bool {
        !self.position_saved && self.last_save.elapsed() >= SAVE_IDLE
    }

    /// Runs `UPDATE outbox_sequencer SET <set>, <lease renewed> WHERE <ours>` in `tx`; fails
    /// as fenced when the lease is no longer this sequencer's.
    pub(super) async fn fenced_update(
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
    pub(super) async fn keep_lease(&self) -> Result<()> {
        let err = |e| map_sqlx_error("renewing the binlog sequencer's lease", e);
        let mut tx = self.inner.pool.begin().await.map_err(err)?;
        self.fenced_update(&mut tx, "id = id", &[]).await?;
        tx.commit().await.map_err(err)
    }

    /// Between events: keeps the lease, saves an idle position now and then, moves the seal on.
    pub(super) async fn tick(&mut self) -> Result<()> {
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
}

pub(super) enum Bind {
    Int(i64),
    Text(String),
    OptText(Option<String>),
}

/// `(seq, part, part_seq)` for `rows` in order, drawing from `counters`.
pub(super) fn place(counters: &mut [i64], rows: Vec<(i64, String)>) -> Vec<(i64, i16, i64)> {
    rows.into_iter()
        .map(|(seq, key)| {
            let part = partition(&key);
            let c = &mut counters[part as usize];
            *c += 1;
            (seq, part, *c)
        })
        .collect()
}

pub(super) async fn insert_positions(
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
pub(super) async fn sequenced(
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

#[cfg(test)]
mod tests {
    use super::*;

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
