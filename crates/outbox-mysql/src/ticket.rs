//! What a claim hands out and remembers until its batch is recorded, and how the relay's
//! outcomes turn into new positions and parked rows: pure logic, unit-tested without a
//! database (`store/` does the reading and writing).
//!
//! A partition's positions are gapless and drawn in commit order, so a claim reads each
//! partition as the range `passed + 1 ..= passed + k` and a record moves `passed` to the end of
//! the longest run of rows it has settled (published, or parked), never past a row that was not
//! handed out or not tried.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use outbox_core::{ClaimLimits, Message, OnFailed, Outcome};

/// What became of a window row in the claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Status {
    /// Handed out to the relay.
    Handed,
    /// Not handed out: its key has parked messages ahead that this claim does not hand out.
    /// The record parks it behind them (`waiting`).
    Held,
    /// Not handed out: past the claim's limits. The position stops before it.
    Cut,
}

/// One row of a partition's window.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct WindowRow {
    pub seq: i64,
    pub part_seq: i64,
    pub key: String,
    pub status: Status,
}

/// A partition's window as the claim read it: rows `passed + 1 ..` in position order, with no
/// gap (the claim keeps only the contiguous run).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Window {
    pub part: i16,
    pub passed: i64,
    pub rows: Vec<WindowRow>,
}

/// A parked message the claim handed out.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ParkedOut {
    pub seq: i64,
    pub part: i16,
    pub part_seq: i64,
    pub key: String,
    pub attempts: i32,
}

/// The fence a partition's record must pass: the epoch the claim ran under and how many records
/// the partition had then (compare-and-set; any record in between makes this one change
/// nothing).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Fence {
    pub epoch: i64,
    pub recorded: i64,
}

/// Everything a claim must remember for its record.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Ticket {
    pub on_failed: OnFailed,
    pub fences: BTreeMap<i16, Fence>,
    pub windows: Vec<Window>,
    pub parked: Vec<ParkedOut>,
    /// `(seq, partition, position, key)` of every message handed out, in hand-out order.
    pub order: Vec<(i64, i16, i64, String)>,
}

/// A row to write into `outbox_parked` (insert, or update in place when it is there).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Park {
    pub seq: i64,
    pub part: i16,
    pub part_seq: i64,
    pub key: String,
    pub state: &'static str,
    pub attempts: i32,
    /// `None`: due at once (a waiting row, or a failed one, which is never due).
    pub next_attempt_in: Option<Duration>,
    pub error: Option<String>,
}

/// One partition's share of a record.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PartPlan {
    pub part: i16,
    pub fence: Fence,
    /// The partition's new position, when the claim read its window (`None`: unchanged).
    pub passed: Option<i64>,
    pub parked_delta: i64,
    /// Outcomes this partition's record settles (what `complete` reports).
    pub settled: u64,
    /// Rows to park or update, then parked rows to delete (published).
    pub parks: Vec<Park>,
    pub deletes: Vec<i64>,
}

impl PartPlan {
    /// Whether recording this partition writes anything, given the position its claim read.
    fn writes(&self, passed_before: Option<i64>) -> bool {
        self.passed != passed_before || !self.parks.is_empty() || !self.deletes.is_empty()
    }
}

/// The plan of `part` in `plans`, made on first use; `None` when the claim has no fence for it.
fn plan_of<'a>(
    plans: &'a mut BTreeMap<i16, PartPlan>,
    fences: &BTreeMap<i16, Fence>,
    part: i16,
    passed: Option<i64>,
) -> Option<&'a mut PartPlan> {
    let fence = *fences.get(&part)?;
    Some(plans.entry(part).or_insert(PartPlan {
        part,
        fence,
        passed,
        parked_delta: 0,
        settled: 0,
        parks: Vec::new(),
        deletes: Vec::new(),
    }))
}

/// What the relay did with one handed-out message.
#[derive(Debug, Clone, PartialEq)]
enum Action {
    Published,
    Park(Park),
    /// Not tried because an earlier message of its key in the batch was not published: it
    /// waits behind that one.
    Waiting,
    /// Not tried at all: the position stops before it.
    Untried,
}

impl Ticket {
    /// The partitions this claim read, with the positions it read.
    pub fn passed_before(&self, part: i16) -> Option<i64> {
        self.windows
            .iter()
            .find(|w| w.part == part)
            .map(|w| w.passed)
    }

    /// Turns `outcomes` into what to write, one [`PartPlan`] per partition with anything to
    /// write. Outcomes for messages this claim did not hand out are ignored.
    pub fn plan(&self, outcomes: &[Outcome]) -> Vec<PartPlan> {
        let by_seq: HashMap<i64, &Outcome> = outcomes.iter().map(|o| (o.seq(), o)).collect();
        let block = self.on_failed == OnFailed::Block;
        let mut stopped_keys: HashSet<(i16, &str)> = HashSet::new();
        let mut actions: HashMap<i64, Action> = HashMap::new();
        let attempts_of: HashMap<i64, i32> =
            self.parked.iter().map(|p| (p.seq, p.attempts)).collect();
        for (seq, part, part_seq, key) in &self.order {
            let attempts = attempts_of.get(seq).copied().unwrap_or(0);
            let action = match by_seq.get(seq) {
                Some(Outcome::Published { .. }) => Action::Published,
                Some(Outcome::Retry {
                    error, delay, seq, ..
                }) => Action::Park(Park {
                    seq: *seq,
                    part: *part,
                    part_seq: *part_seq,
                    key: key.clone(),
                    state: "retrying",
                    attempts: attempts.saturating_add(1),
                    next_attempt_in: Some(*delay),
                    error: Some(error.clone()),
                }),
                Some(Outcome::Deferred {
                    error, delay, seq, ..
                }) => Action::Park(Park {
                    seq: *seq,
                    part: *part,
                    part_seq: *part_seq,
                    key: key.clone(),
                    state: "retrying",
                    attempts,
                    next_attempt_in: Some(*delay),
                    error: Some(error.clone()),
                }),
                Some(Outcome::Failed { error, seq }) => Action::Park(Park {
                    seq: *seq,
                    part: *part,
                    part_seq: *part_seq,
                    key: key.clone(),
                    state: "failed",
                    attempts: attempts.saturating_add(1),
                    next_attempt_in: None,
                    error: Some(error.clone()),
                }),
                None if stopped_keys.contains(&(*part, key.as_str())) => Action::Waiting,
                None => Action::Untried,
            };
            if let Action::Park(p) = &action {
                if p.state == "retrying" || block {
                    stopped_keys.insert((*part, key.as_str()));
                }
            }
            actions.insert(*seq, action);
        }

        let mut plans: BTreeMap<i16, PartPlan> = BTreeMap::new();

        // Parked messages handed out: updated in place, or deleted once published. Their
        // partition's position does not move for them (it passed them when they were parked).
        for p in &self.parked {
            let passed = self.passed_before(p.part);
            let Some(plan) = plan_of(&mut plans, &self.fences, p.part, passed) else {
                continue;
            };
            match actions.get(&p.seq) {
                Some(Action::Published) => {
                    plan.deletes.push(p.seq);
                    plan.parked_delta -= 1;
                    plan.settled += 1;
                }
                Some(Action::Park(park)) => {
                    plan.parks.push(park.clone());
                    plan.settled += 1;
                }
                Some(Action::Waiting | Action::Untried) | None => {}
            }
        }

        // Windows: settle the longest run from the position that needs nothing more.
        for w in &self.windows {
            let Some(plan) = plan_of(&mut plans, &self.fences, w.part, Some(w.passed)) else {
                continue;
            };
            for row in &w.rows {
                let waiting = Park {
                    seq: row.seq,
                    part: w.part,
                    part_seq: row.part_seq,
                    key: row.key.clone(),
                    state: "waiting",
                    attempts: 0,
                    next_attempt_in: None,
                    error: None,
                };
                match (row.status, actions.get(&row.seq)) {
                    (Status::Cut, _) => break,
                    (Status::Held, _) => {
                        plan.parks.push(waiting);
                        plan.parked_delta += 1;
                    }
                    (Status::Handed, Some(Action::Published)) => plan.settled += 1,
                    (Status::Handed, Some(Action::Park(park))) => {
                        plan.parks.push(park.clone());
                        plan.parked_delta += 1;
                        plan.settled += 1;
                    }
                    (Status::Handed, Some(Action::Waiting)) => {
                        plan.parks.push(waiting);
                        plan.parked_delta += 1;
                    }
                    (Status::Handed, Some(Action::Untried) | None) => break,
                }
                plan.passed = Some(row.part_seq);
            }
        }
        plans
            .into_values()
            .filter(|p| p.writes(self.passed_before(p.part)))
            .collect()
    }
}

/// A parked key the claim may hand out: its parked messages (in position order, as many as
/// were read) and whether those are all it has parked.
#[derive(Debug, Clone)]
pub(crate) struct ParkedKey {
    pub part: i16,
    pub key: String,
    pub rows: Vec<(Message, i64)>,
    pub complete: bool,
}

/// One partition's window rows as read: `(message, position)` in position order, and whether
/// each row's key has parked messages (`held`).
#[derive(Debug, Clone)]
pub(crate) struct WindowRead {
    pub part: i16,
    pub passed: i64,
    pub rows: Vec<(Message, i64, bool)>,
}

/// Builds the hand-out order and the ticket from what a claim read.
///
/// Each due parked key is a list: its parked messages, then (when all of them were read) its
/// window rows. Each partition's other window rows are a list in position order; rows of keys
/// with parked messages not handed out are held. `limits` cut the lists round-robin (every
/// list's first item, then every second, ...), so every key and every partition loses only a
/// suffix and shares the bound with the others; what is kept goes out in `seq` (insert) order,
/// which keeps every list's own order.
pub(crate) fn assemble(
    parked: Vec<ParkedKey>,
    windows: Vec<WindowRead>,
    limits: ClaimLimits,
    on_failed: OnFailed,
    fences: BTreeMap<i16, Fence>,
) -> (Vec<Message>, Ticket) {
    // The keys whose parked messages all go out here: their window rows follow them.
    let released: HashSet<(i16, String)> = parked
        .iter()
        .filter(|k| k.complete)
        .map(|k| (k.part, k.key.clone()))
        .collect();
    enum Source {
        Parked { part: i16, attempts: i32 },
        Window { part: i16 },
    }
    // Each message with its position and where it came from.
    type Item = (Message, i64, Source);
    let mut lists: Vec<Vec<Item>> = Vec::new();
    let mut key_list: HashMap<(i16, String), usize> = HashMap::new();
    for k in parked {
        key_list.insert((k.part, k.key.clone()), lists.len());
        lists.push(
            k.rows
                .into_iter()
                .map(|(m, part_seq)| {
                    let attempts = m.attempts;
                    (
                        m,
                        part_seq,
                        Source::Parked {
                            part: k.part,
                            attempts,
                        },
                    )
                })
                .collect(),
        );
    }
    let mut ticket_windows = Vec::new();
    for w in windows {
        let mut own = Vec::new();
        let mut rows = Vec::new();
        for (m, part_seq, held) in w.rows {
            let key = (w.part, m.aggregate_id.clone());
            let status = if held && !released.contains(&key) {
                Status::Held
            } else {
                Status::Cut // until handed out below
            };
            rows.push(WindowRow {
                seq: m.seq,
                part_seq,
                key: m.aggregate_id.clone(),
                status,
            });
            if status == Status::Held {
                continue;
            }
            match key_list.get(&key).filter(|_| held) {
                Some(&i) => lists[i].push((m, part_seq, Source::Window { part: w.part })),
                None => own.push((m, part_seq, Source::Window { part: w.part })),
            }
        }
        lists.push(own);
        ticket_windows.push(Window {
            part: w.part,
            passed: w.passed,
            rows,
        });
    }

    // Merge round-robin: every list's first item, then every second, ..., each level in seq
    // order, as the server's byte gate counted them (`read_windows`). The limits then cut the
    // items counted last, so every list (a key, a partition) keeps a prefix and none gives up its
    // rows to another's. Merged by seq instead, the trim fell on whichever partition wrote last:
    // with room for four payloads, one partition's three and the other's one.
    let mut ranked: Vec<(usize, Item)> = lists
        .into_iter()
        .flat_map(|l| l.into_iter().enumerate())
        .collect();
    ranked.sort_by_key(|(level, (m, _, _))| (*level, m.seq));
    let n = limits.fit(ranked.iter().map(|(_, (m, _, _))| m.payload.len()));
    ranked.truncate(n);
    // What goes out, in seq order (insert order), each partition's rows in its slots in
    // position order. On the trigger's route the two agree within a partition (a writer draws
    // its seq while it holds the partition's counter); on the binlog route positions follow
    // commit order, which seq order does not.
    let mut merged: Vec<Item> = ranked.into_iter().map(|(_, item)| item).collect();
    merged.sort_by_key(|(m, _, _)| m.seq);
    let part_of = |item: &Item| match item.2 {
        Source::Parked { part, .. } | Source::Window { part } => part,
    };
    let mut slots: BTreeMap<i16, Vec<usize>> = BTreeMap::new();
    for (i, item) in merged.iter().enumerate() {
        slots.entry(part_of(item)).or_default().push(i);
    }
    let mut placed: Vec<Option<Item>> = merged.into_iter().map(Some).collect();
    for slots in slots.values() {
        let mut items: Vec<Item> = slots.iter().filter_map(|&i| placed[i].take()).collect();
        items.sort_by_key(|(_, part_seq, _)| *part_seq);
        for (&i, item) in slots.iter().zip(items) {
            placed[i] = Some(item);
        }
    }
    let merged: Vec<Item> = placed.into_iter().flatten().collect();

    let mut handed: HashSet<i64> = HashSet::new();
    let mut order = Vec::with_capacity(n);
    let mut parked_out = Vec::new();
    let mut messages = Vec::with_capacity(n);
    for (m, part_seq, source) in merged {
        let part = match source {
            Source::Parked { part, attempts } => {
                parked_out.push(ParkedOut {
                    seq: m.seq,
                    part,
                    part_seq,
                    key: m.aggregate_id.clone(),
                    attempts,
                });
                part
            }
            Source::Window { part } => {
                handed.insert(m.seq);
                part
            }
        };
        order.push((m.seq, part, part_seq, m.aggregate_id.clone()));
        messages.push(m);
    }
    for w in &mut ticket_windows {
        for row in &mut w.rows {
            if handed.contains(&row.seq) {
                row.status = Status::Handed;
            }
        }
    }
    let ticket = Ticket {
        on_failed,
        fences,
        windows: ticket_windows,
        parked: parked_out,
        order,
    };
    (messages, ticket)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn m(seq: i64, key: &str, attempts: i32) -> Message {
        Message {
            seq,
            id: uuid::Uuid::now_v7(),
            aggregate_type: "t".into(),
            aggregate_id: key.into(),
            event_type: "e".into(),
            payload: Bytes::from_static(b"{}"),
            headers: "{}".into(),
            topic: None,
            created_at: chrono::Utc::now(),
            attempts,
        }
    }

    fn fences(parts: &[i16]) -> BTreeMap<i16, Fence> {
        parts
            .iter()
            .map(|p| {
                (
                    *p,
                    Fence {
                        epoch: 1,
                        recorded: 0,
                    },
                )
            })
            .collect()
    }

    fn window(part: i16, passed: i64, rows: &[(i64, &str, bool)]) -> WindowRead {
        WindowRead {
            part,
            passed,
            rows: rows
                .iter()
                .enumerate()
                .map(|(i, (seq, key, held))| (m(*seq, key, 0), passed + 1 + i as i64, *held))
                .collect(),
        }
    }

    fn seqs(ms: &[Message]) -> Vec<i64> {
        ms.iter().map(|m| m.seq).collect()
    }

    #[test]
    fn partitions_merge_by_insert_order_and_a_cut_stops_the_position_before_it() {
        let (out, t) = assemble(
            vec![],
            vec![
                window(0, 10, &[(1, "a", false), (4, "a", false)]),
                window(1, 0, &[(2, "b", false), (3, "c", false)]),
            ],
            ClaimLimits::rows(3),
            OnFailed::Block,
            fences(&[0, 1]),
        );
        assert_eq!(seqs(&out), vec![1, 2, 3]);
        let all: Vec<_> = [1, 2, 3]
            .map(|seq| Outcome::Published { seq })
            .into_iter()
            .collect();
        let plan = t.plan(&all);
        let passed: Vec<_> = plan.iter().map(|p| (p.part, p.passed)).collect();
        assert_eq!(passed, vec![(0, Some(11)), (1, Some(2))], "seq 4 was cut");
        assert_eq!(plan.iter().map(|p| p.settled).sum::<u64>(), 3);
    }

    #[test]
    fn a_retry_parks_its_key_behind_it_and_an_untried_row_stops_the_position() {
        // a1 a2 b1 in one partition; a1 is retried, a2 waits behind it, b1 was never tried.
        let (out, t) = assemble(
            vec![],
            vec![window(
                0,
                0,
                &[(1, "a", false), (2, "a", false), (3, "b", false)],
            )],
            ClaimLimits::rows(10),
            OnFailed::Block,
            fences(&[0]),
        );
        assert_eq!(out.len(), 3);
        let plan = t.plan(&[Outcome::Retry {
            seq: 1,
            error: "down".into(),
            delay: Duration::from_secs(1),
        }]);
        assert_eq!(plan.len(), 1);
        let p = &plan[0];
        assert_eq!((p.passed, p.parked_delta, p.settled), (Some(2), 2, 1));
        assert_eq!(
            p.parks.iter().map(|k| (k.seq, k.state)).collect::<Vec<_>>(),
            vec![(1, "retrying"), (2, "waiting")]
        );
    }

    #[test]
    fn under_skip_a_failed_row_does_not_hold_its_key() {
        let (_, t) = assemble(
            vec![],
            vec![window(0, 0, &[(1, "a", false), (2, "a", false)])],
            ClaimLimits::rows(10),
            OnFailed::Skip,
            fences(&[0]),
        );
        let plan = t.plan(&[Outcome::Failed {
            seq: 1,
            error: "poison".into(),
        }]);
        assert_eq!(
            plan[0].passed,
            Some(1),
            "row 2 was not tried: handed out again"
        );
    }

    #[test]
    fn a_released_key_hands_out_its_parked_rows_then_its_window_rows() {
        // Key `a` has parked rows 1, 2 (all read) and window row 5 (held by the probe); key
        // `b` has window row 4. `a`'s window row follows its parked ones.
        let parked = ParkedKey {
            part: 0,
            key: "a".into(),
            rows: vec![(m(1, "a", 2), 1), (m(2, "a", 0), 2)],
            complete: true,
        };
        let (out, t) = assemble(
            vec![parked],
            vec![window(0, 3, &[(4, "b", false), (5, "a", true)])],
            ClaimLimits::rows(10),
            OnFailed::Block,
            fences(&[0]),
        );
        assert_eq!(seqs(&out), vec![1, 2, 4, 5]);
        let plan = t.plan(&[
            Outcome::Published { seq: 1 },
            Outcome::Published { seq: 2 },
            Outcome::Published { seq: 4 },
            Outcome::Published { seq: 5 },
        ]);
        let p = &plan[0];
        assert_eq!((p.passed, p.parked_delta, p.settled), (Some(5), -2, 4));
        assert_eq!(p.deletes, vec![1, 2]);
    }

    #[test]
    fn a_key_with_parked_rows_not_handed_out_holds_its_window_rows() {
        let (out, t) = assemble(
            vec![],
            vec![window(0, 0, &[(1, "a", true), (2, "b", false)])],
            ClaimLimits::rows(10),
            OnFailed::Block,
            fences(&[0]),
        );
        assert_eq!(seqs(&out), vec![2]);
        // Nothing published: the held row is parked all the same, and the position passes it.
        let plan = t.plan(&[]);
        assert_eq!((plan[0].passed, plan[0].parked_delta), (Some(1), 1));
        // A retried parked head counts an attempt; a deferred one does not.
        let parked = ParkedKey {
            part: 0,
            key: "a".into(),
            rows: vec![(m(1, "a", 3), 1)],
            complete: false,
        };
        let (_, t) = assemble(
            vec![parked],
            vec![],
            ClaimLimits::rows(10),
            OnFailed::Block,
            fences(&[0]),
        );
        let retry = t.plan(&[Outcome::Retry {
            seq: 1,
            error: "x".into(),
            delay: Duration::ZERO,
        }]);
        assert_eq!(retry[0].parks[0].attempts, 4);
        let deferred = t.plan(&[Outcome::Deferred {
            seq: 1,
            error: "x".into(),
            delay: Duration::ZERO,
        }]);
        assert_eq!(deferred[0].parks[0].attempts, 3);
        assert_eq!(deferred[0].parked_delta, 0);
    }

    #[test]
    fn outcomes_of_unfenced_partitions_write_nothing() {
        let (_, t) = assemble(
            vec![],
            vec![window(7, 0, &[(1, "a", false)])],
            ClaimLimits::rows(10),
            OnFailed::Block,
            fences(&[]),
        );
        assert!(t.plan(&[Outcome::Published { seq: 1 }]).is_empty());
    }
}
