//! The metrics set at scrape time: the store's figures (one statement per scrape), the
//! circuits and the partitions owned. Their names for the relay ([`RELAY`]) and for the
//! inbox's processing queue ([`INBOX`]), and their catalogue entries.

use outbox_relay::telemetry::{MetricDef, MetricKind};

/// The names under which a [`crate::Target`] exports its store's figures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreNames {
    /// Messages not yet handled (counted up to the store's cap).
    pub pending: &'static str,
    /// 1 when `pending` stopped at the store's cap.
    pub pending_capped: &'static str,
    /// Age of the oldest message not yet handled, at most.
    pub oldest_age: &'static str,
    /// Messages waiting for a retry.
    pub retrying: &'static str,
    /// Messages parked.
    pub parked: &'static str,
    /// Messages failed.
    pub failed: &'static str,
    /// Partitions at the parking cap.
    pub at_parking_cap: &'static str,
    /// Segments kept.
    pub segments: &'static str,
    /// Age of what holds retention, by kind.
    pub retention_pin: &'static str,
    /// Whether the scrape's query answered.
    pub store_up: &'static str,
    /// How long the scrape's query took.
    pub query_duration: &'static str,
}

/// The relay's store figures.
pub const RELAY: StoreNames = StoreNames {
    pending: "outbox_pending_messages",
    pending_capped: "outbox_pending_capped",
    oldest_age: "outbox_oldest_pending_age_seconds",
    retrying: "outbox_retrying_messages",
    parked: "outbox_parked_messages",
    failed: "outbox_failed_messages",
    at_parking_cap: "outbox_partitions_at_parking_cap",
    segments: "outbox_segments",
    retention_pin: "outbox_retention_pin_age_seconds",
    store_up: "outbox_store_up",
    query_duration: "outbox_store_query_duration_seconds",
};

/// The inbox processing queue's figures (`outbox inbox`): what was received and not yet
/// handled.
pub const INBOX: StoreNames = StoreNames {
    pending: "outbox_inbox_pending_messages",
    pending_capped: "outbox_inbox_pending_capped",
    oldest_age: "outbox_inbox_lag_seconds",
    retrying: "outbox_inbox_retrying_messages",
    parked: "outbox_inbox_parked_messages",
    failed: "outbox_inbox_failed_messages",
    at_parking_cap: "outbox_inbox_partitions_at_parking_cap",
    segments: "outbox_inbox_segments",
    retention_pin: "outbox_inbox_retention_pin_age_seconds",
    store_up: "outbox_inbox_store_up",
    query_duration: "outbox_inbox_store_query_duration_seconds",
};

/// The circuit state per sink: 0 closed, 1 half-open, 2 open.
pub(crate) const CIRCUIT_STATE: &str = "outbox_circuit_state";
/// Seconds the circuit has been open or half-open (0 while closed).
pub(crate) const CIRCUIT_OPEN: &str = "outbox_circuit_open_seconds";
/// Partitions each worker owns.
pub(crate) const PARTITIONS_OWNED: &str = "outbox_partitions_owned";
/// Seconds since each worker last finished a step.
pub(crate) const WORKER_SILENCE: &str = "outbox_worker_last_step_age_seconds";
/// Pending messages per route (read at most every [`crate::target`]'s route interval).
pub(crate) const ROUTE_PENDING: &str = "outbox_route_pending_messages";
/// Age of each route's oldest pending message.
pub(crate) const ROUTE_OLDEST: &str = "outbox_route_oldest_pending_age_seconds";

const fn gauge(
    name: &'static str,
    labels: &'static [&'static str],
    help: &'static str,
) -> MetricDef {
    MetricDef {
        name,
        kind: MetricKind::Gauge,
        labels,
        help,
        buckets: &[],
    }
}

const fn store_catalogue(n: StoreNames, what: &'static [&'static str; 11]) -> [MetricDef; 11] {
    [
        gauge(n.pending, &[], what[0]),
        gauge(n.pending_capped, &[], what[1]),
        gauge(n.oldest_age, &[], what[2]),
        gauge(n.retrying, &[], what[3]),
        gauge(n.parked, &[], what[4]),
        gauge(n.failed, &[], what[5]),
        gauge(n.at_parking_cap, &[], what[6]),
        gauge(n.segments, &[], what[7]),
        gauge(n.retention_pin, &["pin"], what[8]),
        gauge(n.store_up, &[], what[9]),
        gauge(n.query_duration, &[], what[10]),
    ]
}

const RELAY_STORE: [MetricDef; 11] = store_catalogue(
    RELAY,
    &[
        "Messages not yet published (waiting for a retry included, failed excluded), read at \
         scrape time; counted up to 1,000 per partition (64,000 in all; see \
         outbox_pending_capped).",
        "1 when outbox_pending_messages stopped at the counting cap: the backlog is at least \
         that.",
        "How long the oldest pending message has waited at most, in seconds (0 when nothing \
         is pending). PostgreSQL: time since the partition's reader last caught up, for \
         partitions with anything pending, and the oldest parked message still to deliver.",
        "Messages waiting for a retry after a failed attempt.",
        "Messages set aside from the flow: retrying or failed heads and the messages queued \
         behind them in their key.",
        "Messages that ended failed (redrive them with `outbox redrive`).",
        "Partitions holding the parking cap: they stopped advancing until their parked keys \
         drain.",
        "Storage segments kept (PostgreSQL).",
        "Seconds each kind of thing has held retention back (PostgreSQL): pin=\"position\" \
         the least advanced partition's position, pin=\"transaction\" the oldest running \
         transaction holding a transaction id, pin=\"prepared\" the oldest prepared \
         transaction.",
        "1 when the scrape's store query answered, 0 when it failed or timed out (the store \
         figures then keep their last values).",
        "Seconds the scrape's store query took.",
    ],
);

const INBOX_STORE: [MetricDef; 11] = store_catalogue(
    INBOX,
    &[
        "Inbox messages received and not yet handled (retries included, failed excluded); \
         counted up to 64,000.",
        "1 when outbox_inbox_pending_messages stopped at the counting cap.",
        "How long the oldest inbox message not yet handled has waited at most, in seconds (0 \
         when none): the handlers' lag.",
        "Inbox messages waiting for a retry after their handler failed.",
        "Inbox messages set aside from the flow (retrying or failed heads and the messages \
         behind them in their key).",
        "Inbox messages whose handler gave up (redrive them with `outbox redrive --inbox`).",
        "Processing-queue partitions holding the parking cap.",
        "Storage segments of the processing queue (PostgreSQL).",
        "Seconds each kind of thing has held the processing queue's retention back \
         (PostgreSQL; pin as for outbox_retention_pin_age_seconds).",
        "1 when the scrape's store query answered, 0 when it failed or timed out.",
        "Seconds the scrape's store query took.",
    ],
);

const RELAY_LIVE: [MetricDef; 6] = [
    gauge(
        CIRCUIT_STATE,
        &["sink", "route"],
        "Circuit breaker of each sink: 0 closed, 1 half-open (one probe in flight), 2 open \
         (the broker is considered down; its messages wait without spending attempts).",
    ),
    gauge(
        CIRCUIT_OPEN,
        &["sink", "route"],
        "Seconds the sink's circuit has been open or half-open since it opened (0 while \
         closed).",
    ),
    gauge(
        PARTITIONS_OWNED,
        &["member"],
        "Partitions each worker (relay member) of this process owns.",
    ),
    gauge(
        WORKER_SILENCE,
        &["member"],
        "Seconds since each worker last finished a step of its loop; /livez fails past the \
         live bound.",
    ),
    gauge(
        ROUTE_PENDING,
        &["route"],
        "Pending messages of each route (the relay's routing rules, then `default`), as \
         `outbox status` groups them, counted up to 1,000 per partition; read every 30 s, off \
         the scrape's path.",
    ),
    gauge(
        ROUTE_OLDEST,
        &["route"],
        "Age in seconds of each route's oldest pending message (0 when none); read every \
         30 s, off the scrape's path.",
    ),
];

/// Every metric a relay's [`crate::Target`] sets at scrape time.
pub const RELAY_CATALOGUE: &[MetricDef] = &[
    RELAY_STORE[0],
    RELAY_STORE[1],
    RELAY_STORE[2],
    RELAY_STORE[3],
    RELAY_STORE[4],
    RELAY_STORE[5],
    RELAY_STORE[6],
    RELAY_STORE[7],
    RELAY_STORE[8],
    RELAY_STORE[9],
    RELAY_STORE[10],
    RELAY_LIVE[0],
    RELAY_LIVE[1],
    RELAY_LIVE[2],
    RELAY_LIVE[3],
    RELAY_LIVE[4],
    RELAY_LIVE[5],
];

/// `outbox_cdc_slot_lag_bytes`.
pub(crate) const CDC_LAG_BYTES: &str = "outbox_cdc_slot_lag_bytes";
/// `outbox_cdc_slot_retained_bytes`.
pub(crate) const CDC_RETAINED_BYTES: &str = "outbox_cdc_slot_retained_bytes";
/// `outbox_cdc_slot_lag_seconds`.
pub(crate) const CDC_LAG_SECONDS: &str = "outbox_cdc_slot_lag_seconds";
/// `outbox_cdc_slot_lost`.
pub(crate) const CDC_LOST: &str = "outbox_cdc_slot_lost";
/// `outbox_cdc_wal_unread_bytes`.
pub(crate) const CDC_UNREAD: &str = "outbox_cdc_wal_unread_bytes";

/// The replication slot's figures a CDC relay (`outbox relay --mode cdc`) sets at scrape time,
/// beside [`RELAY_CATALOGUE`].
pub const CDC_CATALOGUE: &[MetricDef] = &[
    gauge(
        CDC_LAG_BYTES,
        &[],
        "CDC mode: WAL written since the slot's confirmed position, in bytes: what the relay \
         still has to read and publish (the cluster's whole WAL counts).",
    ),
    gauge(
        CDC_RETAINED_BYTES,
        &[],
        "CDC mode: WAL the server keeps for the slot, in bytes; bounded by \
         max_slot_wal_keep_size, past which the slot is lost.",
    ),
    gauge(
        CDC_LAG_SECONDS,
        &[],
        "CDC mode: seconds since the oldest transaction the relay holds unconfirmed committed \
         (0 when none).",
    ),
    gauge(
        CDC_LOST,
        &[],
        "CDC mode: 1 when the slot is gone or invalidated (wal_status lost): the relay makes \
         it again, and publishes the emit messages it had not delivered from the WAL.",
    ),
    gauge(
        CDC_UNREAD,
        &[],
        "CDC mode: WAL bytes, since the relay started, whose emit messages could not be read \
         back after a slot was lost (the server had removed it): emit messages committed there \
         are lost. Anything but 0 is an incident.",
    ),
];

/// `outbox_binlog_sequencer_leased`.
pub(crate) const BINLOG_LEASED: &str = "outbox_binlog_sequencer_leased";
/// `outbox_binlog_sequencer_save_age_seconds`.
pub(crate) const BINLOG_SAVE_AGE: &str = "outbox_binlog_sequencer_save_age_seconds";
/// `outbox_binlog_sequencer_lag_bytes`.
pub(crate) const BINLOG_LAG_BYTES: &str = "outbox_binlog_sequencer_lag_bytes";
/// `outbox_binlog_sequencer_purged`.
pub(crate) const BINLOG_PURGED: &str = "outbox_binlog_sequencer_purged";
/// `outbox_binlog_sequencer_lag_seconds`.
pub(crate) const BINLOG_LAG_SECONDS: &str = "outbox_binlog_sequencer_lag_seconds";
/// `outbox_binlog_stuck_partitions`.
pub(crate) const BINLOG_STUCK: &str = "outbox_binlog_stuck_partitions";
/// `outbox_binlog_sequencer_unsealed_seqs`.
pub(crate) const BINLOG_UNSEALED: &str = "outbox_binlog_sequencer_unsealed_seqs";
/// `outbox_binlog_sequencer_rows_from_table`.
pub(crate) const BINLOG_FROM_TABLE: &str = "outbox_binlog_sequencer_rows_from_table";

/// The binlog route's sequencer (MySQL/MariaDB, `outbox migrate --binlog`), set at scrape time
/// beside [`RELAY_CATALOGUE`] by a relay on that route.
pub const BINLOG_CATALOGUE: &[MetricDef] = &[
    gauge(
        BINLOG_LEASED,
        &[],
        "Binlog route: 1 while a relay's sequencer holds the lease; 0 means rows written get no \
         position and are not relayed.",
    ),
    gauge(
        BINLOG_SAVE_AGE,
        &[],
        "Binlog route: seconds since a sequencer last wrote its row (every few seconds while \
         it runs, idle too); growing means stuck or gone.",
    ),
    gauge(
        BINLOG_LAG_BYTES,
        &[],
        "Binlog route: binlog bytes between where the sequencer has read through and the \
         binlog's end (the server's whole binlog counts).",
    ),
    gauge(
        BINLOG_LAG_SECONDS,
        &[],
        "Binlog route: seconds the sequencer's position has not moved while the binlog holds \
         more after it (0 when caught up); a stuck binlog reader.",
    ),
    gauge(
        BINLOG_STUCK,
        &[],
        "Binlog route: partitions waiting at a position whose row is not visible (deleted by \
         hand, or never committed).",
    ),
    gauge(
        BINLOG_PURGED,
        &[],
        "Binlog route: 1 when the file the sequencer read through is purged (it takes what it \
         missed from the table).",
    ),
    gauge(
        BINLOG_UNSEALED,
        &[],
        "Binlog route: seqs drawn above the seal; a transaction left open holds the seal and \
         retention.",
    ),
    gauge(
        BINLOG_FROM_TABLE,
        &[],
        "Binlog route: rows the binlog did not carry (sql_log_bin = 0, statement format), \
         sequenced from the table since the route was turned on.",
    ),
];

/// Every metric an inbox [`crate::Target`] sets at scrape time.
pub const INBOX_CATALOGUE: &[MetricDef] = &[
    INBOX_STORE[0],
    INBOX_STORE[1],
    INBOX_STORE[2],
    INBOX_STORE[3],
    INBOX_STORE[4],
    INBOX_STORE[5],
    INBOX_STORE[6],
    INBOX_STORE[7],
    INBOX_STORE[8],
    INBOX_STORE[9],
    INBOX_STORE[10],
];
