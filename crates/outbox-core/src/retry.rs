//! Per-message retry policy (exponential backoff with half jitter, a cap and an attempt
//! budget), and [`Backoff`], the one reconnect backoff of every loop that waits out an outage.

use std::time::Duration;

/// Default number of delivery attempts before a message is marked `failed`.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 10;
/// Default first backoff.
pub const DEFAULT_BACKOFF_BASE: Duration = Duration::from_secs(1);
/// Default longest backoff.
pub const DEFAULT_BACKOFF_MAX: Duration = Duration::from_secs(300);

/// How often and how soon a failed publish is retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts (including the first) before the message ends `failed`. At least 1.
    pub max_attempts: u32,
    /// Backoff after the first failure; doubles after each further failure.
    pub base: Duration,
    /// Upper bound of any single backoff.
    pub max: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            base: DEFAULT_BACKOFF_BASE,
            max: DEFAULT_BACKOFF_MAX,
        }
    }
}

/// What to do with a message whose publish just failed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RetryDecision {
    /// Try again after this delay.
    RetryAfter(Duration),
    /// Give up: the message becomes `failed`, visible and redrivable.
    Fail,
}

impl RetryPolicy {
    /// Decides after the `attempts`-th failed attempt (1 = the first publish failed).
    /// `retriable` is [`SinkError::retriable`](crate::SinkError::retriable): an invalid message
    /// fails at once; an unavailable broker or a rejection backs off until the budget is spent.
    pub fn decide(&self, attempts: u32, retriable: bool) -> RetryDecision {
        if !retriable || attempts >= self.max_attempts.max(1) {
            return RetryDecision::Fail;
        }
        RetryDecision::RetryAfter(self.backoff(attempts))
    }

    /// Backoff after `attempts` failures: a random delay in [cap/2, cap] where
    /// cap = min(max, base * 2^(attempts-1)). Half-jitter keeps retries spread out without
    /// ever retrying immediately.
    pub fn backoff(&self, attempts: u32) -> Duration {
        let exp = attempts.saturating_sub(1).min(32);
        let cap = self.base.saturating_mul(1u32 << exp.min(31)).min(self.max);
        let half = cap / 2;
        half + Duration::from_nanos(fastrand::u64(
            0..=(cap - half).as_nanos().min(u64::MAX as u128) as u64,
        ))
    }
}

/// The backoff of a loop that waits out an outage (a database, a broker, a listener): the first
/// wait is `min`, each failure in a row doubles it up to `max`, a success starts over. One type
/// for every such loop, so they all behave (and log) alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    next: Duration,
    failures: u32,
}

impl Backoff {
    /// The usual reconnect backoff: 100 ms doubling to 10 s.
    pub const RECONNECT: Backoff =
        Backoff::new(Duration::from_millis(100), Duration::from_secs(10));

    /// From `min`, doubling to `max`.
    pub const fn new(min: Duration, max: Duration) -> Self {
        Self {
            min,
            max,
            next: min,
            failures: 0,
        }
    }

    /// Records a failure; returns how long to wait before the next try.
    pub fn failed(&mut self) -> Duration {
        self.failures = self.failures.saturating_add(1);
        let wait = self.next;
        self.next = (self.next * 2).min(self.max);
        wait
    }

    /// Records a success; returns how many failures in a row came before it (0: none).
    pub fn succeeded(&mut self) -> u32 {
        let failures = self.failures;
        self.next = self.min;
        self.failures = 0;
        failures
    }

    /// Failures in a row so far.
    pub fn failures(&self) -> u32 {
        self.failures
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_and_is_capped() {
        let p = RetryPolicy {
            max_attempts: 20,
            base: Duration::from_millis(100),
            max: Duration::from_secs(2),
        };
        for _ in 0..100 {
            let b1 = p.backoff(1);
            assert!(b1 >= Duration::from_millis(50) && b1 <= Duration::from_millis(100));
            let b3 = p.backoff(3);
            assert!(b3 >= Duration::from_millis(200) && b3 <= Duration::from_millis(400));
            let b30 = p.backoff(30);
            assert!(b30 >= Duration::from_secs(1) && b30 <= Duration::from_secs(2));
        }
    }

    #[test]
    fn permanent_errors_and_spent_budgets_fail() {
        let p = RetryPolicy {
            max_attempts: 3,
            ..RetryPolicy::default()
        };
        assert_eq!(p.decide(1, false), RetryDecision::Fail);
        assert!(matches!(p.decide(2, true), RetryDecision::RetryAfter(_)));
        assert_eq!(p.decide(3, true), RetryDecision::Fail);
    }

    #[test]
    fn a_backoff_doubles_to_its_cap_and_starts_over_after_a_success() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_millis(350));
        let waits: Vec<u128> = (0..4).map(|_| b.failed().as_millis()).collect();
        assert_eq!(waits, vec![100, 200, 350, 350]);
        assert_eq!(b.succeeded(), 4);
        assert_eq!(b.failed(), Duration::from_millis(100));
    }
}
