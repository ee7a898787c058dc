//! Tunables of the relay engine, with defaults named.

use std::time::Duration;

use outbox_core::{DestinationTemplate, OnFailed, RetryPolicy};

/// Default rows per claim.
pub const DEFAULT_BATCH_SIZE: usize = 1000;
/// Default worker tasks (relay members) per process.
pub const DEFAULT_WORKERS: usize = 2;
/// Default poll interval, the safety net under LISTEN/NOTIFY.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(1);
/// Default partition lease; a killed relay's partitions are taken over after this long.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);

/// How the relay claims, publishes and retries.
#[derive(Debug, Clone)]
pub struct RelayConfig {
    /// Rows claimed per statement.
    pub batch_size: usize,
    /// Worker tasks in this process; each is a member owning its own partitions.
    pub workers: usize,
    /// Longest wait between two claims when no notification arrives.
    pub poll_interval: Duration,
    /// Whether to wake on store notifications (PostgreSQL `LISTEN`).
    pub listen: bool,
    /// Partition lease; renewed every third of it while the relay lives.
    pub lease: Duration,
    /// Retry budget and backoff per message.
    pub retry: RetryPolicy,
    /// Destination template.
    pub destination: DestinationTemplate,
    /// Whether a `failed` message holds back the later messages of its key (the default) or not.
    pub on_failed: OnFailed,
    /// Failed publish calls in a row that open the sink's circuit breaker.
    pub breaker_threshold: u32,
    /// Prefix of member ids (host and process id by default), for `outbox status`.
    pub member_prefix: String,
}

impl Default for RelayConfig {
    fn default() -> Self {
        Self {
            batch_size: DEFAULT_BATCH_SIZE,
            workers: DEFAULT_WORKERS,
            poll_interval: DEFAULT_POLL_INTERVAL,
            listen: true,
            lease: DEFAULT_LEASE,
            retry: RetryPolicy::default(),
            destination: DestinationTemplate::default(),
            on_failed: OnFailed::Block,
            breaker_threshold: crate::breaker::DEFAULT_THRESHOLD,
            member_prefix: format!("relay-{}", std::process::id()),
        }
    }
}

impl RelayConfig {
    /// How much lease must remain before the relay publishes another wave. A relay that cannot
    /// promise to finish a wave inside its lease renews first, so it does not publish rows a
    /// new owner may already be serving.
    pub fn lease_margin(&self) -> Duration {
        (self.lease / 3).max(Duration::from_millis(200))
    }
}
