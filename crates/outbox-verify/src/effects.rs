//! The end-to-end checker of `outbox verify --through-inbox`: the effects the inbox handlers
//! applied against what was committed. Pure, so each verdict is unit-tested.
//!
//! The path under test is outbox relay → broker → `outbox inbox` daemons → the inbox processor's
//! handlers, every process killed and paused by the faults. The handler writes one
//! `verify_effects` row per call, in its transaction, with no constraint of its own: a message
//! whose effect committed twice shows up twice. Exactly once is judged per committed message;
//! per-key order by the order the effects committed (their identity), against commit order
//! (`n`) for the writer-API keys.

use std::collections::{HashMap, HashSet};

use serde::Serialize;
use uuid::Uuid;

use crate::checker::{Committed, WriterKind};

/// One applied effect, in the order effects committed.
#[derive(Debug, Clone, PartialEq)]
pub struct Effect {
    /// The message it applied.
    pub id: Uuid,
    /// The key the handler saw.
    pub key: String,
}

/// What the effects say.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct EffectsVerdict {
    /// Committed messages whose effect was applied (at least once).
    pub effects_applied: usize,
    /// Committed messages whose effect never was (must be 0).
    pub effects_missing: usize,
    /// Messages whose effect was applied more than once (must be 0).
    pub effects_duplicated: usize,
    /// Effects of messages no committed transaction wrote (must be 0).
    pub effects_phantoms: usize,
    /// Effects applied under another key than the message's (must be 0).
    pub effects_mismatched: usize,
    /// Writer-API keys: effects applied after an effect of the key that committed later
    /// (must be 0).
    pub handler_order_violations: usize,
    /// Raw-SQL keys (information): adjacent effects out of commit order; the inbox keeps the
    /// broker's order, which for these keys may already differ from commit order.
    pub raw_handler_pairs_out_of_order: usize,
    /// Up to ten missing ids.
    pub missing_sample: Vec<String>,
}

impl EffectsVerdict {
    /// Whether every effect was applied exactly once and in order.
    pub fn ok(&self) -> bool {
        self.effects_missing == 0
            && self.effects_duplicated == 0
            && self.effects_phantoms == 0
            && self.effects_mismatched == 0
            && self.handler_order_violations == 0
    }
}

/// Judges `effects` (in commit order) against the `ledger`.
pub fn check_effects(ledger: &HashMap<Uuid, Committed>, effects: &[Effect]) -> EffectsVerdict {
    let mut v = EffectsVerdict::default();
    let mut count: HashMap<Uuid, usize> = HashMap::with_capacity(effects.len());
    let mut high: HashMap<&str, i64> = HashMap::new();
    let mut last_raw: HashMap<&str, i64> = HashMap::new();
    for e in effects {
        let n = count.entry(e.id).or_insert(0);
        *n += 1;
        if *n > 1 {
            continue;
        }
        let Some(c) = ledger.get(&e.id) else {
            v.effects_phantoms += 1;
            continue;
        };
        if c.key != e.key {
            v.effects_mismatched += 1;
        }
        match c.writer {
            WriterKind::Locked | WriterKind::Emit | WriterKind::Xa => {
                let h = high.entry(c.key.as_str()).or_insert(i64::MIN);
                if c.n < *h {
                    v.handler_order_violations += 1;
                } else {
                    *h = c.n;
                }
            }
            WriterKind::Raw => {
                if let Some(prev) = last_raw.insert(c.key.as_str(), c.n) {
                    if c.n < prev {
                        v.raw_handler_pairs_out_of_order += 1;
                    }
                }
            }
        }
    }
    v.effects_duplicated = count.values().filter(|&&n| n > 1).count();
    let applied: HashSet<&Uuid> = count.keys().collect();
    v.effects_applied = ledger.keys().filter(|id| applied.contains(id)).count();
    v.effects_missing = ledger.len() - v.effects_applied;
    v.missing_sample = ledger
        .keys()
        .filter(|id| !applied.contains(id))
        .take(10)
        .map(Uuid::to_string)
        .collect();
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ledger(rows: &[(u128, &str, i64, WriterKind)]) -> HashMap<Uuid, Committed> {
        rows.iter()
            .map(|&(id, key, n, writer)| {
                (
                    Uuid::from_u128(id),
                    Committed {
                        key: key.into(),
                        n,
                        writer,
                        producer: 0,
                    },
                )
            })
            .collect()
    }

    fn effect(id: u128, key: &str) -> Effect {
        Effect {
            id: Uuid::from_u128(id),
            key: key.into(),
        }
    }

    const L: WriterKind = WriterKind::Locked;
    const R: WriterKind = WriterKind::Raw;

    #[test]
    fn every_effect_once_in_order_is_ok() {
        let l = ledger(&[(1, "a", 1, L), (2, "a", 2, L), (3, "b", 1, L)]);
        let v = check_effects(&l, &[effect(1, "a"), effect(3, "b"), effect(2, "a")]);
        assert!(v.ok(), "{v:?}");
        assert_eq!(v.effects_applied, 3);
    }

    #[test]
    fn a_missing_a_doubled_and_a_phantom_effect_are_each_named() {
        let l = ledger(&[(1, "a", 1, L), (2, "a", 2, L)]);
        let v = check_effects(&l, &[effect(1, "a"), effect(1, "a"), effect(9, "z")]);
        assert_eq!(
            (v.effects_missing, v.effects_duplicated, v.effects_phantoms),
            (1, 1, 1)
        );
        assert_eq!(v.missing_sample, vec![Uuid::from_u128(2).to_string()]);
        assert!(!v.ok());
    }

    #[test]
    fn a_key_applied_out_of_commit_order_is_a_violation_for_locked_keys_only() {
        let l = ledger(&[
            (1, "a", 1, L),
            (2, "a", 2, L),
            (3, "r", 1, R),
            (4, "r", 2, R),
        ]);
        let v = check_effects(
            &l,
            &[
                effect(2, "a"),
                effect(1, "a"),
                effect(4, "r"),
                effect(3, "r"),
            ],
        );
        assert_eq!(v.handler_order_violations, 1);
        assert_eq!(v.raw_handler_pairs_out_of_order, 1);
        assert!(!v.ok());
        let v = check_effects(
            &l,
            &[
                effect(1, "a"),
                effect(2, "a"),
                effect(4, "r"),
                effect(3, "r"),
            ],
        );
        assert!(v.ok(), "raw order is information: {v:?}");
    }

    #[test]
    fn an_effect_under_another_key_is_a_mismatch() {
        let l = ledger(&[(1, "a", 1, L)]);
        let v = check_effects(&l, &[effect(1, "b")]);
        assert_eq!(v.effects_mismatched, 1);
        assert!(!v.ok());
    }
}
