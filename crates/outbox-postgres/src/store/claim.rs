//! A claim's reads: the member's remembered state, the share of a batch per partition, the
//! window and parked reads in one read-only transaction, and the claim's EXPLAIN.

use super::*;

/// What the store remembers per member between calls.
#[derive(Default)]
pub(super) struct MemberState {
    /// Owned partitions and the epoch each was taken at (the fencing token).
    pub(super) epochs: HashMap<i16, i64>,
    /// The last claim, until it is recorded.
    pub(super) ticket: Option<Ticket>,
    /// Partitions that had rows at the last claim, to share a batch among them.
    pub(super) active: usize,
    /// Which partitions those were (`None` before the member's first claim): only they get a
    /// share of the whole batch next time.
    pub(super) busy: Option<HashSet<i16>>,
    /// When empty windows were last recorded as passed.
    pub(super) last_idle_advance: Option<Instant>,
    /// When this member last warned about partitions at the parking cap.
    pub(super) last_cap_warning: Option<Instant>,
    /// Mean payload size (bytes) of the rows the last claim measured, to size the next claim's
    /// reads to its byte bound.
    pub(super) mean_payload: Option<usize>,
    /// The batch read ahead of the pending one, until adopted or dropped.
    pub(super) ahead: Option<Ahead>,
    /// When the parked table needs reading.
    pub(super) parked: ParkedReads,
    /// Whether the last claim's walk stopped at the end of its span in some partition.
    pub(super) more_to_read: bool,
}

impl MemberState {
    /// Takes note of a record: the parked counts of the positions it appended, and whether it
    /// parked or released messages (the parked table then needs reading again).
    pub(super) fn note_recorded(&mut self, plan: &Plan, appended: &[(i16, i64)]) {
        let written: Vec<NewPosition> = plan
            .positions
            .iter()
            .filter(|p| appended.iter().any(|(a, _)| *a == p.partition))
            .cloned()
            .collect();
        self.parked
            .recorded(&written, !plan.park.is_empty() || !plan.retried.is_empty());
    }

    /// Keeps what a claim's reads measured for the next claim: the partitions that had rows,
    /// the mean payload size, the parked counts.
    pub(super) fn remember(&mut self, read: &ClaimRead) {
        self.active = read.active_now.max(1);
        self.busy = Some(
            read.ticket
                .windows
                .values()
                .filter(|w| w.found > 0)
                .map(|w| w.partition)
                .collect(),
        );
        self.mean_payload = read.mean_now.or(self.mean_payload);
        self.more_to_read = read.ticket.windows.values().any(|w| w.read_to.is_some());
        for w in read.ticket.windows.values() {
            self.parked.counts.insert(w.partition, w.parked);
        }
    }
}

/// How often a member reads the parked table at most while heads it knows of are not due:
/// a redrive (an operator's, or one made through the console) is picked up within this.
pub(super) const PARKED_RECHECK: Duration = Duration::from_secs(1);

/// When a member reads the parked table. Only partitions whose latest position counts parked
/// messages (or whose count is not known yet) are read, and only when a head may be due: the
/// earliest next attempt seen has come, a record of this member parked or released messages
/// since, or [`PARKED_RECHECK`] passed. Claims in between, a broker outage with thousands of
/// parked messages included, do not read the parked table at all.
#[derive(Default)]
pub(super) struct ParkedReads {
    /// Parked messages per partition, as the latest claim's positions (or this member's own
    /// records since) count them.
    pub(super) counts: HashMap<i16, i64>,
    /// The last read, and the earliest next attempt of a head that was not due then.
    pub(super) last_read: Option<Instant>,
    pub(super) next_due: Option<DateTime<Utc>>,
    /// A record changed parked messages since the last read.
    pub(super) changed: bool,
    /// The failed-message policy of the last read (`block`): the heads differ between them.
    pub(super) block: Option<bool>,
}

impl ParkedReads {
    /// The partitions of `owned` to read now under the `block` policy (empty: no read).
    pub(super) fn due(&self, owned: &[i16], block: bool) -> Vec<i16> {
        let with_parked: Vec<i16> = owned
            .iter()
            .copied()
            .filter(|p| self.counts.get(p).is_none_or(|n| *n > 0))
            .collect();
        let due = self.changed
            || self.block != Some(block)
            || self.last_read.is_none_or(|t| t.elapsed() >= PARKED_RECHECK)
            || self.next_due.is_some_and(|t| t <= Utc::now());
        if due {
            with_parked
        } else {
            Vec::new()
        }
    }

    /// A read of the parked table under the `block` policy happened now and found `next_due`.
    pub(super) fn read(&mut self, block: bool, next_due: Option<DateTime<Utc>>) {
        self.block = Some(block);
        self.last_read = Some(Instant::now());
        self.next_due = next_due;
        self.changed = false;
    }

    /// A record appended `positions`, parking or releasing messages when `changed`.
    pub(super) fn recorded(&mut self, positions: &[NewPosition], changed: bool) {
        for p in positions {
            self.counts.insert(p.partition, p.parked);
        }
        self.changed |= changed;
    }
}

/// A batch read ahead ([`Store::claim_ahead`]): its ticket, and the positions the batch before
/// it must record for it to follow on (every message published, no window closed).
pub(super) struct Ahead {
    pub(super) ticket: Ticket,
    pub(super) expected: Vec<NewPosition>,
    /// Set by `complete`: the batch before it was recorded exactly as `expected` says.
    pub(super) recorded: bool,
}

/// What one claim read, before it becomes the member's claim.
pub(super) struct ClaimRead {
    pub(super) messages: Vec<Message>,
    pub(super) ticket: Ticket,
    /// When the parked table was read: the earliest next attempt of a head not yet due.
    pub(super) parked_read: Option<Option<DateTime<Utc>>>,
    pub(super) active_now: usize,
    pub(super) mean_now: Option<usize>,
    pub(super) idle_due: bool,
}

/// What one window read asks for.
pub(super) struct WindowRead<'a> {
    pub(super) epochs: &'a [(i16, i64)],
    /// The most rows any partition may return.
    pub(super) per_partition: i64,
    /// The rows each partition of `epochs` may return (at most `per_partition`).
    pub(super) partition_limits: &'a [i64],
    pub(super) rows: usize,
    pub(super) block: bool,
    /// Payload bytes it may hand out.
    pub(super) bytes: usize,
    /// Whether its first row may go alone whatever its size (nothing else was handed out).
    pub(super) first_alone: bool,
    /// For a read ahead: per partition, the open window to continue and where (the position
    /// the pending batch will record) instead of the recorded one.
    pub(super) follow: Option<&'a HashMap<i16, NewPosition>>,
}

/// How many rows each partition of `epochs` may return in a claim of `rows`, given the number
/// of partitions that had rows at the member's last claim (`active`) and which (`busy`, `None`
/// before its first claim); and the most any may return.
pub(super) fn share_batch(
    rows: usize,
    epochs: &[(i16, i64)],
    active: usize,
    busy: Option<&HashSet<i16>>,
) -> (i64, Vec<i64>) {
    // A batch is shared among the partitions that had rows last time: one hot key gets the
    // whole batch, a thousand keys a slice each. The slice is rounded up, so that busy
    // partitions fill the batch (the few rows past it are cut below, highest seqs first):
    // rounded down, 32 busy partitions and a batch of 1,000 came back with 992 rows, which
    // the relay reads as "caught up", so it never read ahead and paused after every batch.
    let parts = epochs.len().max(1);
    let rows = rows.max(1);
    let per_partition = rows.div_ceil(active.clamp(1, parts)).clamp(1, rows) as i64;
    // Only the partitions that had rows get that slice; the others get twice an even share
    // of the batch, so a backlog that appears across many of them at once (a big
    // transaction commits, a bulk insert after a quiet spell) is read as about three
    // batches, not one batch per partition: after a trickle on one key, 32 partitions at
    // 1,000 rows each made a 32,000-row claim of 150 ms. The next claim shares by what this
    // one found. A member's first claim knows nothing yet and gives every partition the
    // slice.
    let quiet = ((rows.saturating_mul(2)).div_ceil(parts).clamp(1, rows) as i64).min(per_partition);
    let partition_limits: Vec<i64> = epochs
        .iter()
        .map(|(p, _)| match busy {
            Some(busy) if !busy.contains(p) => quiet,
            _ => per_partition,
        })
        .collect();
    (per_partition, partition_limits)
}

/// The seqs A2's walk may span in one claim of a partition: four times the rows it may return,
/// and at least [`WALK_SPAN`]. A claim's cost therefore follows its batch, whatever runs
/// beside it: a walk that meets rows of a transaction still being written (which the index scan
/// steps over one heap visit at a time, without returning them) moves the window's cursor to
/// the end of its span and reads on at the next claim, instead of stepping over all of them at
/// once (a million-row transaction in progress made claims step over up to 55,000 rows and take
/// 300 ms).
pub(super) fn walk_span(per_partition: i64) -> i64 {
    per_partition.saturating_mul(4).max(WALK_SPAN)
}

/// The smallest walk span: at most this many index entries per partition (about 15 ms of heap
/// visits here when every one belongs to a transaction still running; a claim's partitions
/// share the seqs, so together they meet about as many), and four times what a partition's share
/// of a batch needs when a thousand keys share the outbox (16 rows over about 1,000 seqs).
/// Measured with `bench --mode big-tx` (2026-12-04): 8,192 left claims of 100–110 ms while a
/// thousand transactions were written, 4,096 none over 60 ms once they were committed.
pub(super) const WALK_SPAN: i64 = 4_096;

/// What a claim's reads measured: rows to hand out and the text length of their payloads.
#[derive(Default)]
pub(super) struct Measured {
    pub(super) rows: u64,
    pub(super) bytes: u64,
}

impl Measured {
    pub(super) fn add(&mut self, rows: i64, bytes: i64) {
        self.rows += u64::try_from(rows).unwrap_or(0);
        self.bytes += u64::try_from(bytes).unwrap_or(0);
    }
}

/// Rows to read for a claim bounded by `limits`, after payloads of `mean` bytes: what the byte
/// bound holds and half as many again, plus one (at least one, at most `limits.rows`). Every row
/// read has its payload rendered to be measured, so a claim of large payloads renders at most
/// about one and a half bounds' worth, not `limits.rows` payloads; the slack keeps payloads of
/// mixed sizes from cutting claims short. Unknown sizes read `limits.rows`.
pub(super) fn rows_to_read(limits: ClaimLimits, mean: Option<usize>) -> usize {
    match mean {
        Some(mean) if mean > 0 => {
            let fit = limits.bytes / mean;
            limits
                .rows
                .min(fit.saturating_add(fit / 2).saturating_add(1))
                .max(1)
        }
        _ => limits.rows.max(1),
    }
}

/// `n` as a bind parameter (PostgreSQL `int8`).
pub(super) fn int8(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// One field of the windows a read ahead continues, as an array parameter aligned with the
/// claim's partitions (NULL where there is nothing to continue).
pub(super) fn column<T>(
    follow: &[Option<&NewPosition>],
    field: impl Fn(&NewPosition) -> Option<T>,
) -> Vec<Option<T>> {
    follow.iter().map(|f| f.and_then(&field)).collect()
}

impl PgStore {
    /// One claim's reads, in one read-only transaction: the due parked messages, then the
    /// windows (continuing those in `follow`, for a read ahead). Changes no member state but
    /// the warning clock.
    pub(super) async fn read_claim(
        &self,
        member: &MemberId,
        partitions: &[i32],
        limits: ClaimLimits,
        on_failed: OnFailed,
        follow: Option<&HashMap<i16, NewPosition>>,
    ) -> Result<Option<ClaimRead>> {
        // Long because: one read-only transaction's steps in order, sharing its locals.
        let wanted = partitions_param(partitions);
        let (epochs, active, idle_due, mean, parked_parts, busy) = self.state(member, |s| {
            let e: Vec<(i16, i64)> = wanted
                .iter()
                .filter_map(|p| s.epochs.get(p).map(|e| (*p, *e)))
                .collect();
            let idle_due = s
                .last_idle_advance
                .is_none_or(|t| t.elapsed() >= IDLE_ADVANCE_EVERY);
            let owned: Vec<i16> = e.iter().map(|(p, _)| *p).collect();
            // A read ahead never reads the parked table: due parked messages are older work,
            // which `claim_ahead` leaves to a claim of its own.
            let parked = if follow.is_some() {
                Vec::new()
            } else {
                s.parked.due(&owned, on_failed == OnFailed::Block)
            };
            (
                e,
                s.active,
                idle_due,
                s.mean_payload,
                parked,
                s.busy.clone(),
            )
        });
        if epochs.is_empty() || limits.rows == 0 {
            return Ok(None);
        }
        let rows = rows_to_read(limits, mean);
        let (per_partition, partition_limits) = share_batch(rows, &epochs, active, busy.as_ref());
        let block = on_failed == OnFailed::Block;
        let err = |e| map_sqlx_error("claiming pending messages", e);
        let started = Instant::now();
        let waited_before = tracing::enabled!(tracing::Level::DEBUG)
            .then(runqueue_wait)
            .flatten();
        let (mut tx, acquired) = crate::begin::begin_with(&self.pool, CLAIM_BEGIN)
            .await
            .map_err(err)?;
        let began = started.elapsed();
        let mut ticket = Ticket::default();
        // Parked messages first (retries are older work), then the windows with the bytes
        // left: together they stay within the bound, or are one oversized message.
        let (parked, mut measured, parked_read) = if parked_parts.is_empty() {
            (Vec::new(), Measured::default(), None)
        } else {
            let (p, m, next_due) = self
                .read_parked(
                    &mut tx,
                    &parked_parts,
                    rows,
                    limits.bytes,
                    block,
                    &mut ticket,
                )
                .await?;
            (p, m, Some(next_due))
        };
        let parked_bytes: usize = parked.iter().map(|m| m.payload.len()).sum();
        let parked_done = started.elapsed();
        let (mut messages, window_measured) = self
            .read_windows(
                &mut tx,
                WindowRead {
                    epochs: &epochs,
                    per_partition,
                    partition_limits: &partition_limits,
                    rows,
                    block,
                    bytes: limits.bytes.saturating_sub(parked_bytes),
                    first_alone: parked.is_empty(),
                    follow,
                },
                &mut ticket,
            )
            .await?;
        let windows_done = started.elapsed();
        tx.commit().await.map_err(err)?;
        let took = started.elapsed();
        if took >= SLOW_CLAIM {
            // Where a slow claim's time went, so it can be told from the server's statement
            // time (auto_explain) and from waiting on the pool or on this process's CPU.
            tracing::debug!(
                %member,
                took_ms = took.as_secs_f64() * 1e3,
                acquire_ms = acquired.as_secs_f64() * 1e3,
                begin_ms = (began - acquired).as_secs_f64() * 1e3,
                parked_ms = (parked_done - began).as_secs_f64() * 1e3,
                windows_ms = (windows_done - parked_done).as_secs_f64() * 1e3,
                commit_ms = (took - windows_done).as_secs_f64() * 1e3,
                // Summed over this process's threads: time they were ready to run but had no
                // core. Near `took_ms`, the claim waited for the machine, not for the engine.
                cpu_wait_ms = waited_before
                    .zip(runqueue_wait())
                    .map(|(a, b)| b.saturating_sub(a).as_secs_f64() * 1e3),
                rows = messages.len(),
                ahead = follow.is_some(),
                "slow claim"
            );
        }
        measured.add(
            i64::try_from(window_measured.rows).unwrap_or(0),
            i64::try_from(window_measured.bytes).unwrap_or(0),
        );
        messages.extend(parked);
        messages.sort_by_key(|m| m.seq);
        let keep = limits.fit(messages.iter().map(|m| m.payload.len()));
        if messages.len() > keep {
            // Cut the highest seqs: their window rows count as not tried.
            let cut: std::collections::HashSet<i64> =
                messages.drain(keep..).map(|m| m.seq).collect();
            for r in &mut ticket.rows {
                if cut.contains(&r.seq) {
                    r.handed_out = false;
                }
            }
            ticket.parked.retain(|seq, _| !cut.contains(seq));
        }
        if !ticket.full_partitions.is_empty() {
            let warn_now = self.state(member, |s| {
                let due = s
                    .last_cap_warning
                    .is_none_or(|t| t.elapsed() >= Duration::from_secs(60));
                if due {
                    s.last_cap_warning = Some(Instant::now());
                }
                due
            });
            if warn_now {
                tracing::warn!(
                    %member,
                    partitions = ?ticket.full_partitions,
                    cap = self.parked_cap,
                    "partitions hold the parking cap and stopped advancing: a key is stuck \
                     behind a failing message with a long backlog; see `outbox status`"
                );
            }
        }
        let mean_now = (measured.rows > 0)
            .then(|| usize::try_from(measured.bytes / measured.rows).unwrap_or(usize::MAX));
        let active_now = ticket.windows.values().filter(|w| w.found > 0).count();
        ticket.rows.sort_by_key(|r| r.seq);
        Ok(Some(ClaimRead {
            messages,
            ticket,
            parked_read,
            active_now,
            mean_now,
            idle_due,
        }))
    }

    /// `sql` (the window claim, or an EXPLAIN of it) bound for `read`.
    pub(super) fn window_query<'q>(
        &self,
        sql: &'q str,
        read: &WindowRead<'_>,
    ) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
        let (parts, eps): (Vec<i16>, Vec<i64>) = read.epochs.iter().copied().unzip();
        let follow: Vec<Option<&NewPosition>> = parts
            .iter()
            .map(|p| {
                read.follow
                    .and_then(|f| f.get(p))
                    .filter(|n| n.cur.is_some())
            })
            .collect();
        let all = int8(read.rows.saturating_add(parts.len()));
        let span = walk_span(read.per_partition);
        sqlx::query(sql)
            .bind(parts)
            .bind(eps)
            .bind(read.per_partition)
            .bind(all)
            .bind(read.block)
            .bind(self.parked_cap)
            .bind(int8(read.bytes))
            .bind(read.first_alone)
            .bind(column(&follow, |n| Some(n.cursor)))
            .bind(column(&follow, |n| n.cur.clone()))
            .bind(column(&follow, |n| n.cur_floor))
            .bind(column(&follow, |n| n.cur_at))
            .bind(span)
            .bind(read.partition_limits.to_vec())
    }

    /// The plan of `member`'s next window claim of `rows` per partition over `partitions`
    /// (its own, as rebalanced), run for real under EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)
    /// with the very statement, parameters and settings a claim uses; `generic`: the generic
    /// plan, which a relay's prepared claim settles on after a few runs, else one planned for
    /// these values. It writes nothing. For tests and benchmarks that check what a claim costs.
    #[doc(hidden)]
    pub async fn explain_claim(
        &self,
        member: &MemberId,
        partitions: &[i32],
        rows: usize,
        generic: bool,
    ) -> Result<serde_json::Value> {
        let wanted = partitions_param(partitions);
        let epochs: Vec<(i16, i64)> = self.state(member, |s| {
            wanted
                .iter()
                .filter_map(|p| s.epochs.get(p).map(|e| (*p, *e)))
                .collect()
        });
        let err = |e| map_sqlx_error("explaining a claim", e);
        let mut tx = self.pool.begin_with(CLAIM_BEGIN).await.map_err(err)?;
        let mode = if generic {
            include_str!("../../queries/explain_generic_plan.sql")
        } else {
            include_str!("../../queries/explain_custom_plan.sql")
        };
        sqlx::query(mode).execute(&mut *tx).await.map_err(err)?;
        let sql = include_str!("../../queries/explain_analyze.sql")
            .replace("{statement}", &self.q.claim_window);
        let limits = vec![int8(rows); epochs.len()];
        let read = WindowRead {
            epochs: &epochs,
            per_partition: int8(rows),
            partition_limits: &limits,
            rows: rows.saturating_mul(epochs.len()),
            block: true,
            bytes: usize::MAX >> 1,
            first_alone: true,
            follow: None,
        };
        let plan: serde_json::Value = self
            .window_query(&sql, &read)
            .fetch_one(&mut *tx)
            .await
            .and_then(|r| r.try_get(0))
            .map_err(err)?;
        tx.commit().await.map_err(err)?;
        Ok(plan)
    }

    /// Reads the window claim's rows into a ticket and the messages to hand out, one row at a
    /// time (a row's payload is in memory once, as the message's). Returns the messages and
    /// what was measured.
    pub(super) async fn read_windows(
        &self,
        tx: &mut sqlx::PgConnection,
        read: WindowRead<'_>,
        ticket: &mut Ticket,
    ) -> Result<(Vec<Message>, Measured)> {
        let err = |e| map_sqlx_error("claiming from the outbox windows", e);
        let mut rows = self
            .window_query(&self.q.claim_window, &read)
            .fetch(&mut *tx);
        let mut messages = Vec::new();
        let mut returned: HashMap<i16, i64> = HashMap::new();
        let mut measured = (0i64, 0i64);
        while let Some(r) = rows.try_next().await.map_err(err)? {
            let partition: i16 = r.try_get("partition").map_err(err)?;
            if let std::collections::hash_map::Entry::Vacant(slot) = ticket.windows.entry(partition)
            {
                let found: i64 = r.try_get("window_rows").map_err(err)?;
                let full: bool = r.try_get("parked_full").map_err(err)?;
                let scan_to: Option<i64> = r.try_get("scan_to").map_err(err)?;
                let limit = read
                    .epochs
                    .iter()
                    .position(|(p, _)| *p == partition)
                    .and_then(|i| read.partition_limits.get(i))
                    .copied()
                    .unwrap_or(read.per_partition);
                let short = found < limit && !full;
                if full {
                    ticket.full_partitions.push(partition);
                }
                slot.insert(Window {
                    partition,
                    epoch: r.try_get("epoch").map_err(err)?,
                    prev_id: r.try_get("prev_id").map_err(err)?,
                    parked: r.try_get("parked").map_err(err)?,
                    done: r.try_get("done").map_err(err)?,
                    done_bound: r.try_get("done_bound").map_err(err)?,
                    done_floor: r.try_get("done_floor").map_err(err)?,
                    done_at: r.try_get("done_at").map_err(err)?,
                    published: r.try_get("published").map_err(err)?,
                    cur: r.try_get("cur").map_err(err)?,
                    cur_bound: r.try_get("cur_bound").map_err(err)?,
                    cur_floor: r.try_get("cur_floor").map_err(err)?,
                    cur_at: r.try_get("cur_at").map_err(err)?,
                    cursor: r.try_get("cursor").map_err(err)?,
                    found,
                    // A partition at the parking cap read nothing: never close its window. A
                    // walk that stopped at the end of its span did not reach the window's end.
                    exhausted_if_all_read: short && scan_to.is_none(),
                    read_to: scan_to.filter(|_| short),
                });
            }
            let Some(seq) = r.try_get::<Option<i64>, _>("seq").map_err(err)? else {
                continue;
            };
            *returned.entry(partition).or_default() += 1;
            let held: bool = r.try_get("held").map_err(err)?;
            if !held {
                // Running totals: the last row's are the claim's.
                measured = (
                    r.try_get("handed_upto").map_err(err)?,
                    r.try_get::<Option<i64>, _>("bytes_upto")
                        .map_err(err)?
                        .unwrap_or(0),
                );
            }
            // No payload: past the byte bound, not handed out (nor is anything after it).
            let payload: Option<String> = r.try_get("payload").map_err(err)?;
            let key: String = r.try_get("aggregate_id").map_err(err)?;
            let txid: String = r.try_get("txid").map_err(err)?;
            ticket.rows.push(WindowRow {
                partition,
                seq,
                txid,
                key: key.clone(),
                held,
                handed_out: !held && payload.is_some(),
            });
            if let (false, Some(payload)) = (held, payload) {
                messages.push(Message {
                    seq,
                    id: r.try_get("id").map_err(err)?,
                    aggregate_type: r.try_get("aggregate_type").map_err(err)?,
                    aggregate_id: key,
                    event_type: r.try_get("event_type").map_err(err)?,
                    payload: payload.into(),
                    headers: r.try_get("headers").map_err(err)?,
                    topic: r.try_get("topic").map_err(err)?,
                    created_at: r.try_get("created_at").map_err(err)?,
                    attempts: 0,
                });
            }
        }
        // A partition whose rows the statement's overall LIMIT cut is not read to its end.
        for w in ticket.windows.values_mut() {
            if returned.get(&w.partition).copied().unwrap_or(0) < w.found {
                w.exhausted_if_all_read = false;
                w.read_to = None;
            }
        }
        let mut m = Measured::default();
        m.add(measured.0, measured.1);
        Ok((messages, m))
    }

    /// Reads the due parked messages within `rows` and `bytes` (the first one alone whatever
    /// its size), one row at a time.
    pub(super) async fn read_parked(
        &self,
        tx: &mut sqlx::PgConnection,
        parts: &[i16],
        rows: usize,
        bytes: usize,
        block: bool,
        ticket: &mut Ticket,
    ) -> Result<(Vec<Message>, Measured, Option<DateTime<Utc>>)> {
        let err = |e| map_sqlx_error("claiming parked messages", e);
        let mut keyed: std::collections::HashSet<i16> = std::collections::HashSet::new();
        let mut stream = sqlx::query(&self.q.claim_parked)
            .bind(parts)
            .bind(int8(rows))
            .bind(block)
            .bind(int8(rows))
            .bind(int8(bytes))
            .bind(true)
            .fetch(&mut *tx);
        let mut messages = Vec::new();
        let mut measured = (0i64, 0i64);
        let mut next_due = None;
        while let Some(r) = stream.try_next().await.map_err(err)? {
            next_due = r.try_get("next_due").map_err(err)?;
            if let Some(p) = r.try_get::<Option<Vec<i16>>, _>("keyed").map_err(err)? {
                keyed.extend(p);
            }
            let Some(partition) = r.try_get::<Option<i16>, _>("partition").map_err(err)? else {
                continue; // the `next_due` row alone: nothing parked is due
            };
            measured = (
                r.try_get("handed_upto").map_err(err)?,
                r.try_get("bytes_upto").map_err(err)?,
            );
            let m = Message {
                seq: r.try_get("seq").map_err(err)?,
                id: r.try_get("id").map_err(err)?,
                aggregate_type: r.try_get("aggregate_type").map_err(err)?,
                aggregate_id: r.try_get("aggregate_id").map_err(err)?,
                event_type: r.try_get("event_type").map_err(err)?,
                payload: r.try_get::<String, _>("payload").map_err(err)?.into(),
                headers: r.try_get("headers").map_err(err)?,
                topic: r.try_get("topic").map_err(err)?,
                created_at: r.try_get("created_at").map_err(err)?,
                attempts: r.try_get("attempts").map_err(err)?,
            };
            ticket.parked.insert(
                m.seq,
                ParkedRow {
                    partition,
                    key: m.aggregate_id.clone(),
                },
            );
            messages.push(m);
        }
        drop(stream);
        if block {
            ticket.parked_empty = parts
                .iter()
                .copied()
                .filter(|p| !keyed.contains(p))
                .collect();
        }
        let mut m = Measured::default();
        m.add(measured.0, measured.1);
        Ok((messages, m, next_due))
    }
}
