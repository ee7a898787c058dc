//! Parking, as the relay does it under `--on-failed block`: a message the sink fails for good
//! is parked `failed` and holds its key; the key's later messages are parked `waiting` behind it
//! (claim_window.sql's `held`, record.sql's `parked`); claim_parked.sql hands out the due ones;
//! a redrive makes failed ones due again. And the CDC relay that parks before its slot is lost,
//! after which polling reads the same rows again (engine review N2).

use crate::config::Key;
use crate::model::ProtocolModel;
use crate::snapshot::Seq;
use crate::state::{Parked, State, TxStatus};

impl ProtocolModel {
    /// Row `i` is published: the order properties are checked against what went out before.
    pub(crate) fn send(&self, s: &mut State, i: usize) {
        s.failed_sent |= s.is_failed(i);
        if s.was_sent(i) {
            return;
        }
        let Some(row) = s.rows[i] else { return };
        let key = self.plan[i].key;
        let same_key = |j: usize| j != i && self.plan[j].key == key;
        s.out_of_order |= s
            .rows
            .iter()
            .enumerate()
            .any(|(j, r)| same_key(j) && s.was_sent(j) && r.is_some_and(|r| r.seq > row.seq));
        s.overtaken |= s.rows.iter().enumerate().any(|(j, r)| {
            same_key(j)
                && !s.was_sent(j)
                && r.is_some_and(|r| r.seq < row.seq)
                && s.writers[usize::from(self.plan[j].writer)].status == TxStatus::Committed
        });
        s.sent |= 1 << i;
    }

    /// Parks row `i` at `seq` (`failed` or waiting), unless that seq is parked already (the
    /// primary key's `ON CONFLICT DO NOTHING`).
    pub(crate) fn park_at(s: &mut State, i: usize, seq: Seq, failed: bool) {
        if s.parked.iter().any(|p| p.seq == seq) {
            return;
        }
        s.parked.push(Parked {
            seq,
            row: i as u8,
            failed,
        });
        s.parked.sort_unstable();
    }

    /// A record that appended parks row `i` (record.sql's `parked`): at its own seq, and
    /// (fixed) not at all if its message is parked already, at whatever seq.
    pub(crate) fn park_polled(&self, s: &mut State, i: usize, failed: bool) {
        if s.is_parked(i) && !self.cfg.bugs.fallback_reparks {
            return;
        }
        if let Some(row) = s.rows[i] {
            Self::park_at(s, i, row.seq, failed);
        }
    }

    /// The due parked messages, as claim_parked.sql hands them out under block: for each key
    /// whose head (lowest parked seq) is not failed, its rows in seq order below its first
    /// failed one (with the bug: every row that is not failed). In seq order.
    pub(crate) fn due_parked(&self, s: &State) -> Vec<Parked> {
        let mut due = Vec::new();
        for key in [Key::A, Key::B] {
            let mut rows = s
                .parked
                .iter()
                .filter(|p| self.plan[usize::from(p.row)].key == key);
            let Some(head) = rows.next() else { continue };
            if head.failed {
                continue;
            }
            due.push(*head);
            for p in rows {
                if !p.failed {
                    due.push(*p);
                } else if !self.cfg.bugs.parked_past_failed {
                    break;
                }
            }
        }
        due.sort_unstable();
        due
    }

    /// A member publishes the due parked messages: released when published, `failed` when the
    /// sink fails one (its key's later ones stay parked behind it).
    pub(crate) fn claim_parked(&self, s: &mut State, fail: bool) -> Option<()> {
        let due = self.due_parked(s);
        if due.is_empty() {
            return None;
        }
        let mut fail = fail && s.failures < self.cfg.max_failures;
        let mut stopped = 0u8;
        for p in due {
            let i = usize::from(p.row);
            let key = self.plan[i].key;
            if stopped & key.bit() != 0 {
                continue;
            }
            let at = s.parked.iter().position(|k| k.seq == p.seq)?;
            if fail {
                fail = false;
                s.failures += 1;
                stopped |= key.bit();
                s.parked[at].failed = true;
            } else {
                s.parked.remove(at);
                self.send(s, i);
            }
        }
        Some(())
    }

    /// The CDC relay reads the next committed row of `key` (a key's rows come in commit order,
    /// which its lock makes seq order): published, or parked behind its key's parked rows, or
    /// parked `failed`. Parked at the row's own seq; with the fallback bug at a fresh one.
    pub(crate) fn cdc_read(&self, s: &mut State, key: Key, fail: bool) -> Option<()> {
        let (_, i) = s
            .rows
            .iter()
            .enumerate()
            .filter(|&(i, r)| {
                self.plan[i].key == key
                    && r.is_some()
                    && s.cdc_handled & (1 << i) == 0
                    && s.writers[usize::from(self.plan[i].writer)].status == TxStatus::Committed
            })
            .filter_map(|(i, r)| r.map(|r| (r.seq, i)))
            .min()?;
        let behind = s
            .parked
            .iter()
            .any(|p| self.plan[usize::from(p.row)].key == key);
        let fail = fail && s.failures < self.cfg.max_failures;
        if !behind && !fail {
            s.cdc_handled |= 1 << i;
            self.send(s, i);
            return Some(());
        }
        let seq = if self.cfg.bugs.fallback_reparks {
            // `nextval`, in one step: the model's draws hold the buffer lock between steps.
            if s.sequence.drawing.is_some() {
                return None;
            }
            s.sequence.last += 1;
            s.sequence.last
        } else {
            s.rows[i]?.seq
        };
        s.cdc_handled |= 1 << i;
        if !behind {
            s.failures += 1;
        }
        Self::park_at(s, i, seq, !behind);
        Some(())
    }

    /// The CDC relay's checkpoint: a mark `S` (a snapshot, the floor read under the lock after
    /// it, and a transaction id assigned after that: the bound) applied once the slot has passed
    /// every commit `S` sees, i.e. once the relay has read every committed row visible in `S`.
    /// One step: the mark taken and applied with nothing in between, the tightest checkpoint.
    pub(crate) fn cdc_checkpoint(&self, s: &mut State) -> Option<()> {
        let snap = Self::snapshot_now(s);
        let unread = s.rows.iter().enumerate().any(|(i, r)| {
            r.is_some_and(|row| self.visible(s, i, &row, &snap)) && s.cdc_handled & (1 << i) == 0
        });
        if unread {
            return None;
        }
        let xid = s.next_xid;
        s.next_xid += 1;
        s.latest_completed = s.latest_completed.max(xid);
        let new = crate::state::Position {
            epoch: s.latest.epoch,
            done: snap,
            done_bound: xid,
            done_floor: s.sequence.last,
            cur: None,
            cursor: 0,
        };
        s.passed_unsent |= crate::properties::passes_unsent(self, s, &new);
        s.moved_back |= crate::properties::moves_back(&s.latest, &new);
        s.latest = new;
        s.latest_id += 1;
        s.checkpointed = true;
        Some(())
    }
}
