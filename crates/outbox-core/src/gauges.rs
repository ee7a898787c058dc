//! [`Gauges`]: the store figures a metrics scrape exports (`outbox_pending_messages`,
//! `outbox_oldest_pending_age_seconds`, …), read by [`crate::Store::gauges`] in one cheap
//! statement so that a scrape every few seconds costs the database next to nothing, however
//! large the backlog.

use serde::Serialize;

/// What a metrics scrape reads from a store. Every figure is of the whole outbox (all
/// partitions, all routes): a store cannot tell a row's route, which the relay's routing rules
/// decide (`outbox status` breaks the backlog down by route).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Gauges {
    /// Messages not yet published, waiting for a retry included, failed ones excluded; counted
    /// up to the store's cap (see `pending_capped`).
    pub pending: i64,
    /// Whether `pending` stopped at the store's counting cap: the backlog is at least that.
    pub pending_capped: bool,
    /// How long the oldest pending message has waited at most, in seconds; `None` when nothing
    /// is pending. See each store for exactly what it measures (PostgreSQL: the time since the
    /// partition's reader last caught up, for partitions with anything pending, and the age of
    /// the oldest parked message still to deliver).
    pub oldest_pending_age_seconds: Option<f64>,
    /// Messages waiting for a retry after a failed attempt.
    pub retrying: i64,
    /// Messages published since the outbox was created, a running total that never falls
    /// (PostgreSQL keeps it in its positions); `None` where the store keeps none (SQLite
    /// deletes published rows by age).
    pub published: Option<i64>,
    /// Messages set aside from the main flow: retrying or failed heads and the messages queued
    /// behind them in their key.
    pub parked: i64,
    /// Messages that ended `failed` (redrivable).
    pub failed: i64,
    /// Partitions that hold the parking cap and stopped advancing.
    pub partitions_at_parking_cap: i64,
    /// Storage segments kept (PostgreSQL); `None` for stores without segments.
    pub segments: Option<i64>,
    /// What holds retention back, each with its age; empty for stores without a retention
    /// horizon (SQLite deletes published rows by age, nothing can pin it).
    pub retention_pins: Vec<PinAge>,
    /// The replication slot of a CDC relay (PostgreSQL `relay --mode cdc`); `None` otherwise.
    pub cdc_slot: Option<SlotGauges>,
    /// The binlog route's sequencer (MySQL/MariaDB `outbox migrate --binlog`); `None`
    /// otherwise.
    pub binlog_sequencer: Option<SequencerGauges>,
}

/// The binlog route's sequencer as a metrics scrape sees it (see
/// [`crate::status::SequencerStatus`] for the fuller view).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct SequencerGauges {
    /// A sequencer holds an unexpired lease. Without one, rows written get no position and are
    /// not relayed.
    pub leased: bool,
    /// Seconds since a sequencer last wrote its row (it does every few seconds while it runs,
    /// even idle): a figure that keeps growing is a sequencer stuck or gone.
    pub save_age_seconds: f64,
    /// Binlog bytes from where it has read through to the binlog's end; `None` when its file
    /// was purged.
    pub lag_bytes: Option<i64>,
    /// `seq`s drawn above the seal (`sequenced_below`): a transaction left open holds the
    /// seal, and with it retention.
    pub unsealed_seqs: i64,
    /// Rows the binlog did not carry, sequenced from the table since the route was turned on.
    pub rows_from_table: i64,
    /// Seconds the sequencer's position has not moved while the binlog holds more after it
    /// (0 when caught up): a stuck binlog reader.
    pub lag_seconds: f64,
    /// Partitions waiting at a position whose row the relay cannot see.
    pub stuck_partitions: i64,
}

/// A CDC relay's replication slot as the server and the relay see it.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct SlotGauges {
    /// WAL written since the slot's confirmed position, in bytes: what the relay still has to
    /// read and handle (the whole cluster's WAL, other databases included).
    pub lag_bytes: i64,
    /// WAL the server keeps for the slot, in bytes (from its restart position).
    pub retained_bytes: i64,
    /// How long the oldest transaction the relay holds unconfirmed has been committed, in
    /// seconds (0 when it holds none).
    pub lag_seconds: f64,
    /// The slot is gone, or PostgreSQL invalidated it (`wal_status = 'lost'`): the relay cannot
    /// go on from it (it makes it again).
    pub lost: bool,
    /// WAL bytes, since the relay started, whose `emit` messages could not be read back after a
    /// slot was lost (the server had removed that WAL): any such message committed there is
    /// gone. 0 is the only healthy value.
    pub unread_wal_bytes: i64,
}

/// One kind of thing that can hold retention back, and how long it has.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PinAge {
    /// `position` (the least advanced partition's position: a stuck partition or relay),
    /// `transaction` (the oldest running transaction that holds a transaction id), or
    /// `prepared` (the oldest prepared transaction).
    pub pin: &'static str,
    /// Seconds it has held retention (0 when there is none of that kind).
    pub age_seconds: f64,
}

impl Gauges {
    /// The figures [`crate::Stats`] already holds, for stores without a cheaper statement of
    /// their own (the default of [`crate::Store::gauges`]).
    pub fn from_stats(s: &crate::Stats) -> Self {
        Self {
            pending: s.pending,
            pending_capped: false,
            oldest_pending_age_seconds: s.oldest_pending_age_seconds,
            retrying: s.retrying,
            published: None,
            parked: s.parked,
            failed: s.failed,
            partitions_at_parking_cap: s.partitions_at_parking_cap,
            segments: None,
            retention_pins: Vec::new(),
            cdc_slot: None,
            binlog_sequencer: None,
        }
    }
}
