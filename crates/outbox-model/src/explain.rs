//! Counterexample paths in words: one line per step, with what it did to the rows, the
//! positions and the parked table, so a failing check reads like a trace of the relay.

use std::fmt::Write as _;

use stateright::Path;

use crate::model::{Action, ProtocolModel};
use crate::state::{Position, Stage, State};

impl ProtocolModel {
    /// A readable account of a path: one line per step, with what it did.
    pub fn explain(&self, path: &Path<State, Action>) -> String {
        let mut out = String::new();
        let steps = path.clone().into_vec();
        for (n, (before, action)) in steps.iter().enumerate() {
            let Some(action) = action else { continue };
            let Some((after, _)) = steps.get(n + 1) else {
                continue;
            };
            let _ = writeln!(out, "{:2}. {}", n + 1, self.describe(before, action, after));
        }
        out
    }

    /// A row as `key/seq(xid)`.
    fn row_text(&self, s: &State, i: usize) -> String {
        match s.rows[i] {
            Some(row) => format!("{:?}/{}(x{})", self.plan[i].key, row.seq, row.txid),
            None => format!("{:?}/-", self.plan[i].key),
        }
    }

    /// The rows first sent by the step from `before` to `after`.
    fn newly_sent(&self, before: &State, after: &State) -> Vec<String> {
        (0..after.rows.len())
            .filter(|&i| after.was_sent(i) && !before.was_sent(i))
            .map(|i| self.row_text(after, i))
            .collect()
    }

    /// The parked table as `[seq: key/seq(xid) state, …]`.
    fn parked_text(&self, s: &State) -> String {
        let rows: Vec<String> = s
            .parked
            .iter()
            .map(|p| {
                format!(
                    "{}: {} {}",
                    p.seq,
                    self.row_text(s, usize::from(p.row)),
                    if p.failed { "failed" } else { "waiting" }
                )
            })
            .collect();
        format!("[{}]", rows.join(", "))
    }

    /// One step of [`Self::explain`].
    fn describe(&self, before: &State, action: &Action, after: &State) -> String {
        let pos = |p: &Position| {
            let cur = p.cur.map_or(String::from("-"), |w| {
                format!("{:?} bound {} floor {}", w.snapshot, w.bound, w.floor)
            });
            format!(
                "done {:?} bound {} floor {} | cur {} | cursor {}",
                p.done, p.done_bound, p.done_floor, cur, p.cursor
            )
        };
        match *action {
            Action::AssignTxid { writer, key } => format!(
                "T{writer} locks key {key:?}, gets txid {}",
                after.writers[usize::from(writer)].txid.unwrap_or_default()
            ),
            Action::WalAhead { writer, key } => {
                let held = before.writers[usize::from(writer)].locks & key.bit() != 0;
                format!(
                    "T{writer} {}nextval step 1: the tuple shows {} (last {})",
                    if held {
                        String::new()
                    } else {
                        format!("locks key {key:?}, ")
                    },
                    before.sequence.last + self.cfg.wal_ahead,
                    before.sequence.last
                )
            }
            Action::Drawn { writer } => {
                let i = self.row_index(usize::from(writer), before);
                format!(
                    "T{writer} nextval step 2: inserts {}",
                    self.row_text(after, i)
                )
            }
            Action::Commit { writer } => format!("T{writer} commits"),
            Action::Rollback { writer } => format!("T{writer} rolls back"),
            Action::Claim { relay, .. } => {
                let new = self.newly_sent(before, after);
                let (Stage::Published(c) | Stage::ReadingFloor(c)) =
                    after.relays[usize::from(relay)].stage
                else {
                    return format!("relay {relay} claims");
                };
                let window = match before.latest.cur {
                    Some(w) => format!(
                        "goes on in window cur {:?} after cursor {}",
                        w.snapshot, before.latest.cursor
                    ),
                    None => match c.next.cur {
                        Some(w) => format!("opens a window at cur {:?}", w.snapshot),
                        None => format!("opens a window at cur {:?}", c.next.done),
                    },
                };
                let next = match c.next.cur {
                    Some(_) => format!("keeps it open, cursor {}", c.next.cursor),
                    None => String::from("read to its end, closes it"),
                };
                let bits = |b: u16| -> Vec<String> {
                    (0..after.rows.len())
                        .filter(|&i| b & (1 << i) != 0)
                        .map(|i| self.row_text(after, i))
                        .collect()
                };
                let mut text = format!(
                    "relay {relay} claims from position #{}: {window}; first sends {new:?}; {next}",
                    c.prev
                );
                if c.fail != 0 {
                    let _ = write!(text, "; the sink fails {:?} for good", bits(c.fail));
                }
                if c.park != 0 {
                    let _ = write!(text, "; held behind their key: {:?}", bits(c.park));
                }
                text
            }
            Action::ReadFloor { relay } => {
                format!("relay {relay} reads the floor: {}", self.read_floor(before))
            }
            Action::Record { relay } => format!(
                "relay {relay} starts record #{}",
                after.records_started.saturating_sub(1)
            ),
            Action::Abandon { relay, retry } => format!(
                "relay {relay} gives up on its record{}",
                if retry {
                    " and records the same batch again"
                } else {
                    " and claims afresh"
                }
            ),
            Action::Land { record } => {
                if after.latest_id != before.latest_id {
                    let mut text = format!(
                        "record #{record} lands as position #{} (txid {}): {}",
                        after.latest_id,
                        after.next_xid - 1,
                        pos(&after.latest)
                    );
                    if after.passed_unsent && !before.passed_unsent {
                        let unsent: Vec<String> = (0..after.rows.len())
                            .filter(|&i| {
                                after.rows[i].is_some_and(|row| {
                                    self.passed(after, &after.latest, i, &row) && !after.was_sent(i)
                                })
                            })
                            .map(|i| self.row_text(after, i))
                            .collect();
                        let _ = write!(text, " -- LOSS: it has passed {unsent:?}, never sent");
                    }
                    if after.moved_back && !before.moved_back {
                        text.push_str(" -- BACKWARDS: behind the position it replaces");
                    }
                    if after.parked != before.parked {
                        let _ = write!(text, "; parked {}", self.parked_text(after));
                    }
                    text
                } else {
                    format!("record #{record} runs late and writes nothing (fence or compare)")
                }
            }
            Action::Takeover { to } => {
                format!(
                    "relay {to} takes the partition over (epoch {})",
                    after.epoch
                )
            }
            Action::DropSegment { below } => format!("retention drops txids below {below}"),
            Action::ClaimParked { relay, .. } => format!(
                "relay {relay} claims parked messages: sends {:?}; parked {}",
                self.newly_sent(before, after),
                self.parked_text(after)
            ),
            Action::Redrive => format!("the operator redrives: parked {}", self.parked_text(after)),
            Action::CdcRead { key, .. } => format!(
                "CDC reads the next row of key {key:?}: sends {:?}; parked {}",
                self.newly_sent(before, after),
                self.parked_text(after)
            ),
            Action::Checkpoint => format!(
                "CDC checkpoints: position #{} at {:?}, bound {}, floor {}",
                after.latest_id,
                after.latest.done,
                after.latest.done_bound,
                after.latest.done_floor
            ),
            Action::Fallback => String::from("the slot is lost: polling takes over"),
            Action::Prune => format!("maintenance prunes positions below #{}", after.pruned_below),
        }
    }
}
