//! The inbox's Prometheus metrics, recorded through the `metrics` facade (see
//! `outbox_relay::telemetry`): the ingest daemon's (`outbox inbox`: received, duplicates
//! absorbed, acknowledgement failures, the commit of each batch) and the processor's (handled,
//! failed, handler latency, per message type; exported by the application that runs the
//! processor and installs a recorder). The handlers' lag is read from the processing queue at
//! scrape time (`outbox_inbox_lag_seconds`, `outbox-observe`).

use metrics::{counter, histogram, Counter, Histogram};
use outbox_relay::telemetry::{MetricDef, MetricKind, DURATION_BUCKETS};

/// Messages fetched from the source.
pub const RECEIVED: &str = "outbox_inbox_received_total";
/// Fetched messages already in the inbox.
pub const DUPLICATES: &str = "outbox_inbox_duplicates_total";
/// Acknowledgement rounds that failed.
pub const ACK_FAILURES: &str = "outbox_inbox_ack_failures_total";
/// One batch's insert transaction.
pub const INGEST_DURATION: &str = "outbox_inbox_ingest_duration_seconds";
/// Messages whose handler committed.
pub const HANDLED: &str = "outbox_inbox_handled_total";
/// Handler failures, by kind.
pub const HANDLER_FAILURES: &str = "outbox_inbox_handler_failures_total";
/// One handler run.
pub const HANDLER_DURATION: &str = "outbox_inbox_handler_duration_seconds";

/// The ingest daemon's metrics (`outbox inbox`).
pub const DAEMON_CATALOGUE: &[MetricDef] = &[
    MetricDef {
        name: RECEIVED,
        kind: MetricKind::Counter,
        labels: &["source"],
        help: "Messages fetched from the source (redeliveries included).",
        buckets: &[],
    },
    MetricDef {
        name: DUPLICATES,
        kind: MetricKind::Counter,
        labels: &["source"],
        help: "Fetched messages whose id the inbox already held: redeliveries absorbed.",
        buckets: &[],
    },
    MetricDef {
        name: ACK_FAILURES,
        kind: MetricKind::Counter,
        labels: &["source"],
        help: "Acknowledgement rounds that failed after their batch committed (those messages \
               come again and are absorbed).",
        buckets: &[],
    },
    MetricDef {
        name: INGEST_DURATION,
        kind: MetricKind::Histogram,
        labels: &["source"],
        help: "Seconds one batch's insert transaction took (commit included).",
        buckets: DURATION_BUCKETS,
    },
];

/// The processor's metrics (recorded in the process that runs `InboxProcessor`).
pub const PROCESSOR_CATALOGUE: &[MetricDef] = &[
    MetricDef {
        name: HANDLED,
        kind: MetricKind::Counter,
        labels: &["type"],
        help: "Inbox messages whose handler ran and committed (or that were found handled \
               already), by message type.",
        buckets: &[],
    },
    MetricDef {
        name: HANDLER_FAILURES,
        kind: MetricKind::Counter,
        labels: &["type", "kind"],
        help: "Handler runs that failed, by message type and kind: transient (retried), \
               permanent (failed at once), unavailable (the database), no_handler.",
        buckets: &[],
    },
    MetricDef {
        name: HANDLER_DURATION,
        kind: MetricKind::Histogram,
        labels: &["type"],
        help: "Seconds one handler run took, inside its transaction (commit excluded).",
        buckets: DURATION_BUCKETS,
    },
];

/// The daemon's handles for one source.
pub(crate) struct DaemonMetrics {
    pub(crate) received: Counter,
    pub(crate) duplicates: Counter,
    pub(crate) ack_failures: Counter,
    pub(crate) ingest_duration: Histogram,
}

impl DaemonMetrics {
    pub(crate) fn new(source: &str) -> Self {
        let labels = [("source", source.to_string())];
        Self {
            received: counter!(RECEIVED, &labels),
            duplicates: counter!(DUPLICATES, &labels),
            ack_failures: counter!(ACK_FAILURES, &labels),
            ingest_duration: histogram!(INGEST_DURATION, &labels),
        }
    }
}
