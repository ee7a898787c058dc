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
    /// Claim times, for percentiles: see [`ClaimTimes`].
    pub claim_times: ClaimTimes,
}

/// Claim times counted in buckets whose bounds double from 64 µs up (the last one holds
/// everything from about 4.2 s on), and the longest claim seen. Percentiles read from it are the
/// upper bound of the bucket they fall in: within a factor of two, enough to tell 5 ms from
/// 100 ms.
#[derive(Debug, Default)]
pub struct ClaimTimes {
    buckets: [AtomicU64; CLAIM_BUCKETS],
    max_micros: AtomicU64,
}

const CLAIM_BUCKETS: usize = 18;
/// Upper bound of the first bucket, in microseconds.
const FIRST_BOUND_MICROS: u64 = 64;

impl ClaimTimes {
    /// Counts one claim of `micros` microseconds.
    pub fn record(&self, micros: u64) {
        let mut i = 0;
        let mut bound = FIRST_BOUND_MICROS;
        while micros > bound && i < CLAIM_BUCKETS - 1 {
            bound *= 2;
            i += 1;
        }
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        self.max_micros.fetch_max(micros, Ordering::Relaxed);
    }

    /// The counts so far, to subtract from a later reading.
    pub fn snapshot(&self) -> ClaimTimesSnapshot {
        ClaimTimesSnapshot {
            buckets: std::array::from_fn(|i| self.buckets[i].load(Ordering::Relaxed)),
            max_micros: self.max_micros.load(Ordering::Relaxed),
        }
    }
}

/// [`ClaimTimes`] at one instant.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClaimTimesSnapshot {
    buckets: [u64; CLAIM_BUCKETS],
    /// The longest claim seen up to this instant, in microseconds.
    pub max_micros: u64,
}

impl ClaimTimesSnapshot {
    /// Claims counted since `earlier`.
    pub fn since(&self, earlier: &Self) -> Self {
        Self {
            buckets: std::array::from_fn(|i| self.buckets[i].saturating_sub(earlier.buckets[i])),
            max_micros: self.max_micros,
        }
    }

    /// Claims counted.
    pub fn count(&self) -> u64 {
        self.buckets.iter().sum()
    }

    /// The `q` quantile (0..=1) as the upper bound of its bucket, in milliseconds; `None` when
    /// nothing was counted.
    pub fn quantile_ms(&self, q: f64) -> Option<f64> {
        let total = self.count();
        if total == 0 {
            return None;
        }
        let rank = ((total as f64) * q.clamp(0.0, 1.0)).ceil().max(1.0) as u64;
        let mut seen = 0;
        let mut bound = FIRST_BOUND_MICROS;
        for (i, n) in self.buckets.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return Some(if i == CLAIM_BUCKETS - 1 {
                    self.max_micros as f64 / 1e3
                } else {
                    bound as f64 / 1e3
                });
            }
            bound *= 2;
        }
        Some(self.max_micros as f64 / 1e3)
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claim_quantiles_are_the_upper_bound_of_their_bucket() {
        let t = ClaimTimes::default();
        for _ in 0..98 {
            t.record(900); // 512..1024 µs
        }
        t.record(40_000); // 32.8..65.5 ms
        t.record(3_000_000);
        let s = t.snapshot();
        assert_eq!(s.count(), 100);
        assert_eq!(s.quantile_ms(0.5), Some(1.024));
        assert_eq!(s.quantile_ms(0.99), Some(65.536));
        assert_eq!(s.quantile_ms(1.0), Some(4194.304));
        assert_eq!(s.max_micros, 3_000_000);
        let later = t.snapshot();
        assert_eq!(later.since(&s).count(), 0);
        assert_eq!(later.since(&s).quantile_ms(0.5), None);
    }
}
