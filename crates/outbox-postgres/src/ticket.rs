//! What a claim remembers until its batch is recorded: each partition's window, the rows read
//! from it, and the parked rows handed out; and how outcomes turn into new positions and parked
//! rows (pure logic, unit-tested without a database).

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Utc};
use outbox_core::Outcome;

/// One partition's window as the claim read it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Window {
    pub partition: i16,
    pub epoch: i64,
    /// The id of the position the claim read: the one the next position of this partition
    /// follows (compare-and-append, see `record.sql`).
    pub prev_id: i64,
    /// Parked messages of this partition, as that position counts them.
    pub parked: i64,
    pub done: String,
    pub done_bound: String,
    pub done_floor: i64,
    pub done_at: DateTime<Utc>,
    pub published: i64,
    pub cur: String,
    /// A transaction id assigned after `cur` was taken, once a record set it (`None` for a
    /// snapshot this claim took: the recording transaction's own id becomes it).
    pub cur_bound: Option<String>,
    pub cur_floor: i64,
    pub cur_at: DateTime<Utc>,
    pub cursor: i64,
    /// The window's rows the claim found (at most the per-partition limit).
    pub found: i64,
    /// Whether the claim asked for fewer rows than it could have got: `found` below the limit,
    /// and A2's walk did not stop at the end of its span.
    pub exhausted_if_all_read: bool,
    /// Where A2's walk stopped at the end of its span, when the claim found fewer rows than its
    /// limit (all of them returned): every window row up to there was read, so once all are
    /// handled the cursor moves there, past rows the walk stepped over without handing out.
    pub read_to: Option<i64>,
}

impl Window {
    /// The position after this window was read to its end: `done` becomes `cur`.
    fn closed(&self, published: i64, parked: i64) -> NewPosition {
        NewPosition {
            partition: self.partition,
            epoch: self.epoch,
            prev_id: self.prev_id,
            parked,
            done: self.cur.clone(),
            done_bound: self.cur_bound.clone(),
            done_floor: self.cur_floor,
            done_at: self.cur_at,
            cur: None,
            cur_bound: None,
            cur_floor: None,
            cur_at: None,
            cursor: 0,
            published,
        }
    }

    /// The position with the same `done` and the cursor at `cursor`: the window stays open
    /// (`cur` kept) when the cursor is past its start, else no window is open.
    fn kept(&self, cursor: i64, published: i64, parked: i64) -> NewPosition {
        let open = cursor > 0;
        NewPosition {
            partition: self.partition,
            epoch: self.epoch,
            prev_id: self.prev_id,
            parked,
            done: self.done.clone(),
            done_bound: Some(self.done_bound.clone()),
            done_floor: self.done_floor,
            done_at: self.done_at,
            cur: open.then(|| self.cur.clone()),
            cur_bound: if open { self.cur_bound.clone() } else { None },
            cur_floor: open.then_some(self.cur_floor),
            cur_at: open.then_some(self.cur_at),
            cursor,
            published,
        }
    }
}

/// A row read from a window.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct WindowRow {
    pub partition: i16,
    pub seq: i64,
    pub txid: String,
    pub key: String,
    /// Its key had a parked message ahead of it at claim time: it is parked too, not sent.
    pub held: bool,
    /// Handed to the relay (false when held, or cut by the batch limit).
    pub handed_out: bool,
}

/// A parked row handed out again.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ParkedRow {
    pub partition: i16,
    pub key: String,
}

/// Everything `complete` needs to record one claim.
#[derive(Debug, Clone, Default)]
pub(crate) struct Ticket {
    pub windows: HashMap<i16, Window>,
    /// Window rows in seq order.
    pub rows: Vec<WindowRow>,
    pub parked: HashMap<i64, ParkedRow>,
    /// Partitions whose window was not read because they hold the parking cap.
    pub full_partitions: Vec<i16>,
    /// Partitions the claim found no parked message in (under the `block` policy, which reads
    /// every parked row's key). Their positions' counts are reset to 0 if they say otherwise:
    /// a parked row deleted by hand (`DELETE FROM outbox_parked`, a documented way to drop a
    /// failed message) is not counted by any record.
    pub parked_empty: HashSet<i16>,
}

/// A new position to append.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct NewPosition {
    pub partition: i16,
    pub epoch: i64,
    /// The position this one follows; the append fails if that one already has a successor.
    pub prev_id: i64,
    /// Parked messages of the partition once this record's parking and releases are applied.
    pub parked: i64,
    pub done: String,
    /// `None`: the recording transaction's own id (assigned after the snapshot was taken).
    pub done_bound: Option<String>,
    pub done_floor: i64,
    pub done_at: DateTime<Utc>,
    pub cur: Option<String>,
    /// As `done_bound`, for `cur` (ignored when `cur` is `None`).
    pub cur_bound: Option<String>,
    pub cur_floor: Option<i64>,
    pub cur_at: Option<DateTime<Utc>>,
    pub cursor: i64,
    pub published: i64,
}

/// A window row to copy into the parked table.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Park {
    pub partition: i16,
    pub txid: String,
    pub seq: i64,
    /// `retrying`, `failed` or `waiting`.
    pub state: &'static str,
    pub attempts: i32,
    pub delay_secs: f64,
    pub error: Option<String>,
}

/// A parked row tried again.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Retried {
    pub partition: i16,
    pub seq: i64,
    /// `published`, `retrying` or `failed`.
    pub outcome: &'static str,
    pub delay_secs: f64,
    pub error: Option<String>,
}

/// The writes one `complete` makes.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Plan {
    /// (partition, epoch) pairs to fence on.
    pub fence: Vec<(i16, i64)>,
    pub positions: Vec<NewPosition>,
    pub park: Vec<Park>,
    pub retried: Vec<Retried>,
    /// Outcomes taken into account, per partition.
    pub applied: HashMap<i16, u64>,
}

impl Plan {
    /// Whether there is anything to write.
    pub fn is_empty(&self) -> bool {
        self.positions.is_empty() && self.park.is_empty() && self.retried.is_empty()
    }
}

impl Ticket {
    /// The positions recording this batch writes if every message handed out is published,
    /// when a claim may read on from them before they are written ([`Store::claim_ahead`]):
    /// `None` when the batch handed out parked messages, holds or parks any row, reads a
    /// partition at the parking cap, or closes a window (the next `done_bound` is the id of the
    /// transaction that records it, unknown until then).
    ///
    /// [`Store::claim_ahead`]: outbox_core::Store::claim_ahead
    pub fn follow_on(&self) -> Option<Vec<NewPosition>> {
        if !self.parked.is_empty()
            || !self.full_partitions.is_empty()
            || self.rows.iter().any(|r| r.held)
        {
            return None;
        }
        let outcomes: Vec<Outcome> = self
            .rows
            .iter()
            .filter(|r| r.handed_out)
            .map(|r| Outcome::Published { seq: r.seq })
            .collect();
        if outcomes.is_empty() {
            return None;
        }
        let plan = self.plan(&outcomes, false);
        let keeps_open = plan.positions.iter().all(|p| p.cur.is_some());
        (plan.park.is_empty() && plan.retried.is_empty() && keeps_open).then_some(plan.positions)
    }

    /// Turns the outcomes of this ticket's batch into the writes that record it.
    ///
    /// Per partition, the window rows are walked in seq order. A published row counts; a
    /// retried or failed row is parked with its error; a row whose key is stopped (held at
    /// claim time, or behind a failure of its key in this batch) is parked as `waiting`. The
    /// first row that has no outcome and whose key is not stopped was not tried: the cursor
    /// stops just before it, and outcomes of later rows in that partition are not recorded
    /// (they will be handed out again, same ids). A window read to its end and fully handled
    /// closes: `done` becomes `cur`.
    ///
    /// `idle_advance`: also close windows that were empty (no rows at all), which moves `done`
    /// forward for retention; callers rate-limit it.
    pub fn plan(&self, outcomes: &[Outcome], idle_advance: bool) -> Plan {
        // Long because: one pass over the windows; its steps share the stopped keys.
        let by_seq: HashMap<i64, &Outcome> = outcomes.iter().map(|o| (o.seq(), o)).collect();
        let mut plan = Plan::default();
        // Keys stopped by a failure anywhere in the batch (window or parked rows).
        let mut stopped: HashSet<(i16, &str)> = HashSet::new();
        let mut published_parked: HashMap<i16, i64> = HashMap::new();
        for (seq, p) in &self.parked {
            let Some(o) = by_seq.get(seq) else { continue };
            *plan.applied.entry(p.partition).or_default() += 1;
            let (outcome, delay_secs, error) = match o {
                Outcome::Published { .. } => {
                    *published_parked.entry(p.partition).or_default() += 1;
                    ("published", 0.0, None)
                }
                Outcome::Retry { error, delay, .. } => {
                    stopped.insert((p.partition, p.key.as_str()));
                    ("retrying", delay.as_secs_f64(), Some(error.clone()))
                }
                // `record.sql` keeps it retrying without counting an attempt.
                Outcome::Deferred { error, delay, .. } => {
                    stopped.insert((p.partition, p.key.as_str()));
                    ("deferred", delay.as_secs_f64(), Some(error.clone()))
                }
                Outcome::Failed { error, .. } => {
                    stopped.insert((p.partition, p.key.as_str()));
                    ("failed", 0.0, Some(error.clone()))
                }
            };
            plan.retried.push(Retried {
                partition: p.partition,
                seq: *seq,
                outcome,
                delay_secs,
                error,
            });
        }
        let mut by_partition: HashMap<i16, Vec<&WindowRow>> = HashMap::new();
        for r in &self.rows {
            by_partition.entry(r.partition).or_default().push(r);
        }
        for (partition, w) in &self.windows {
            let rows = by_partition
                .get(partition)
                .map(Vec::as_slice)
                .unwrap_or(&[]);
            let mut published = 0i64;
            let mut last_handled: Option<i64> = None;
            let mut complete = true;
            for r in rows {
                let key = (r.partition, r.key.as_str());
                let outcome = if r.handed_out {
                    by_seq.get(&r.seq)
                } else {
                    None
                };
                let park = |state, attempts, delay_secs, error| Park {
                    partition: r.partition,
                    txid: r.txid.clone(),
                    seq: r.seq,
                    state,
                    attempts,
                    delay_secs,
                    error,
                };
                match outcome {
                    Some(Outcome::Published { .. }) => published += 1,
                    Some(Outcome::Retry { error, delay, .. }) => {
                        stopped.insert(key);
                        plan.park.push(park(
                            "retrying",
                            1,
                            delay.as_secs_f64(),
                            Some(error.clone()),
                        ));
                    }
                    Some(Outcome::Deferred { error, delay, .. }) => {
                        stopped.insert(key);
                        plan.park.push(park(
                            "retrying",
                            0,
                            delay.as_secs_f64(),
                            Some(error.clone()),
                        ));
                    }
                    Some(Outcome::Failed { error, .. }) => {
                        stopped.insert(key);
                        plan.park.push(park("failed", 1, 0.0, Some(error.clone())));
                    }
                    // The same message already parked (an upgraded backlog holds rows in both
                    // places): its parked copy was handed out and is recorded above; parking it
                    // again in the same statement could re-create a row that one deletes.
                    None if r.held && self.parked.contains_key(&r.seq) => {
                        stopped.insert(key);
                    }
                    None if r.held || stopped.contains(&key) => {
                        stopped.insert(key);
                        plan.park.push(park("waiting", 0, 0.0, None));
                    }
                    None => {
                        complete = false;
                        break;
                    }
                }
                if outcome.is_some() {
                    *plan.applied.entry(*partition).or_default() += 1;
                }
                last_handled = Some(r.seq);
            }
            let published_total =
                w.published + published + published_parked.remove(partition).unwrap_or(0);
            // An empty fresh window is recorded only now and then (`idle_advance`): that write
            // would otherwise follow every empty poll. An open window read to its end closes at
            // once: left open, it would hide the rows written since its snapshot.
            let was_open = w.cursor > 0;
            let closes = complete
                && w.exhausted_if_all_read
                && (!rows.is_empty() || idle_advance || was_open);
            let read_to = w.read_to.filter(|_| complete);
            let position = if closes {
                Some(w.closed(published_total, w.parked))
            } else if let Some(edge) = read_to {
                Some(w.kept(
                    edge.max(last_handled.unwrap_or(0)),
                    published_total,
                    w.parked,
                ))
            } else if let Some(cursor) = last_handled {
                Some(w.kept(cursor, published_total, w.parked))
            } else if published_total != w.published {
                // Only parked rows were published: keep the window, carry the new total.
                Some(w.kept(w.cursor, published_total, w.parked))
            } else {
                None
            };
            if let Some(p) = position {
                plan.positions.push(p);
            }
        }
        // Every partition this record writes anything for gets a position, carrying its parked
        // count: parking and releases are applied only with an appended position (compare-and-
        // append), and the count is what claims read instead of the parked table.
        let mut parked_delta: HashMap<i16, i64> = HashMap::new();
        for k in &plan.park {
            *parked_delta.entry(k.partition).or_default() += 1;
        }
        for r in &plan.retried {
            let d = parked_delta.entry(r.partition).or_default();
            if r.outcome == "published" {
                *d -= 1;
            }
        }
        for w in self.windows.values() {
            if self.parked_empty.contains(&w.partition) && w.parked != 0 {
                parked_delta.entry(w.partition).or_default();
            }
        }
        for (partition, delta) in parked_delta {
            let Some(w) = self.windows.get(&partition) else {
                continue;
            };
            let base = if self.parked_empty.contains(&partition) {
                0
            } else {
                w.parked
            };
            match plan.positions.iter_mut().find(|p| p.partition == partition) {
                Some(p) => p.parked = base + delta,
                None => plan
                    .positions
                    .push(w.kept(w.cursor, w.published, base + delta)),
            }
        }
        let fence: HashMap<i16, i64> = plan
            .positions
            .iter()
            .map(|p| (p.partition, p.epoch))
            .collect();
        plan.fence = fence.into_iter().collect();
        plan.fence.sort_unstable();
        plan.positions.sort_by_key(|p| p.partition);
        plan
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::time::Duration;

    use super::*;

    fn window(partition: i16, found: i64, exhausted: bool) -> Window {
        let t = Utc::now();
        Window {
            partition,
            epoch: 7,
            prev_id: 40,
            parked: 0,
            done: "10:10:".into(),
            done_bound: "12".into(),
            done_floor: 0,
            done_at: t,
            published: 5,
            cur: "20:20:".into(),
            cur_bound: None,
            cur_floor: 3,
            cur_at: t,
            cursor: 0,
            found,
            exhausted_if_all_read: exhausted,
            read_to: None,
        }
    }

    fn row(partition: i16, seq: i64, key: &str) -> WindowRow {
        WindowRow {
            partition,
            seq,
            txid: "15".into(),
            key: key.into(),
            held: false,
            handed_out: true,
        }
    }

    fn ticket(rows: Vec<WindowRow>, exhausted: bool) -> Ticket {
        let mut t = Ticket::default();
        t.windows.insert(0, window(0, rows.len() as i64, exhausted));
        t.rows = rows;
        t
    }

    #[test]
    fn a_fully_published_exhausted_window_closes() {
        let t = ticket(vec![row(0, 1, "a"), row(0, 2, "b")], true);
        let p = t.plan(
            &[Outcome::Published { seq: 1 }, Outcome::Published { seq: 2 }],
            false,
        );
        assert_eq!(p.positions.len(), 1);
        let pos = &p.positions[0];
        assert_eq!(
            (pos.done.as_str(), pos.cur.as_ref(), pos.cursor),
            ("20:20:", None, 0)
        );
        assert_eq!((pos.done_floor, pos.published), (3, 7));
        assert_eq!(p.fence, vec![(0, 7)]);
    }

    #[test]
    fn a_window_cut_by_the_limit_keeps_its_snapshot_and_moves_the_cursor() {
        let t = ticket(vec![row(0, 1, "a"), row(0, 2, "b")], false);
        let p = t.plan(
            &[Outcome::Published { seq: 1 }, Outcome::Published { seq: 2 }],
            false,
        );
        let pos = &p.positions[0];
        assert_eq!(
            (pos.done.as_str(), pos.cur.as_deref(), pos.cursor),
            ("10:10:", Some("20:20:"), 2)
        );
    }

    #[test]
    fn a_read_ahead_follows_a_window_left_open_from_where_the_batch_leaves_it() {
        let t = ticket(vec![row(0, 1, "a"), row(0, 2, "b")], false);
        let next = t.follow_on().expect("the window stays open");
        assert_eq!(
            next,
            t.plan(
                &[Outcome::Published { seq: 1 }, Outcome::Published { seq: 2 }],
                false
            )
            .positions
        );
        assert_eq!(
            (next[0].cur.as_deref(), next[0].cursor),
            (Some("20:20:"), 2)
        );
    }

    #[test]
    fn no_read_ahead_past_a_closing_window_a_held_row_or_a_parked_message() {
        // Read to its end: the next window's bound is the recording transaction's id.
        assert_eq!(ticket(vec![row(0, 1, "a")], true).follow_on(), None);
        let mut held = ticket(vec![row(0, 1, "a"), row(0, 2, "b")], false);
        held.rows[1].held = true;
        assert_eq!(held.follow_on(), None);
        let mut parked = ticket(vec![row(0, 2, "b")], false);
        parked.parked.insert(
            1,
            ParkedRow {
                partition: 0,
                key: "a".into(),
            },
        );
        assert_eq!(parked.follow_on(), None);
        // Nothing handed out: nothing to follow.
        let mut cut = ticket(vec![row(0, 1, "a")], false);
        cut.rows[0].handed_out = false;
        assert_eq!(cut.follow_on(), None);
    }

    #[test]
    fn a_failure_parks_its_key_and_later_rows_wait_behind_it() {
        let t = ticket(vec![row(0, 1, "a"), row(0, 2, "b"), row(0, 3, "a")], true);
        let p = t.plan(
            &[
                Outcome::Retry {
                    seq: 1,
                    error: "down".into(),
                    delay: Duration::from_secs(1),
                },
                Outcome::Published { seq: 2 },
            ],
            false,
        );
        let parked: Vec<_> = p.park.iter().map(|k| (k.seq, k.state)).collect();
        assert_eq!(parked, vec![(1, "retrying"), (3, "waiting")]);
        assert_eq!(
            p.positions[0].cur, None,
            "the window is fully handled and closes"
        );
        assert_eq!(p.positions[0].published, 6);
    }

    #[test]
    fn an_untried_row_stops_the_cursor_before_it() {
        let t = ticket(vec![row(0, 1, "a"), row(0, 2, "b"), row(0, 3, "c")], true);
        let p = t.plan(
            &[Outcome::Published { seq: 1 }, Outcome::Published { seq: 3 }],
            false,
        );
        let pos = &p.positions[0];
        assert_eq!((pos.cur.is_some(), pos.cursor, pos.published), (true, 1, 6));
    }

    #[test]
    fn held_rows_are_parked_without_being_sent() {
        let mut r = row(0, 1, "a");
        r.held = true;
        r.handed_out = false;
        let t = ticket(vec![r], true);
        let p = t.plan(&[], false);
        assert_eq!(p.park.len(), 1);
        assert_eq!(p.park[0].state, "waiting");
        assert_eq!(p.positions[0].cur, None);
    }

    #[test]
    fn an_open_window_read_to_its_end_closes_even_without_rows() {
        let mut t = ticket(vec![], true);
        if let Some(w) = t.windows.get_mut(&0) {
            w.cursor = 42;
        }
        let p = t.plan(&[], false);
        assert_eq!(p.positions.len(), 1);
        assert_eq!(
            (p.positions[0].done.as_str(), p.positions[0].cur.as_ref()),
            ("20:20:", None)
        );
    }

    #[test]
    fn a_walk_that_spent_its_budget_keeps_the_window_open_and_moves_the_cursor_to_its_end() {
        // Two rows handed out, then 300 rows of a transaction still running stepped over.
        let mut t = ticket(vec![row(0, 5, "a"), row(0, 9, "b")], false);
        t.windows.get_mut(&0).unwrap().read_to = Some(309);
        let published = [Outcome::Published { seq: 5 }, Outcome::Published { seq: 9 }];
        let p = t.plan(&published, false);
        let pos = &p.positions[0];
        assert_eq!(
            (
                pos.done.as_str(),
                pos.cur.as_deref(),
                pos.cursor,
                pos.published
            ),
            ("10:10:", Some("20:20:"), 309, 7)
        );
        // With nothing found at all, the cursor still moves, at once (not only when idle).
        let mut t = ticket(vec![], false);
        t.windows.get_mut(&0).unwrap().read_to = Some(256);
        let p = t.plan(&[], false);
        assert_eq!(
            (p.positions[0].cur.as_deref(), p.positions[0].cursor),
            (Some("20:20:"), 256)
        );
    }

    #[test]
    fn a_walk_that_spent_its_budget_moves_no_cursor_past_a_row_not_tried() {
        let mut t = ticket(vec![row(0, 5, "a"), row(0, 9, "b")], false);
        t.windows.get_mut(&0).unwrap().read_to = Some(309);
        let p = t.plan(&[Outcome::Published { seq: 5 }], false);
        assert_eq!(p.positions[0].cursor, 5);
    }

    #[test]
    fn empty_windows_advance_only_when_asked() {
        let t = ticket(vec![], true);
        assert!(t.plan(&[], false).is_empty());
        let p = t.plan(&[], true);
        assert_eq!(p.positions.len(), 1);
        assert_eq!(p.positions[0].done, "20:20:");
    }

    #[test]
    fn a_published_parked_row_is_released_and_counted() {
        let mut t = ticket(vec![], false);
        t.parked.insert(
            9,
            ParkedRow {
                partition: 0,
                key: "a".into(),
            },
        );
        let p = t.plan(&[Outcome::Published { seq: 9 }], false);
        assert_eq!(p.retried[0].outcome, "published");
        assert_eq!(p.positions[0].published, 6);
        assert_eq!(p.applied[&0], 1);
    }

    #[test]
    fn every_position_follows_the_one_its_claim_read_and_counts_parked_messages() {
        let mut t = ticket(vec![row(0, 1, "a"), row(0, 2, "a")], true);
        if let Some(w) = t.windows.get_mut(&0) {
            w.parked = 3;
        }
        let p = t.plan(
            &[Outcome::Retry {
                seq: 1,
                error: "down".into(),
                delay: Duration::from_secs(1),
            }],
            false,
        );
        let pos = &p.positions[0];
        assert_eq!(pos.prev_id, 40, "compare-and-append on the position read");
        assert_eq!(
            pos.parked, 5,
            "3 parked before, the retry and the row behind it"
        );
    }

    #[test]
    fn a_record_that_only_retries_parked_messages_still_appends_a_position() {
        // Parking and releases are applied only with an appended position: a batch that
        // tried a parked message again and failed must carry one, unchanged but for counts.
        let mut t = ticket(vec![], false);
        if let Some(w) = t.windows.get_mut(&0) {
            w.parked = 2;
        }
        t.parked.insert(
            9,
            ParkedRow {
                partition: 0,
                key: "a".into(),
            },
        );
        let p = t.plan(
            &[Outcome::Retry {
                seq: 9,
                error: "down".into(),
                delay: Duration::from_secs(1),
            }],
            false,
        );
        assert_eq!(p.positions.len(), 1);
        let pos = &p.positions[0];
        assert_eq!(
            (pos.done.as_str(), pos.cur.as_deref(), pos.cursor),
            ("10:10:", None, 0),
            "the window as it was"
        );
        assert_eq!((pos.published, pos.parked), (5, 2));
        assert_eq!(p.fence, vec![(0, 7)]);
        let released = t.plan(&[Outcome::Published { seq: 9 }], false);
        assert_eq!(released.positions[0].parked, 1);
    }
}
