//! Tunables of the relay engine, with defaults named.

use std::time::Duration;

use outbox_core::{DestinationRules, DestinationTemplate, OnFailed, RetryPolicy};

/// Default rows per claim.
pub const DEFAULT_BATCH_SIZE: usize = 1000;
/// Default payload bytes a relay process holds at once (16 MiB), shared by its workers: its
/// memory for payloads stays near this whatever the rows weigh (a single larger payload still
/// goes through, alone).
pub const DEFAULT_BATCH_BYTES: usize = 16 * 1024 * 1024;
/// Default worker tasks (relay members) per process.
pub const DEFAULT_WORKERS: usize = 2;
/// Default longest wait between two claims when idle. The relay polls adaptively: again at once
/// after a full batch, after 1 ms after a partial one, doubling while polls come back empty, up
/// to this. An empty poll costs a few index probes per partition.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_millis(100);
/// Shortest wait after a poll that found something but not a full batch.
pub const MIN_POLL_INTERVAL: Duration = Duration::from_millis(1);
/// Default retention: storage every reader has passed is dropped this long after.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);
/// How often the relay runs store maintenance (segments ahead, retention).
pub const DEFAULT_MAINTAIN_EVERY: Duration = Duration::from_secs(30);
/// Default partition lease; a killed relay's partitions are taken over after this long.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
/// Default deadline of one store call made by a worker (claim, record, renew, rebalance,
/// release, health report). Above the stores' own lock and pool timeouts (5 s, 10 s acquire on
/// PostgreSQL), so those report first; it catches what they cannot: a connection that went
/// silent without closing.
pub const DEFAULT_STORE_TIMEOUT: Duration = Duration::from_secs(15);

/// How the relay claims, publishes and retries.
#[derive(Debug, Clone)]
pub struct RelayConfig {
    /// Rows claimed per statement.
    pub batch_size: usize,
    /// Payload bytes this relay holds at once, split evenly among its workers: each claim hands
    /// out at most [`RelayConfig::claim_bytes`] (see [`outbox_core::ClaimLimits`]).
    pub batch_bytes: usize,
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
    /// Deadline of each store call a worker makes; one without an answer by then is abandoned
    /// (see `docs/guarantees.md`, "Deadlines").
    pub store_timeout: Duration,
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
    /// Whether a worker reads its next batch while a full one is being published (on by
    /// default; see `Store::claim_ahead`). Off, every claim waits for the batch before it.
    pub read_ahead: bool,
}

impl Default for RelayConfig {
    fn default() -> Self {
        Self {
            batch_size: DEFAULT_BATCH_SIZE,
            batch_bytes: DEFAULT_BATCH_BYTES,
            workers: DEFAULT_WORKERS,
            poll_interval: DEFAULT_POLL_INTERVAL,
            listen: false,
            retention: DEFAULT_RETENTION,
            maintain_every: DEFAULT_MAINTAIN_EVERY,
            lease: DEFAULT_LEASE,
            store_timeout: DEFAULT_STORE_TIMEOUT,
            retry: RetryPolicy::default(),
            destination: DestinationTemplate::default(),
            destination_rules: DestinationRules::default(),
            on_failed: OnFailed::Block,
            breaker_threshold: crate::breaker::DEFAULT_THRESHOLD,
            member_prefix: format!("relay-{}", std::process::id()),
            read_ahead: true,
        }
    }
}

impl RelayConfig {
    /// How much lease must remain before the relay sends another publish call. A relay that
    /// cannot promise to finish a call inside its lease renews first, so it does not publish
    /// rows a new owner may already be serving.
    pub fn lease_margin(&self) -> Duration {
        (self.lease / 3).max(Duration::from_millis(200))
    }

    /// Payload bytes one worker's claim may hand out: an even share of `batch_bytes`. A worker
    /// holds one batch at a time, and the next one read ahead only within what the first leaves
    /// of that share, so the process holds at most `batch_bytes` of payloads (plus, per worker,
    /// one payload larger than its share, which goes through alone).
    pub fn claim_bytes(&self) -> usize {
        (self.batch_bytes / self.workers.max(1)).max(1)
    }

    /// The deadline of one `Sink::publish` call for a sink whose ack timeout is `ack_timeout`:
    /// that timeout and a quarter more, or the lease margin for a sink without one, and never
    /// more than the lease margin. A call is only sent with the margin left on the lease, so
    /// a call that ends by this deadline ends while the lease still holds. The quarter lets a
    /// sink that answers by itself (its own timeout, with the reason it knows) answer first: the
    /// deadline is for sinks that never answer.
    pub fn publish_deadline(&self, ack_timeout: Option<Duration>) -> Duration {
        ack_timeout
            .map_or_else(|| self.lease_margin(), |ack| ack + ack / 4)
            .min(self.lease_margin())
    }

    /// How long a worker may go without finishing a step of its loop before the liveness probe
    /// calls it wedged: twice the longest step the settings allow (a store call, a publish
    /// call, or the reconnect backoff's longest pause, 10 s). 30 s with the defaults.
    pub fn live_bound(&self) -> Duration {
        let step = self
            .store_timeout
            .max(self.lease_margin())
            .max(Duration::from_secs(10));
        step * 2
    }

    /// Checks that a sink's `ack_timeout` fits in a third of the lease: a relay must be able to
    /// wait for an acknowledgement and still hold its partitions. The error names both values.
    pub fn check_ack_timeout(&self, ack_timeout: Duration) -> Result<(), String> {
        if ack_timeout <= self.lease / 3 {
            return Ok(());
        }
        Err(format!(
            "the sink's ack_timeout {} does not fit in a third of the lease {} ({}): a relay \
             must be able to wait for an acknowledgement and still hold its lease; raise the \
             lease to at least {} (--lease, OUTBOX_LEASE or [relay] lease) or lower ack_timeout \
             in the sink URL (e.g. ?ack_timeout={})",
            show(ack_timeout),
            show(self.lease),
            show(self.lease / 3),
            show(ack_timeout * 3),
            show(self.lease / 3),
        ))
    }
}

/// `5s` for whole seconds, `1500ms` otherwise: how durations are written in flags and URLs.
fn show(d: Duration) -> String {
    if d.subsec_nanos() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_publish_deadline_never_outlives_the_lease_margin() {
        let c = RelayConfig {
            lease: Duration::from_secs(3),
            ..RelayConfig::default()
        };
        assert_eq!(c.publish_deadline(None), Duration::from_secs(1));
        assert_eq!(
            c.publish_deadline(Some(Duration::from_millis(400))),
            Duration::from_millis(500),
            "the sink's own timeout answers first"
        );
        assert_eq!(
            c.publish_deadline(Some(Duration::from_millis(900))),
            Duration::from_secs(1),
            "capped at a third of the lease"
        );
        assert_eq!(
            c.publish_deadline(Some(Duration::from_secs(5))),
            Duration::from_secs(1)
        );
    }

    #[test]
    fn an_ack_timeout_must_fit_in_a_third_of_the_lease() {
        let c = RelayConfig {
            lease: Duration::from_secs(3),
            ..RelayConfig::default()
        };
        assert!(c.check_ack_timeout(Duration::from_secs(1)).is_ok());
        let e = c
            .check_ack_timeout(Duration::from_secs(5))
            .expect_err("5s does not fit in 1s");
        assert!(
            e.contains("ack_timeout 5s") && e.contains("lease 3s"),
            "{e}"
        );
        assert!(e.contains("at least 15s"), "{e}");
        assert!(c.check_ack_timeout(Duration::from_millis(1001)).is_err());
    }
}
