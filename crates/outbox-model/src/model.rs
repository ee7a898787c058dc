//! The protocol as a stateright [`Model`]: the actions writers, relays, takeovers and retention
//! take, and what each does to the [`State`].
//!
//! Every action is one atomic step of the real system. Writers: lock the key, get a txid (first
//! insert only), the two steps of `nextval`, then commit or roll back. Relays: a claim (one
//! statement: it reads the latest position, takes `cur` and the floor, reads the window's rows,
//! and the batch is published at once, since publishing touches nothing the protocol reads), the
//! start of a record statement, giving up on it, and its landing. A record lands in one step
//! (fence, id, transaction id and append are one statement), so the latest position is always the
//! last one landed: with the ids drawn when the statement runs, `ORDER BY id DESC` means exactly
//! that, and it is why a record that runs late becomes the latest in the buggy protocol.
//! Parking, the CDC relay's steps and the parked claim are in [`crate::parking`]; paths are put
//! in words by [`crate::explain`].

use stateright::{Model, Property};

use crate::config::{Config, Key};
use crate::properties;
use crate::snapshot::{Seq, Snapshot, Xid, MAX_XID};
use crate::state::{
    Claimed, Draft, DraftWindow, Position, Record, Relay, Row, Sequence, Stage, State, TxStatus,
    Writer,
};

/// One step of the system.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// A writer's first insert: it locks the row's key (the writer API's advisory lock), then
    /// the insert evaluates `txid`'s default: it gets its id.
    AssignTxid {
        /// The writer.
        writer: u8,
        /// The key it locks.
        key: Key,
    },
    /// `nextval` step 1 (after locking the row's key, if this row is not the writer's first):
    /// the tuple shows `last + wal_ahead` while WAL is written.
    WalAhead {
        /// The writer.
        writer: u8,
        /// The key it locks.
        key: Key,
    },
    /// `nextval` step 2: `last += 1`, the row is inserted with it.
    Drawn {
        /// The writer.
        writer: u8,
    },
    /// The writer commits (and releases its locks).
    Commit {
        /// The writer.
        writer: u8,
    },
    /// The writer rolls back (at its end: an earlier rollback is a shorter writer).
    Rollback {
        /// The writer.
        writer: u8,
    },
    /// A relay member claims a batch and publishes it.
    Claim {
        /// The member.
        relay: u8,
        /// Whether the sink fails the first message it is given for good (while failures are
        /// left): parked `failed`, its key's later rows in the batch parked behind it.
        fail: bool,
    },
    /// A relay member hands out the due parked messages (claim_parked.sql) and publishes them;
    /// what it publishes leaves the parked table, what fails is parked `failed`. One step: the
    /// model leaves the record that carries these outcomes out (see [`crate`]).
    ClaimParked {
        /// The member.
        relay: u8,
        /// Whether the sink fails the first message it is given for good.
        fail: bool,
    },
    /// The operator redrives every failed message: each is due again.
    Redrive,
    /// The CDC relay reads the next committed row of `key` from its slot and publishes it, or
    /// parks it behind its key's parked rows, or (failing) parks it `failed`.
    CdcRead {
        /// The key.
        key: Key,
        /// Whether the sink fails it for good.
        fail: bool,
    },
    /// The CDC relay moves the polling position to a mark its slot has passed
    /// (cdc_checkpoint.sql), once: a closed window at a snapshot whose every committed row the
    /// relay has read.
    Checkpoint,
    /// The CDC relay's slot is lost: polling takes over from the position CDC left.
    Fallback,
    /// Maintenance prunes every position but the latest (prune_positions.sql).
    Prune,
    /// The claim statement that opened a window reads the seq floor for it. It is a step of its
    /// own because the statement reads it after taking its snapshot (claim_window.sql's `floor`
    /// CTE runs under the statement's snapshot, taken when the statement began), so writers may
    /// draw in between. Any read before the recording transaction gets its id (the bound) is a
    /// valid floor; a read before the snapshot could only be lower, which A2 tolerates.
    ReadFloor {
        /// The member.
        relay: u8,
    },
    /// A relay member sends the record statement for its published batch.
    Record {
        /// The member.
        relay: u8,
    },
    /// A relay member gives up waiting for its record (deadline); the statement may still run.
    Abandon {
        /// The member.
        relay: u8,
        /// Whether it records the same batch again (else it claims afresh).
        retry: bool,
    },
    /// A record statement runs and commits.
    Land {
        /// The record's id.
        record: u8,
    },
    /// The other member takes the partition over, bumping the epoch.
    Takeover {
        /// The new owner.
        to: u8,
    },
    /// Retention drops the segments below `below`.
    DropSegment {
        /// The end of the dropped segment.
        below: Xid,
    },
}

/// The part of a claim that reads a window row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Part {
    /// B, A1 (or A3): probed by transaction id.
    Probed,
    /// A2: walked up the seq index from the floor.
    Walked,
}

/// A planned row: its writer and key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlannedRow {
    /// The writer that inserts it.
    pub writer: u8,
    /// Its key.
    pub key: Key,
}

/// The model of one relay partition.
#[derive(Clone, Debug)]
pub struct ProtocolModel {
    pub(crate) cfg: Config,
    pub(crate) plan: Vec<PlannedRow>,
    /// The index in `plan` of each writer's first row.
    first_row: Vec<usize>,
}

impl ProtocolModel {
    /// A model of `cfg`.
    ///
    /// # Panics
    ///
    /// If `cfg` could need more transaction ids or rows than the model tracks, has no writer, a
    /// writer with no row, or a zero batch or segment width.
    pub fn new(cfg: Config) -> Self {
        let ids = 2 + cfg.writers.len() + usize::from(cfg.max_records) + usize::from(cfg.cdc);
        assert!(
            ids <= usize::from(MAX_XID),
            "too many transaction ids for the model"
        );
        assert!(!cfg.writers.is_empty(), "no writer");
        assert!(
            cfg.writers.iter().all(|w| !w.is_empty()),
            "a writer with no row"
        );
        assert!(
            cfg.batch > 0 && cfg.segment_width > 0,
            "zero batch or segment width"
        );
        let mut plan = Vec::new();
        let mut first_row = Vec::new();
        for (w, keys) in cfg.writers.iter().enumerate() {
            first_row.push(plan.len());
            for &key in keys {
                plan.push(PlannedRow {
                    writer: w as u8,
                    key,
                });
            }
        }
        Self {
            cfg,
            plan,
            first_row,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The planned rows, in the order of [`State::rows`].
    pub fn plan(&self) -> &[PlannedRow] {
        &self.plan
    }

    /// The id of a writer's next row.
    pub(crate) fn row_index(&self, w: usize, s: &State) -> usize {
        self.first_row[w] + usize::from(s.writers[w].next_row)
    }

    /// Whether row `i` (inserted as `row`) is visible in `snap`: its transaction had completed
    /// when `snap` was taken, and committed.
    pub fn visible(&self, s: &State, i: usize, row: &Row, snap: &Snapshot) -> bool {
        snap.completed(row.txid)
            && s.writers[usize::from(self.plan[i].writer)].status == TxStatus::Committed
    }

    /// Whether `p` has passed row `i`: visible in `done`, or in its open window at or below the
    /// cursor.
    pub fn passed(&self, s: &State, p: &Position, i: usize, row: &Row) -> bool {
        self.visible(s, i, row, &p.done)
            || p.cur
                .is_some_and(|w| row.seq <= p.cursor && self.visible(s, i, row, &w.snapshot))
    }

    /// The snapshot a statement would take now.
    pub(crate) fn snapshot_now(s: &State) -> Snapshot {
        let running = s
            .writers
            .iter()
            .filter(|w| w.status == TxStatus::Running)
            .filter_map(|w| w.txid);
        Snapshot::take(s.latest_completed, running)
    }

    /// The seq floor as the claim reads it: under the buffer lock `last`; without it, whatever
    /// the tuple shows, `last + wal_ahead` in the middle of a logged `nextval`.
    pub(crate) fn read_floor(&self, s: &State) -> Seq {
        if self.cfg.bugs.unlocked_floor && s.sequence.drawing.is_some() {
            s.sequence.last + self.cfg.wal_ahead
        } else {
            s.sequence.last
        }
    }

    /// Which part of the window `(p.done, cur)` after `cursor` reads row `i`, read the way
    /// claim_window.sql reads it (`None`: the row is not in the window).
    fn part(
        &self,
        s: &State,
        p: &Position,
        cur: &DraftWindow,
        cursor: Seq,
        i: usize,
        row: &Row,
    ) -> Option<Part> {
        let t = row.txid;
        // A dropped segment's rows are gone from every read.
        if t < s.dropped_below || row.seq <= cursor || !self.visible(s, i, row, &cur.snapshot) {
            return None;
        }
        // B: transactions `done` saw running.
        let b = p.done.in_progress(t);
        // A1: ids from xmax(done) up to done_bound, probed by txid.
        let a1 = t >= p.done.xmax() && t < p.done_bound;
        // A2: ids at or above done_bound, walked up the seq index from the floor. This is the
        // part that trusts the floor.
        let a2 = t >= p.done_bound && row.seq > p.done_floor;
        // A3: the net under A2's floor, read while the cursor is still below it.
        let a3 = self.cfg.safety_net
            && t >= p.done_bound
            && row.seq <= p.done_floor
            && cursor < p.done_floor;
        if a2 {
            Some(Part::Walked)
        } else if b || a1 || a3 {
            Some(Part::Probed)
        } else {
            None
        }
    }

    /// The rows a claim reads from the window `(p.done, cur)` after `cursor`, in seq order (at
    /// most a batch), and where A2's walk stopped when its span ended before the window could.
    ///
    /// With a span, the walk reads seqs `(low, low + span]` from `low = max(cursor,
    /// done_floor)`, no further than the batch-th probed row (B, A1) if there are that many. If
    /// `low + span` is below the floor the statement reads (rows past it are not visible in
    /// `cur`), the window may go on past the walk: rows above its end are dropped, since A2 rows
    /// may sit below them unread, and the end is returned.
    fn read_window(
        &self,
        s: &State,
        p: &Position,
        cur: &DraftWindow,
        cursor: Seq,
    ) -> (Vec<(Seq, usize)>, Option<Seq>) {
        let batch = usize::from(self.cfg.batch);
        let mut probed = Vec::new();
        let mut walked = Vec::new();
        for (i, r) in s.rows.iter().enumerate() {
            let Some(row) = r else { continue };
            match self.part(s, p, cur, cursor, i, row) {
                Some(Part::Probed) => probed.push((row.seq, i)),
                Some(Part::Walked) => walked.push((row.seq, i)),
                None => {}
            }
        }
        probed.sort_unstable();
        let Some(span) = self.cfg.walk_span else {
            let mut found = [probed, walked].concat();
            found.sort_unstable();
            found.truncate(batch);
            return (found, None);
        };
        // B and A1 read at most a batch.
        probed.truncate(batch);
        let reach = cursor.max(p.done_floor).saturating_add(span);
        // No row of the window lies above `cur_floor` (read after `cur` was taken), nor above the
        // floor read now: the walk ends the window past the lower of the two
        // (`LEAST(seq_high, cur_floor)`). A window this claim opens has no `cur_floor` yet (it is
        // the floor read by the statement, the next step), so only the floor read now bounds it.
        let high = if p.cur.is_some() {
            self.read_floor(s).min(cur.floor)
        } else {
            self.read_floor(s)
        };
        let edge = (reach < high).then_some(reach);
        let mut found: Vec<(Seq, usize)> = probed
            .into_iter()
            .chain(walked.into_iter().filter(|&(seq, _)| seq <= reach))
            .filter(|&(seq, _)| edge.is_none_or(|e| seq <= e) || self.cfg.bugs.rows_past_the_span)
            .collect();
        found.sort_unstable();
        found.truncate(batch);
        (found, edge)
    }

    /// A claim by `relay` (the action is enabled only for an idle owner, or a member that still
    /// believes it is one).
    fn claim(&self, s: &mut State, relay: usize, fail: bool) -> Option<()> {
        let epoch = s.relays[relay].epoch?;
        let prev = s.latest_id;
        let p = s.latest;
        // With no window open the claim's own snapshot becomes `cur`; its floor is read by the
        // next step (see `Action::ReadFloor`), `done_floor` until then.
        let opens = p.cur.is_none();
        let (cur, cursor) = match p.cur {
            Some(w) => (
                DraftWindow {
                    snapshot: w.snapshot,
                    bound: Some(w.bound),
                    floor: w.floor,
                },
                p.cursor,
            ),
            None => (
                DraftWindow {
                    snapshot: Self::snapshot_now(s),
                    bound: None,
                    floor: p.done_floor,
                },
                0,
            ),
        };
        let (found, edge) = self.read_window(s, &p, &cur, cursor);
        // Under block a row whose key has a parked message is `held` (claim_window.sql's
        // `flagged`): parked behind it, not sent. The first row the sink is given may fail for
        // good; its key's later rows in the batch are not tried and are parked behind it.
        let mut park = 0u16;
        let mut failed = 0u16;
        let mut stopped = 0u8;
        let mut fail = fail && s.failures < self.cfg.max_failures;
        for &(_, i) in &found {
            let key = self.plan[i].key;
            let held = stopped & key.bit() != 0
                || s.parked
                    .iter()
                    .any(|k| self.plan[usize::from(k.row)].key == key);
            if held {
                park |= 1 << i;
            } else if fail {
                fail = false;
                s.failures += 1;
                failed |= 1 << i;
                stopped |= key.bit();
            } else {
                self.send(s, i);
            }
        }
        // Fewer rows than asked for: the window is read to its end (`window_rows` below the
        // limit), unless the walk's span ended first: then the window stays open with the
        // cursor at the span's end (`scan_to`), past rows it read but did not hand out.
        let kept = |cursor| Draft {
            done: p.done,
            done_bound: Some(p.done_bound),
            done_floor: p.done_floor,
            cur: Some(cur),
            cursor,
        };
        let next = match (found.last(), edge) {
            (Some(&(last, _)), _) if found.len() == usize::from(self.cfg.batch) => kept(last),
            (last, Some(edge)) => kept(last.map_or(edge, |&(l, _)| l.max(edge))),
            _ => Draft {
                done: cur.snapshot,
                done_bound: cur.bound,
                done_floor: cur.floor,
                cur: None,
                cursor: 0,
            },
        };
        let claimed = Claimed {
            prev,
            epoch,
            next,
            park,
            fail: failed,
        };
        s.relays[relay].stage = if opens {
            Stage::ReadingFloor(claimed)
        } else {
            Stage::Published(claimed)
        };
        Some(())
    }

    /// The claim statement that opened a window reads the seq floor for it, never below
    /// `done_floor` (GREATEST in claim_window.sql).
    fn floor_read(&self, s: &mut State, relay: usize) -> Option<()> {
        let Stage::ReadingFloor(mut claimed) = s.relays[relay].stage else {
            return None;
        };
        let read = self.read_floor(s);
        // The fresh window is either still open in the draft or closed into its `done`.
        match claimed.next.cur.as_mut() {
            Some(w) => w.floor = w.floor.max(read),
            None => claimed.next.done_floor = claimed.next.done_floor.max(read),
        }
        s.relays[relay].stage = Stage::Published(claimed);
        Some(())
    }

    /// Record statement `id` runs: fenced by the epoch, and (fixed) compare-and-append against
    /// the position its claim read.
    fn land(&self, s: &mut State, id: u8) -> Option<()> {
        let at = s.in_flight.iter().position(|r| r.id == id)?;
        let rec = s.in_flight.remove(at);
        let fenced_in = rec.claimed.epoch == s.epoch;
        let prev = rec.claimed.prev;
        let successor = prev == s.latest_id;
        // The chain's positions are the ids `pruned_below..=latest_id`, each following the one
        // before it: `prev`'s successor is `prev + 1`, gone if pruned.
        let pruned = prev < s.pruned_below;
        let followed = prev < s.latest_id && prev + 1 >= s.pruned_below;
        let lands = fenced_in
            && (self.cfg.bugs.latest_by_highest_id
                || (!followed && (!pruned || self.cfg.bugs.prune_frees_successor)));
        s.pruned_record |= fenced_in && pruned;
        if lands {
            // The recording transaction's id, assigned now: after the claim's snapshot, which
            // is what makes it a bound for A1/A2.
            let xid = s.next_xid;
            s.next_xid += 1;
            s.latest_completed = s.latest_completed.max(xid);
            // Parking depends on the append (record.sql): failures first, then what waits.
            for i in 0..s.rows.len() {
                if rec.claimed.fail & (1 << i) != 0 {
                    self.park_polled(s, i, true);
                }
            }
            for i in 0..s.rows.len() {
                if rec.claimed.park & (1 << i) != 0 {
                    self.park_polled(s, i, false);
                }
            }
            let new = rec.claimed.next.land(rec.claimed.epoch, xid);
            s.passed_unsent |= properties::passes_unsent(self, s, &new);
            s.moved_back |= properties::moves_back(&s.latest, &new);
            s.latest = new;
            s.latest_id += 1;
        }
        let relay = &mut s.relays[usize::from(rec.relay)];
        if matches!(relay.stage, Stage::Recording { record, .. } if record == id) {
            // The member hears the answer only if it was still waiting for it.
            relay.stage = Stage::Idle;
            if !fenced_in {
                relay.epoch = None;
            }
        } else if fenced_in && !successor {
            s.late_record = true;
        }
        Some(())
    }

    /// The writer's next step, if it is enabled.
    fn writer_actions(&self, s: &State, w: usize, actions: &mut Vec<Action>) {
        let writer = &s.writers[w];
        let id = w as u8;
        if writer.status != TxStatus::Running {
            return;
        }
        if usize::from(writer.next_row) == self.cfg.writers[w].len() {
            actions.push(Action::Commit { writer: id });
            actions.push(Action::Rollback { writer: id });
            return;
        }
        let key = self.plan[self.row_index(w, s)].key;
        if s.sequence.drawing == Some(id) {
            actions.push(Action::Drawn { writer: id });
            return;
        }
        // A row's first step takes its key's lock (the writer API's advisory lock): when and
        // whether it waits is unobservable to the relay, so the lock is taken in the same step
        // as what follows it, and the step waits while another running writer holds the key.
        // Keys are locked in plan order, so writers never deadlock.
        let taken = s.writers.iter().enumerate().any(|(o, other)| {
            o != w && other.status == TxStatus::Running && other.locks & key.bit() != 0
        });
        if taken {
            return;
        }
        if writer.txid.is_none() {
            actions.push(Action::AssignTxid { writer: id, key });
        } else if s.sequence.drawing.is_none() {
            actions.push(Action::WalAhead { writer: id, key });
        }
    }

    /// The writer `w` ends.
    fn end(s: &mut State, w: usize, status: TxStatus) {
        let writer = &mut s.writers[w];
        writer.status = status;
        writer.locks = 0;
        if let Some(t) = writer.txid {
            s.latest_completed = s.latest_completed.max(t);
        }
    }
}

impl Model for ProtocolModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        // The migration's transaction (id 1) recorded the first position: `done` taken before
        // it got its id, nothing drawn yet.
        let initial = Position {
            epoch: 0,
            done: Snapshot::take(0, []),
            done_bound: 1,
            done_floor: 0,
            cur: None,
            cursor: 0,
        };
        let idle = |epoch| Relay {
            epoch,
            stage: Stage::Idle,
        };
        vec![State {
            next_xid: 2,
            latest_completed: 1,
            sequence: Sequence {
                last: 0,
                drawing: None,
            },
            writers: vec![
                Writer {
                    status: TxStatus::Running,
                    txid: None,
                    next_row: 0,
                    locks: 0,
                };
                self.cfg.writers.len()
            ],
            rows: vec![None; self.plan.len()],
            latest: initial,
            latest_id: 0,
            passed_unsent: false,
            moved_back: false,
            late_record: false,
            in_flight: Vec::new(),
            records_started: 0,
            abandoned: 0,
            relays: [idle(Some(1)), idle(None)],
            epoch: 1,
            takeovers: 0,
            dropped_below: 0,
            sent: 0,
            out_of_order: false,
            overtaken: false,
            failed_sent: false,
            parked: Vec::new(),
            failures: 0,
            redrives: 0,
            cdc: self.cfg.cdc,
            cdc_handled: 0,
            prunes: 0,
            pruned_below: 0,
            pruned_record: false,
            checkpointed: false,
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        for w in 0..s.writers.len() {
            self.writer_actions(s, w, actions);
        }
        let records_left = s.records_started < self.cfg.max_records;
        for (r, relay) in s.relays.iter().enumerate() {
            let r = r as u8;
            match relay.stage {
                Stage::Idle if relay.epoch.is_some() && records_left && !s.cdc => {
                    actions.push(Action::Claim {
                        relay: r,
                        fail: false,
                    });
                    let fails_left = s.failures < self.cfg.max_failures;
                    if fails_left {
                        actions.push(Action::Claim {
                            relay: r,
                            fail: true,
                        });
                    }
                    // Parked messages are the owner's to publish (a zombie's parked outcomes
                    // are fenced out with its record, which this step leaves out).
                    if relay.epoch == Some(s.epoch) && !self.due_parked(s).is_empty() {
                        actions.push(Action::ClaimParked {
                            relay: r,
                            fail: false,
                        });
                        if fails_left {
                            actions.push(Action::ClaimParked {
                                relay: r,
                                fail: true,
                            });
                        }
                    }
                }
                Stage::ReadingFloor(_) => actions.push(Action::ReadFloor { relay: r }),
                Stage::Published(_) if records_left => actions.push(Action::Record { relay: r }),
                Stage::Recording { .. } if s.abandoned < self.cfg.max_abandons => {
                    actions.push(Action::Abandon {
                        relay: r,
                        retry: true,
                    });
                    actions.push(Action::Abandon {
                        relay: r,
                        retry: false,
                    });
                }
                _ => {}
            }
        }
        for rec in &s.in_flight {
            actions.push(Action::Land { record: rec.id });
        }
        if s.redrives < self.cfg.max_redrives && s.parked.iter().any(|p| p.failed) {
            actions.push(Action::Redrive);
        }
        if s.cdc {
            for key in [Key::A, Key::B] {
                actions.push(Action::CdcRead { key, fail: false });
                if s.failures < self.cfg.max_failures {
                    actions.push(Action::CdcRead { key, fail: true });
                }
            }
            if !s.checkpointed {
                actions.push(Action::Checkpoint);
            }
            actions.push(Action::Fallback);
        }
        if s.prunes < self.cfg.max_prunes && s.pruned_below < s.latest_id {
            actions.push(Action::Prune);
        }
        if s.takeovers < self.cfg.max_takeovers {
            let owner = s.relays.iter().position(|r| r.epoch == Some(s.epoch));
            let to = if owner == Some(0) { 1 } else { 0 };
            actions.push(Action::Takeover { to });
        }
        let next_drop = s.dropped_below + self.cfg.segment_width;
        // droppable.sql: the whole segment lies below xmin(done) of the latest position.
        if next_drop <= s.latest.done.xmin() {
            actions.push(Action::DropSegment { below: next_drop });
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        match action {
            Action::AssignTxid { writer, key } => {
                let w = &mut s.writers[usize::from(writer)];
                w.locks |= key.bit();
                w.txid = Some(s.next_xid);
                s.next_xid += 1;
            }
            Action::WalAhead { writer, key } => {
                s.writers[usize::from(writer)].locks |= key.bit();
                s.sequence.drawing = Some(writer);
            }
            Action::Drawn { writer } => {
                let w = usize::from(writer);
                let i = self.row_index(w, &s);
                s.sequence.last += 1;
                s.sequence.drawing = None;
                s.rows[i] = Some(Row {
                    txid: s.writers[w].txid?,
                    seq: s.sequence.last,
                });
                s.writers[w].next_row += 1;
            }
            Action::Commit { writer } => {
                Self::end(&mut s, usize::from(writer), TxStatus::Committed)
            }
            Action::Rollback { writer } => {
                Self::end(&mut s, usize::from(writer), TxStatus::RolledBack);
            }
            Action::Claim { relay, fail } => self.claim(&mut s, usize::from(relay), fail)?,
            Action::ClaimParked { fail, .. } => self.claim_parked(&mut s, fail)?,
            Action::Redrive => {
                s.redrives += 1;
                for p in &mut s.parked {
                    p.failed = false;
                }
            }
            Action::CdcRead { key, fail } => self.cdc_read(&mut s, key, fail)?,
            Action::Checkpoint => self.cdc_checkpoint(&mut s)?,
            Action::Fallback => s.cdc = false,
            Action::Prune => {
                s.prunes += 1;
                s.pruned_below = s.latest_id;
            }
            Action::ReadFloor { relay } => self.floor_read(&mut s, usize::from(relay))?,
            Action::Record { relay } => {
                let r = usize::from(relay);
                let Stage::Published(claimed) = s.relays[r].stage else {
                    return None;
                };
                let id = s.records_started;
                s.records_started += 1;
                s.in_flight.push(Record { id, relay, claimed });
                s.relays[r].stage = Stage::Recording {
                    record: id,
                    claimed,
                };
            }
            Action::Abandon { relay, retry } => {
                let r = usize::from(relay);
                let Stage::Recording { claimed, .. } = s.relays[r].stage else {
                    return None;
                };
                s.abandoned += 1;
                s.relays[r].stage = if retry {
                    Stage::Published(claimed)
                } else {
                    Stage::Idle
                };
            }
            Action::Land { record } => self.land(&mut s, record)?,
            Action::Takeover { to } => {
                s.epoch += 1;
                s.takeovers += 1;
                s.relays[usize::from(to)] = Relay {
                    epoch: Some(s.epoch),
                    stage: Stage::Idle,
                };
            }
            Action::DropSegment { below } => s.dropped_below = below,
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        properties::all(&self.cfg)
    }
}
