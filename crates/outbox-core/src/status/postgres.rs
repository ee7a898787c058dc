//! The parts of `outbox status` only PostgreSQL gives: each partition's snapshot position, what
//! keeps its txid-ranged segments, and the CDC relays' replication slots. They live in core
//! because the [`Report`](super::Report) holds them and every view (the CLI's text, the
//! console's pages, JSON) reads them without naming a backend crate.

use chrono::{DateTime, Utc};
use serde::Serialize;

/// A CDC replication slot as `outbox status` shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SlotStatus {
    /// The slot's name (`outbox_<schema>_<group>`).
    pub slot: String,
    /// The server process of the relay reading it; `None` while no relay does.
    pub active_pid: Option<i32>,
    /// PostgreSQL's `wal_status`: `reserved`, `extended`, `unreserved` or `lost`.
    pub wal_status: Option<String>,
    /// WAL written since the slot's confirmed position, in bytes.
    pub lag_bytes: Option<i64>,
    /// WAL the server keeps for the slot, in bytes.
    pub retained_bytes: Option<i64>,
    /// How much more WAL may be written before the slot is lost (`max_slot_wal_keep_size`);
    /// `None` when unbounded.
    pub safe_wal_bytes: Option<i64>,
}

/// A PostgreSQL partition's position: every transaction below `done_xmin` is passed, and so is
/// every transaction below `done_xmax` that was not running when the position was taken; the
/// open window's messages up to `cursor` are handled too.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Position {
    /// The oldest transaction the position's `done` snapshot saw running (or its `xmax` when none
    /// was): what the partition holds retention at.
    pub done_xmin: i64,
    /// First transaction id not yet seen when the `done` snapshot was taken.
    pub done_xmax: i64,
    /// Last sequence handled inside the open window (0 when none is open).
    pub cursor: i64,
    /// When the `done` snapshot was taken (how old the position is).
    pub done_at: DateTime<Utc>,
    /// Messages published from this partition, running total.
    pub published: i64,
}

/// What keeps storage (PostgreSQL: txid-ranged segments, dropped whole once every position has
/// passed them and retention has run out).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RetentionStatus {
    /// Segments kept.
    pub segments: i64,
    /// Their size on disk, indexes included.
    pub bytes: i64,
    /// The next transaction id (the `xmax` of a snapshot taken now).
    pub next_xid: i64,
    /// Every position has passed the transactions below this id: segments wholly below it may
    /// be dropped once their retention has run out. `None` before any position exists.
    pub horizon: Option<i64>,
    /// The oldest segment, the first to be dropped.
    pub oldest_segment: Option<Segment>,
    /// Why the oldest segment is still kept.
    pub kept_because: Option<KeptBecause>,
    /// What holds the horizon where it is: a partition whose position lags, or a transaction
    /// that is still running (no position can pass it until it ends).
    pub pinned_by: Option<RetentionPin>,
}

/// One storage segment.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Segment {
    /// Table name.
    pub name: String,
    /// First transaction id it holds.
    pub lo: i64,
    /// First transaction id it does not hold.
    pub hi: i64,
    /// When the transaction ids passed its end (`None`: still written to).
    pub closed_at: Option<DateTime<Utc>>,
    /// Size on disk, indexes included.
    pub bytes: Option<i64>,
}

/// Why the oldest segment is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KeptBecause {
    /// New transactions still write into it: nothing is held back.
    Open,
    /// The horizon has not passed its end: see [`RetentionStatus::pinned_by`].
    Horizon,
    /// Every reader has passed it; it is dropped once the retention period since
    /// `closed_at` has run out (by the relay's maintenance, or `outbox maintain`).
    Retention,
}

/// What holds the retention horizon.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum RetentionPin {
    /// A running transaction (or a prepared one) that holds a transaction id at or below the
    /// horizon: every position taken while it runs stops there. End it (or commit or roll back
    /// the prepared transaction).
    Transaction {
        /// Its transaction id.
        xid: i64,
        /// Server process running it (`None` for a prepared transaction, or when hidden).
        pid: Option<i32>,
        /// Seconds since it began (or since it was prepared).
        age_seconds: Option<f64>,
        /// `pg_stat_activity.state`, e.g. `idle in transaction`.
        state: Option<String>,
        /// Its session's `application_name`.
        application_name: Option<String>,
        /// Its database.
        database: Option<String>,
        /// Its user.
        user: Option<String>,
        /// The global id of a prepared transaction.
        prepared: Option<String>,
    },
    /// The partition whose position is the oldest: it has not advanced since `done_at` (no live
    /// owner, a stalled relay, or a head message that parks the partition at its cap).
    Partition {
        /// Partition number.
        partition: i32,
        /// Its owner, if any.
        owner: Option<String>,
        /// When its position was taken.
        done_at: DateTime<Utc>,
        /// Seconds since then.
        behind_seconds: f64,
    },
}
