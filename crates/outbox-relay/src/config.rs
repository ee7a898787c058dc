//! Tunables of the relay engine, with defaults named.

use std::time::Duration;

use outbox_core::{DestinationRules, DestinationTemplate, OnFailed, RetryPolicy};

/// Default rows per claim.
pub const DEFAULT_BATCH_SIZE: usize = 1000;
/// Default worker tasks (relay members) per process.
pub const DEFAULT_WORKERS: usize = 2;
/// Default longest wait between two claims when idle. The relay polls adaptively: again at once
/// after a full batch, after 1 ms after a partial one, doubling while polls come back empty, up
/// to this. An empty poll costs a few index probes per partition.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_millis(50);
/// Shortest wait after a poll that found something but not a full batch.
pub const MIN_POLL_INTERVAL: Duration = Duration::from_millis(1);
/// Default retention: storage every reader has passed is dropped this long after.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);
/// How often the relay runs store maintenance (segments ahead, retention).
pub const DEFAULT_MAINTAIN_EVERY: Duration = Duration::from_secs(30);
/// Default partition lease; a killed relay's partitions are taken over after this long.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);

/// How the relay claims, publishes and retries.
#[derive(Debug, Clone)]
pub struct RelayConfig {
    /// Rows claimed per statement.
    pub batch_size: usize,
    /// Worker tasks in this process; each is a member owning its own partitions.
    pub workers: usize,
    /// Longest wait between two claims when idle (polls back off to it while empty).
    pub poll_interval: Duration,
    /// Whether to also wake on store notifications (PostgreSQL `LISTEN`; needs the opt-in
    /// doorbell installed by `outbox migrate --notify`).
    pub listen: bool,
    /// How long storage every reader has passed is kept before it is dropped.
    pub retention: Duration,
    /// How often store maintenance runs; zero turns it off (run `outbox maintain` instead).
    pub maintain_every: Duration,
    /// Partition lease; renewed every third of it while the relay lives.
    pub lease: Duration,
    /// Retry budget and backoff per message.
    pub retry: RetryPolicy,
    /// Destination template.
    pub destination: DestinationTemplate,
    /// Where rendered destinations may point (fixed rules, and the `--allow-destinations`
    /// patterns when set). A row whose destination breaks them ends `failed` with the reason.
    pub destination_rules: DestinationRules,
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
            listen: false,
            retention: DEFAULT_RETENTION,
            maintain_every: DEFAULT_MAINTAIN_EVERY,
            lease: DEFAULT_LEASE,
            retry: RetryPolicy::default(),
            destination: DestinationTemplate::default(),
            destination_rules: DestinationRules::default(),
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
