//! The guarantee checker of `outbox verify`: what arrived at the broker against what was
//! committed. Pure, so every verdict it can give is unit-tested.
//!
//! Per-key order is judged against commit order, which the ledger records: each committed
//! message carries `n`, the value its transaction drew from a per-key counter row
//! (`UPDATE … SET n = n + 1 RETURNING n`) after its outbox insert. That row lock is held until
//! commit, so within a key a smaller `n` committed earlier.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::Serialize;
use uuid::Uuid;

/// How a committed message was written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WriterKind {
    /// Through the writer API, which locks the key before drawing `seq`: per-key order is a
    /// guarantee.
    Locked,
    /// With the SQL contract's plain `INSERT` and no lock: per-key order is reported, not
    /// required (a guarantee where the database orders it: MySQL/MariaDB, and CDC mode).
    Raw,
    /// CDC mode's table-less writer (`emit`, a logical message in the transaction): per-key
    /// order is commit order, a guarantee.
    Emit,
    /// MySQL/MariaDB: the plain `INSERT` in an XA transaction (`XA START … XA PREPARE … XA
    /// COMMIT`, as a JTA transaction manager drives it), on keys of its own. Only its committed
    /// transactions are in the ledger (the ledger row is written in the XA transaction), so a
    /// message of one that ended in `XA ROLLBACK` is a phantom if it arrives. Per-key order is
    /// commit order, a guarantee (the database orders the plain insert there).
    Xa,
}

impl WriterKind {
    /// The name stored in the ledger.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Locked => "locked",
            Self::Raw => "raw",
            Self::Emit => "emit",
            Self::Xa => "xa",
        }
    }

    /// The kind a ledger name stands for.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "locked" => Some(Self::Locked),
            "raw" => Some(Self::Raw),
            "emit" => Some(Self::Emit),
            "xa" => Some(Self::Xa),
            _ => None,
        }
    }
}

/// One committed message, as the ledger recorded it in the message's own transaction.
#[derive(Debug, Clone, PartialEq)]
pub struct Committed {
    /// Ordering key.
    pub key: String,
    /// Commit rank within the key (larger = committed later).
    pub n: i64,
    /// How it was written.
    pub writer: WriterKind,
    /// Which producer task wrote it.
    pub producer: i64,
}

/// One message as the independent consumer received it.
#[derive(Debug, Clone, PartialEq)]
pub struct Arrival {
    /// Message id.
    pub id: Uuid,
    /// Ordering key, as delivered (header or line field).
    pub key: String,
    /// The key the payload names (empty when it names none).
    pub payload_key: String,
    /// Seconds since the start of the run.
    pub at: f64,
}

/// A fault, for attributing duplicates: its kind and when it started.
#[derive(Debug, Clone, PartialEq)]
pub struct FaultMark {
    /// `kill`, `pause`, `broker`, `db`.
    pub kind: String,
    /// Seconds since the start of the run.
    pub at: f64,
}

/// Per-key order of the raw (unlocked) writers' keys: information, not a verdict, where the
/// database gives a plain insert no order (PostgreSQL, SQLite). On MySQL/MariaDB it does (the
/// position trigger), and `outbox verify` counts [`RawOrder::violations`] as order violations.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct RawOrder {
    /// Messages committed by raw writers.
    pub committed: usize,
    /// Keys raw writers committed to.
    pub keys: usize,
    /// Of those, keys committed to by two or more producers.
    pub keys_written_by_several_producers: usize,
    /// Keys with at least one adjacent pair (below) out of commit order.
    pub keys_out_of_order: usize,
    /// Pairs of consecutive first deliveries within a key.
    pub adjacent_pairs: usize,
    /// Of those, pairs whose later delivery committed earlier.
    pub adjacent_pairs_out_of_order: usize,
    /// First deliveries that committed before one delivered earlier on their key: the writer
    /// API's rule, applied to the raw keys.
    pub violations: usize,
}

/// The checker's findings.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Verdict {
    /// Committed messages that arrived at least once.
    pub delivered: usize,
    /// Committed messages that never arrived.
    pub lost: usize,
    /// Up to ten lost ids.
    pub lost_sample: Vec<String>,
    /// Arrived messages that no committed transaction wrote (rolled back or invented).
    pub phantoms: usize,
    /// First deliveries of a writer-API key that came after a message of the key that
    /// committed later.
    pub order_violations: usize,
    /// Up to ten order violations, each as `key: n after m (id)`, so a failed run says where.
    pub order_sample: Vec<String>,
    /// Writer-API keys committed to by two or more producers (the overlap the order check
    /// needs to mean something).
    pub keys_written_by_several_producers: usize,
    /// Arrivals whose key (delivered or in the payload) differs from what was committed.
    pub mismatched: usize,
    /// Arrivals of an id already received.
    pub duplicates: usize,
    /// Duplicates by the kind of the last fault before them (`no fault` when none).
    pub duplicates_after: BTreeMap<String, usize>,
    /// What order held for the raw writers' keys.
    pub raw_order: RawOrder,
}

impl Verdict {
    /// Whether every guarantee held. The raw writers' order is not one: their lost and
    /// phantom messages count, their order does not.
    pub fn ok(&self) -> bool {
        self.lost == 0 && self.phantoms == 0 && self.order_violations == 0 && self.mismatched == 0
    }

    /// Makes the raw writers' order a guarantee: their violations count as order violations.
    /// For a database that orders the plain insert too (MySQL/MariaDB, whose position trigger
    /// holds the key's partition until commit; docs/sql-contract.md, section 8).
    pub fn count_raw_order(&mut self) {
        self.order_violations += self.raw_order.violations;
    }
}

/// Compares `arrivals` (in arrival order) with the `ledger` of committed messages. A key's
/// messages must arrive, at their first delivery, in commit order (`n`); a later redelivery of
/// a message is a duplicate, not a violation. Writer-API keys that break this are violations;
/// raw keys are counted in [`Verdict::raw_order`].
pub fn check(
    ledger: &HashMap<Uuid, Committed>,
    arrivals: &[Arrival],
    faults: &[FaultMark],
) -> Verdict {
    let mut v = Verdict::default();
    let mut first_seen: HashSet<Uuid> = HashSet::with_capacity(arrivals.len());
    // Per key: the highest `n` delivered so far and the `n` of the last first delivery.
    let mut high: HashMap<&str, i64> = HashMap::new();
    let mut last: HashMap<&str, i64> = HashMap::new();
    let mut raw_keys_out_of_order: HashSet<&str> = HashSet::new();
    for a in arrivals {
        if !first_seen.insert(a.id) {
            v.duplicates += 1;
            let cause = faults
                .iter()
                .rev()
                .find(|f| f.at <= a.at)
                .map_or("no fault", |f| f.kind.as_str());
            *v.duplicates_after.entry(cause.to_string()).or_default() += 1;
            continue;
        }
        let Some(c) = ledger.get(&a.id) else {
            v.phantoms += 1;
            continue;
        };
        if c.key != a.key || c.key != a.payload_key {
            v.mismatched += 1;
        }
        // Order is judged on the committed key, so a mismatch is not counted twice.
        let key = c.key.as_str();
        match c.writer {
            WriterKind::Locked | WriterKind::Emit | WriterKind::Xa => {
                let h = high.entry(key).or_insert(i64::MIN);
                if c.n < *h {
                    v.order_violations += 1;
                    if v.order_sample.len() < 10 {
                        v.order_sample.push(format!(
                            "{key} ({}): {} first arrived after {} ({}, at {:.1} s)",
                            c.writer.as_str(),
                            c.n,
                            *h,
                            a.id,
                            a.at
                        ));
                    }
                } else {
                    *h = c.n;
                }
            }
            WriterKind::Raw => {
                let h = high.entry(key).or_insert(i64::MIN);
                if c.n < *h {
                    v.raw_order.violations += 1;
                    if v.order_sample.len() < 10 {
                        v.order_sample.push(format!(
                            "{key} (raw): {} first arrived after {} ({}, at {:.1} s)",
                            c.n, *h, a.id, a.at
                        ));
                    }
                } else {
                    *h = c.n;
                }
                if let Some(prev) = last.insert(key, c.n) {
                    v.raw_order.adjacent_pairs += 1;
                    if c.n < prev {
                        v.raw_order.adjacent_pairs_out_of_order += 1;
                        raw_keys_out_of_order.insert(key);
                    }
                }
            }
        }
    }
    v.raw_order.keys_out_of_order = raw_keys_out_of_order.len();

    let mut producers: HashMap<(&str, WriterKind), HashSet<i64>> = HashMap::new();
    for c in ledger.values() {
        producers
            .entry((c.key.as_str(), c.writer))
            .or_default()
            .insert(c.producer);
        if c.writer == WriterKind::Raw {
            v.raw_order.committed += 1;
        }
    }
    for ((_, writer), ps) in &producers {
        let shared = usize::from(ps.len() > 1);
        match writer {
            WriterKind::Locked | WriterKind::Emit | WriterKind::Xa => {
                v.keys_written_by_several_producers += shared
            }
            WriterKind::Raw => {
                v.raw_order.keys += 1;
                v.raw_order.keys_written_by_several_producers += shared;
            }
        }
    }

    v.delivered = ledger.keys().filter(|id| first_seen.contains(id)).count();
    v.lost = ledger.len() - v.delivered;
    v.lost_sample = ledger
        .keys()
        .filter(|id| !first_seen.contains(id))
        .take(10)
        .map(Uuid::to_string)
        .collect();
    v
}

/// A row written on purpose against the SQL contract (MySQL/MariaDB, with the server's checks
/// off for the statement, as a writer from before migration 4 or one that skips them would):
/// the relay cannot hand it over, and it must end `failed` with the column it could not read
/// named, alone.
#[derive(Debug, Clone, PartialEq)]
pub struct OddRow {
    /// The row's `seq`.
    pub seq: i64,
    /// The column that is not what the contract says: `id` (not a UUID) or `created_at` (a
    /// zero date).
    pub column: String,
}

/// A failed row as the store reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct FailedRow {
    /// Its `seq`.
    pub seq: i64,
    /// The error it failed with.
    pub error: Option<String>,
}

/// What became of the odd rows.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct OddVerdict {
    /// Odd rows committed.
    pub odd_rows: usize,
    /// Of those, rows that ended `failed` with their column named in the error.
    pub odd_failed_named: usize,
    /// Up to ten odd rows that did not, each as `seq (column): what the store says`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub odd_sample: Vec<String>,
}

impl OddVerdict {
    /// Whether every odd row ended `failed` with its column named.
    pub fn ok(&self) -> bool {
        self.odd_failed_named == self.odd_rows
    }
}

/// Judges the odd rows against the store's failed rows: each must be among them, its error
/// naming its column (`` `id` `` or `` `created_at` ``). That no odd row arrived at the broker
/// is the phantom check's part (a zero-date row carries a UUID no ledger row has).
pub fn check_odd(odd: &[OddRow], failed: &[FailedRow]) -> OddVerdict {
    let by_seq: HashMap<i64, &FailedRow> = failed.iter().map(|f| (f.seq, f)).collect();
    let mut v = OddVerdict {
        odd_rows: odd.len(),
        ..OddVerdict::default()
    };
    for o in odd {
        let named = format!("`{}`", o.column);
        let problem = match by_seq.get(&o.seq) {
            None => Some("not failed".to_string()),
            Some(f) => match &f.error {
                Some(e) if e.contains(&named) => None,
                Some(e) => Some(format!("failed without naming {named}: {e}")),
                None => Some("failed with no error".to_string()),
            },
        };
        match problem {
            None => v.odd_failed_named += 1,
            Some(p) if v.odd_sample.len() < 10 => v
                .odd_sample
                .push(format!("seq {} ({}): {p}", o.seq, o.column)),
            Some(_) => {}
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (id, key, n, writer, producer)
    type Row = (u128, &'static str, i64, WriterKind, i64);

    const L: WriterKind = WriterKind::Locked;
    const R: WriterKind = WriterKind::Raw;

    fn ledger(rows: &[Row]) -> HashMap<Uuid, Committed> {
        rows.iter()
            .map(|&(id, key, n, writer, producer)| {
                (
                    Uuid::from_u128(id),
                    Committed {
                        key: key.to_string(),
                        n,
                        writer,
                        producer,
                    },
                )
            })
            .collect()
    }

    fn arrive(id: u128, key: &str, at: f64) -> Arrival {
        Arrival {
            id: Uuid::from_u128(id),
            key: key.into(),
            payload_key: key.into(),
            at,
        }
    }

    #[test]
    fn everything_in_order_is_ok() {
        let l = ledger(&[(1, "a", 1, L, 0), (2, "a", 2, L, 1), (3, "b", 1, L, 0)]);
        let v = check(
            &l,
            &[
                arrive(1, "a", 1.0),
                arrive(3, "b", 1.0),
                arrive(2, "a", 2.0),
            ],
            &[],
        );
        assert!(v.ok(), "{v:?}");
        assert_eq!((v.delivered, v.lost, v.duplicates), (3, 0, 0));
        assert_eq!(v.keys_written_by_several_producers, 1);
    }

    #[test]
    fn a_missing_message_is_lost() {
        let l = ledger(&[(1, "a", 1, L, 0), (2, "a", 2, L, 0)]);
        let v = check(&l, &[arrive(1, "a", 1.0)], &[]);
        assert_eq!(v.lost, 1);
        assert_eq!(v.lost_sample, vec![Uuid::from_u128(2).to_string()]);
        assert!(!v.ok());
    }

    #[test]
    fn an_uncommitted_message_is_a_phantom() {
        let l = ledger(&[(1, "a", 1, L, 0)]);
        let v = check(&l, &[arrive(1, "a", 1.0), arrive(9, "a", 1.0)], &[]);
        assert_eq!(v.phantoms, 1);
        assert!(!v.ok());
    }

    #[test]
    fn a_later_commit_delivered_first_is_an_order_violation() {
        // Two producers on one key: 2 committed after 1, and arrived before it.
        let l = ledger(&[(1, "a", 1, L, 0), (2, "a", 2, L, 1)]);
        let v = check(&l, &[arrive(2, "a", 1.0), arrive(1, "a", 2.0)], &[]);
        assert_eq!(v.order_violations, 1);
        assert!(!v.ok());
    }

    #[test]
    fn a_redelivery_is_a_duplicate_attributed_to_the_last_fault_not_a_violation() {
        let l = ledger(&[(1, "a", 1, L, 0), (2, "a", 2, L, 0)]);
        let faults = [FaultMark {
            kind: "kill".into(),
            at: 1.5,
        }];
        let v = check(
            &l,
            &[
                arrive(1, "a", 1.0),
                arrive(2, "a", 1.0),
                arrive(1, "a", 2.0),
            ],
            &faults,
        );
        assert!(v.ok(), "{v:?}");
        assert_eq!(v.duplicates, 1);
        assert_eq!(v.duplicates_after.get("kill"), Some(&1));
    }

    #[test]
    fn a_message_under_the_wrong_key_is_a_mismatch() {
        let l = ledger(&[(1, "a", 1, L, 0)]);
        let v = check(&l, &[arrive(1, "b", 1.0)], &[]);
        assert_eq!(v.mismatched, 1);
        assert!(!v.ok());
    }

    #[test]
    fn a_payload_naming_another_key_is_a_mismatch() {
        let l = ledger(&[(1, "a", 1, L, 0)]);
        let mut a = arrive(1, "a", 1.0);
        a.payload_key = "b".into();
        let v = check(&l, &[a], &[]);
        assert_eq!(v.mismatched, 1);
        assert!(!v.ok());
    }

    #[test]
    fn raw_keys_out_of_commit_order_are_counted_but_not_a_failure() {
        // Key r: commits 1, 2, 3 arrive 2, 1, 3: one adjacent pair of two is inverted.
        // Key s: in order. Key t: one message, no pair.
        let l = ledger(&[
            (1, "r", 1, R, 0),
            (2, "r", 2, R, 1),
            (3, "r", 3, R, 0),
            (4, "s", 1, R, 1),
            (5, "s", 2, R, 1),
            (6, "t", 1, R, 0),
        ]);
        let v = check(
            &l,
            &[
                arrive(2, "r", 1.0),
                arrive(4, "s", 1.0),
                arrive(1, "r", 1.0),
                arrive(5, "s", 1.0),
                arrive(3, "r", 1.0),
                arrive(6, "t", 1.0),
                // A redelivery of r's first commit: a duplicate, not a pair.
                arrive(1, "r", 2.0),
            ],
            &[],
        );
        assert!(v.ok(), "{v:?}");
        assert_eq!(v.order_violations, 0);
        assert_eq!(
            v.raw_order,
            RawOrder {
                committed: 6,
                keys: 3,
                keys_written_by_several_producers: 1,
                keys_out_of_order: 1,
                adjacent_pairs: 3,
                adjacent_pairs_out_of_order: 1,
                // r's commit 1 arrived after its commit 2: what MySQL's run counts.
                violations: 1,
            }
        );
        assert_eq!(v.duplicates, 1);
        // Where the database orders the plain insert (MySQL), the same arrivals fail the run.
        let mut ordered = v.clone();
        ordered.count_raw_order();
        assert_eq!(ordered.order_violations, 1);
        assert!(!ordered.ok());
    }

    #[test]
    fn lost_and_phantom_raw_messages_still_fail_the_run() {
        let l = ledger(&[(1, "r", 1, R, 0), (2, "r", 2, R, 0)]);
        let v = check(&l, &[arrive(1, "r", 1.0), arrive(9, "r", 1.0)], &[]);
        assert_eq!((v.lost, v.phantoms), (1, 1));
        assert!(!v.ok());
    }

    #[test]
    fn xa_keys_out_of_commit_order_are_violations_and_rolled_back_xa_messages_phantoms() {
        const X: WriterKind = WriterKind::Xa;
        // Only committed XA transactions are in the ledger: 9 ended in XA ROLLBACK.
        let l = ledger(&[(1, "xa-0", 1, X, 0), (2, "xa-0", 2, X, 1)]);
        let v = check(&l, &[arrive(2, "xa-0", 1.0), arrive(1, "xa-0", 2.0)], &[]);
        assert_eq!(v.order_violations, 1);
        assert_eq!(v.keys_written_by_several_producers, 1);
        let v = check(
            &l,
            &[
                arrive(1, "xa-0", 1.0),
                arrive(9, "xa-0", 1.5),
                arrive(2, "xa-0", 2.0),
            ],
            &[],
        );
        assert_eq!((v.phantoms, v.order_violations, v.lost), (1, 0, 0));
        assert!(!v.ok());
        assert_eq!(WriterKind::parse(X.as_str()), Some(X));
    }

    #[test]
    fn an_odd_row_passes_only_failed_with_its_column_named() {
        let odd = [
            OddRow {
                seq: 5,
                column: "id".into(),
            },
            OddRow {
                seq: 6,
                column: "created_at".into(),
            },
            OddRow {
                seq: 7,
                column: "id".into(),
            },
            OddRow {
                seq: 8,
                column: "created_at".into(),
            },
        ];
        let failed = [
            FailedRow {
                seq: 5,
                error: Some("the column `id` holds `01HZ…`, which is not a UUID".into()),
            },
            FailedRow {
                seq: 6,
                error: Some("the column `created_at` is not a valid time".into()),
            },
            // Failed for another reason: not what the contract promises.
            FailedRow {
                seq: 8,
                error: Some("the sink refused it".into()),
            },
        ];
        let v = check_odd(&odd, &failed);
        assert_eq!((v.odd_rows, v.odd_failed_named), (4, 2));
        assert!(!v.ok());
        assert_eq!(v.odd_sample.len(), 2, "{v:?}");
        assert!(v.odd_sample[0].contains("seq 7") && v.odd_sample[0].contains("not failed"));
        assert!(v.odd_sample[1].contains("`created_at`"));
        let all = check_odd(&odd[..2], &failed);
        assert!(all.ok(), "{all:?}");
        assert!(check_odd(&[], &[]).ok());
    }
}
