//! Counters the relay keeps while it runs (read by `outbox bench`, tests and metrics export).

use std::sync::atomic::{AtomicU64, Ordering};

/// Monotonic counters, shared by every worker of one relay.
#[derive(Debug, Default)]
pub struct RelayMetrics {
    /// Messages the sink acknowledged and the store marked.
    pub published: AtomicU64,
    /// Failed attempts that will be retried.
    pub retried: AtomicU64,
    /// Messages that ended `failed`.
    pub failed: AtomicU64,
    /// Messages not tried because their route's sink was down (no attempt spent).
    pub deferred: AtomicU64,
    /// Non-empty claims.
    pub batches: AtomicU64,
    /// Outcomes the store refused because the partition changed owner (fenced).
    pub fenced: AtomicU64,
    /// Claim statements run (empty ones and reads ahead included).
    pub claims: AtomicU64,
    /// Batches published from a read ahead, with no claim of their own (`Store::claim_ahead`).
    pub read_ahead: AtomicU64,
    /// Time spent in claims, in microseconds, summed: `claim_micros / claims` is the mean claim
    /// cost, which `outbox bench --mode idle-tx` compares at the start and end of a run.
    pub claim_micros: AtomicU64,
}

impl RelayMetrics {
    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// Current value of `counter`.
    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}
