//! The guarantee checker of `outbox verify`: what arrived at the broker against what was
//! committed. Pure, so every verdict it can give is unit-tested.

use std::collections::{BTreeMap, HashMap, HashSet};

use uuid::Uuid;

/// One message as the independent consumer received it.
#[derive(Debug, Clone, PartialEq)]
pub struct Arrival {
    /// Message id.
    pub id: Uuid,
    /// Ordering key, as delivered.
    pub key: String,
    /// Sequence within the key, from the payload.
    pub n: i64,
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
    /// First deliveries that came after a later message of the same key.
    pub order_violations: usize,
    /// Arrivals whose key or sequence differ from what was committed under that id.
    pub mismatched: usize,
    /// Arrivals of an id already received.
    pub duplicates: usize,
    /// Duplicates by the kind of the last fault before them (`no fault` when none).
    pub duplicates_after: BTreeMap<String, usize>,
}

impl Verdict {
    /// Whether every guarantee held.
    pub fn ok(&self) -> bool {
        self.lost == 0 && self.phantoms == 0 && self.order_violations == 0 && self.mismatched == 0
    }
}

/// Compares `arrivals` (in arrival order) with the `ledger` of committed messages (id → key and
/// sequence within the key). A key's messages must arrive, at their first delivery, in
/// sequence order; a later redelivery of a message is a duplicate, not a violation.
pub fn check(
    ledger: &HashMap<Uuid, (String, i64)>,
    arrivals: &[Arrival],
    faults: &[FaultMark],
) -> Verdict {
    let mut v = Verdict::default();
    let mut first_seen: HashSet<Uuid> = HashSet::with_capacity(arrivals.len());
    let mut high: HashMap<&str, i64> = HashMap::new();
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
        match ledger.get(&a.id) {
            None => {
                v.phantoms += 1;
                continue;
            }
            Some((key, n)) if *key != a.key || *n != a.n => v.mismatched += 1,
            Some(_) => {}
        }
        let h = high.entry(a.key.as_str()).or_insert(-1);
        if a.n < *h {
            v.order_violations += 1;
        } else {
            *h = a.n;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn ledger(rows: &[(u128, &str, i64)]) -> HashMap<Uuid, (String, i64)> {
        rows.iter()
            .map(|(id, k, n)| (Uuid::from_u128(*id), (k.to_string(), *n)))
            .collect()
    }

    fn arrive(id: u128, key: &str, n: i64, at: f64) -> Arrival {
        Arrival {
            id: Uuid::from_u128(id),
            key: key.into(),
            n,
            at,
        }
    }

    #[test]
    fn everything_in_order_is_ok() {
        let l = ledger(&[(1, "a", 0), (2, "a", 1), (3, "b", 0)]);
        let v = check(
            &l,
            &[
                arrive(1, "a", 0, 1.0),
                arrive(3, "b", 0, 1.0),
                arrive(2, "a", 1, 2.0),
            ],
            &[],
        );
        assert!(v.ok(), "{v:?}");
        assert_eq!((v.delivered, v.lost, v.duplicates), (3, 0, 0));
    }

    #[test]
    fn a_missing_message_is_lost() {
        let l = ledger(&[(1, "a", 0), (2, "a", 1)]);
        let v = check(&l, &[arrive(1, "a", 0, 1.0)], &[]);
        assert_eq!(v.lost, 1);
        assert_eq!(v.lost_sample, vec![Uuid::from_u128(2).to_string()]);
        assert!(!v.ok());
    }

    #[test]
    fn an_uncommitted_message_is_a_phantom() {
        let l = ledger(&[(1, "a", 0)]);
        let v = check(&l, &[arrive(1, "a", 0, 1.0), arrive(9, "a", 1, 1.0)], &[]);
        assert_eq!(v.phantoms, 1);
        assert!(!v.ok());
    }

    #[test]
    fn a_later_message_first_is_an_order_violation() {
        let l = ledger(&[(1, "a", 0), (2, "a", 1)]);
        let v = check(&l, &[arrive(2, "a", 1, 1.0), arrive(1, "a", 0, 2.0)], &[]);
        assert_eq!(v.order_violations, 1);
        assert!(!v.ok());
    }

    #[test]
    fn a_redelivery_is_a_duplicate_attributed_to_the_last_fault_not_a_violation() {
        let l = ledger(&[(1, "a", 0), (2, "a", 1)]);
        let faults = [FaultMark {
            kind: "kill".into(),
            at: 1.5,
        }];
        let v = check(
            &l,
            &[
                arrive(1, "a", 0, 1.0),
                arrive(2, "a", 1, 1.0),
                arrive(1, "a", 0, 2.0),
            ],
            &faults,
        );
        assert!(v.ok(), "{v:?}");
        assert_eq!(v.duplicates, 1);
        assert_eq!(v.duplicates_after.get("kill"), Some(&1));
    }

    #[test]
    fn a_message_under_the_wrong_key_is_a_mismatch() {
        let l = ledger(&[(1, "a", 0)]);
        let v = check(&l, &[arrive(1, "b", 0, 1.0)], &[]);
        assert_eq!(v.mismatched, 1);
        assert!(!v.ok());
    }
}
