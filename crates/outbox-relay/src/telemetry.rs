//! The relay engine's Prometheus metrics: their catalogue (name, type, labels, meaning,
//! buckets) and the handles the workers record through.
//!
//! Recorded through the `metrics` facade: whichever recorder the process installed before the
//! relay was built gets them (`outbox-observe` installs a Prometheus one for `outbox relay
//! --metrics-addr`; an application running the relay or the inbox processor may install its
//! own), and with none installed every handle is a no-op. Handles are registered once, when the
//! relay is built, per sink and route, so the hot path only adds to atomics: no name lookup, no
//! allocation per message.

use metrics::{counter, histogram, Counter, Histogram};
use outbox_core::SinkErrorKind;

/// What kind of Prometheus metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricKind {
    /// Only goes up (`_total`).
    Counter,
    /// A value that goes up and down.
    Gauge,
    /// Observations counted in buckets (`_bucket`, `_sum`, `_count`).
    Histogram,
}

impl MetricKind {
    /// `counter`, `gauge` or `histogram`, as the exposition format's `# TYPE` line says it.
    pub fn as_str(self) -> &'static str {
        match self {
            MetricKind::Counter => "counter",
            MetricKind::Gauge => "gauge",
            MetricKind::Histogram => "histogram",
        }
    }
}

/// One metric: everything the exporter, the documentation and the dashboard check need.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MetricDef {
    /// Full name, base units and `_total` included.
    pub name: &'static str,
    /// Its type.
    pub kind: MetricKind,
    /// Its label names.
    pub labels: &'static [&'static str],
    /// What it means (the `# HELP` line).
    pub help: &'static str,
    /// Upper bounds of its buckets (histograms only).
    pub buckets: &'static [f64],
}

/// Durations of statements and calls, in seconds: 1 ms to a minute.
pub const DURATION_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];
/// End-to-end latency, in seconds: 5 ms to an hour (a broker outage is waited out).
pub const LATENCY_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
];
/// Messages per batch.
pub const BATCH_MESSAGE_BUCKETS: &[f64] = &[
    1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0, 10000.0,
];
/// Payload bytes per batch: 1 KiB to 64 MiB.
pub const BATCH_BYTE_BUCKETS: &[f64] = &[
    1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0, 4194304.0, 16777216.0, 67108864.0,
];

/// Messages a sink acknowledged.
pub const PUBLISHED: &str = "outbox_published_total";
/// Failed publish attempts, by error kind.
pub const PUBLISH_ERRORS: &str = "outbox_publish_errors_total";
/// Failed attempts that will be retried.
pub const RETRIES: &str = "outbox_retries_total";
/// Messages that ended `failed`.
pub const FAILED: &str = "outbox_failed_total";
/// Messages held back because their sink's circuit was open.
pub const DEFERRED: &str = "outbox_deferred_total";
/// Row written to broker acknowledgement.
pub const LATENCY: &str = "outbox_end_to_end_latency_seconds";
/// One publish call.
pub const PUBLISH_DURATION: &str = "outbox_publish_duration_seconds";
/// One claim statement.
pub const CLAIM_DURATION: &str = "outbox_claim_duration_seconds";
/// One record statement.
pub const RECORD_DURATION: &str = "outbox_record_duration_seconds";
/// Messages per claimed batch.
pub const BATCH_MESSAGES: &str = "outbox_batch_messages";
/// Payload bytes per claimed batch.
pub const BATCH_BYTES: &str = "outbox_batch_bytes";
/// Outcomes refused by the store because the partition changed owner.
pub const FENCED: &str = "outbox_fenced_total";

const SINK_ROUTE: &[&str] = &["sink", "route"];

/// Every metric the relay engine records itself (the figures read from the store and the
/// circuit and partition gauges are set at scrape time by `outbox-observe`, which has its own
/// catalogue).
pub const CATALOGUE: &[MetricDef] = &[
    MetricDef {
        name: PUBLISHED,
        kind: MetricKind::Counter,
        labels: SINK_ROUTE,
        help: "Messages the sink acknowledged (a message published again after a crash, a \
               timeout or a lost lease counts again).",
        buckets: &[],
    },
    MetricDef {
        name: PUBLISH_ERRORS,
        kind: MetricKind::Counter,
        labels: &["sink", "route", "kind"],
        help: "Messages a publish attempt failed for, by error kind: unavailable (the broker \
               could not be reached or did not answer in time), rejected (it refused the \
               message), invalid (the message can never be published as it is).",
        buckets: &[],
    },
    MetricDef {
        name: RETRIES,
        kind: MetricKind::Counter,
        labels: SINK_ROUTE,
        help: "Failed attempts that will be retried after a backoff (the message is parked \
               with its key).",
        buckets: &[],
    },
    MetricDef {
        name: FAILED,
        kind: MetricKind::Counter,
        labels: SINK_ROUTE,
        help: "Messages that ended failed (budget spent, or invalid); they stay in the outbox, \
               redrivable. route=\"none\" counts rows no route matched.",
        buckets: &[],
    },
    MetricDef {
        name: DEFERRED,
        kind: MetricKind::Counter,
        labels: SINK_ROUTE,
        help: "Messages held back without an attempt because their sink's circuit was open.",
        buckets: &[],
    },
    MetricDef {
        name: LATENCY,
        kind: MetricKind::Histogram,
        labels: SINK_ROUTE,
        help: "Seconds from the row's created_at (its transaction's start) to the broker's \
               acknowledgement.",
        buckets: LATENCY_BUCKETS,
    },
    MetricDef {
        name: PUBLISH_DURATION,
        kind: MetricKind::Histogram,
        labels: SINK_ROUTE,
        help: "Seconds one publish call took, from sending to every acknowledgement (or its \
               deadline).",
        buckets: DURATION_BUCKETS,
    },
    MetricDef {
        name: CLAIM_DURATION,
        kind: MetricKind::Histogram,
        labels: &[],
        help: "Seconds one claim statement took (reads ahead included).",
        buckets: DURATION_BUCKETS,
    },
    MetricDef {
        name: RECORD_DURATION,
        kind: MetricKind::Histogram,
        labels: &[],
        help: "Seconds one record statement took (positions, parking and retries of a batch).",
        buckets: DURATION_BUCKETS,
    },
    MetricDef {
        name: BATCH_MESSAGES,
        kind: MetricKind::Histogram,
        labels: &[],
        help: "Messages per claimed batch.",
        buckets: BATCH_MESSAGE_BUCKETS,
    },
    MetricDef {
        name: BATCH_BYTES,
        kind: MetricKind::Histogram,
        labels: &[],
        help: "Payload bytes per claimed batch.",
        buckets: BATCH_BYTE_BUCKETS,
    },
    MetricDef {
        name: FENCED,
        kind: MetricKind::Counter,
        labels: &[],
        help: "Outcomes the store refused to record because the partition changed owner (a \
               zombie relay, or a lease that lapsed mid-batch); their messages are published \
               again by the new owner.",
        buckets: &[],
    },
];

/// The handles of one lane (a sink and its route).
pub(crate) struct LaneMetrics {
    pub(crate) published: Counter,
    errors: [Counter; 3],
    pub(crate) retries: Counter,
    pub(crate) failed: Counter,
    pub(crate) deferred: Counter,
    pub(crate) latency: Histogram,
    pub(crate) publish_duration: Histogram,
}

impl LaneMetrics {
    /// Registers the handles of `sink` serving `route` with the current recorder.
    pub(crate) fn new(sink: &str, route: &str) -> Self {
        let labels = [("sink", sink.to_string()), ("route", route.to_string())];
        let kind = |k: SinkErrorKind| {
            counter!(PUBLISH_ERRORS, "sink" => sink.to_string(), "route" => route.to_string(),
                     "kind" => k.as_str())
        };
        Self {
            published: counter!(PUBLISHED, &labels),
            errors: [
                kind(SinkErrorKind::Unavailable),
                kind(SinkErrorKind::Rejected),
                kind(SinkErrorKind::Invalid),
            ],
            retries: counter!(RETRIES, &labels),
            failed: counter!(FAILED, &labels),
            deferred: counter!(DEFERRED, &labels),
            latency: histogram!(LATENCY, &labels),
            publish_duration: histogram!(PUBLISH_DURATION, &labels),
        }
    }

    /// The error counter of `kind`.
    pub(crate) fn error(&self, kind: SinkErrorKind) -> &Counter {
        match kind {
            SinkErrorKind::Unavailable => &self.errors[0],
            SinkErrorKind::Rejected => &self.errors[1],
            SinkErrorKind::Invalid => &self.errors[2],
        }
    }
}

/// The handles of the engine as a whole (shared by its workers).
pub(crate) struct EngineMetrics {
    pub(crate) claim_duration: Histogram,
    pub(crate) record_duration: Histogram,
    pub(crate) batch_messages: Histogram,
    pub(crate) batch_bytes: Histogram,
    pub(crate) fenced: Counter,
    /// Rows no route matched that ended failed (a routed relay without a default sink).
    pub(crate) unrouted_failed: Counter,
}

impl EngineMetrics {
    pub(crate) fn new() -> Self {
        Self {
            claim_duration: histogram!(CLAIM_DURATION),
            record_duration: histogram!(RECORD_DURATION),
            batch_messages: histogram!(BATCH_MESSAGES),
            batch_bytes: histogram!(BATCH_BYTES),
            fenced: counter!(FENCED),
            unrouted_failed: counter!(FAILED, "sink" => "none", "route" => "none"),
        }
    }
}
