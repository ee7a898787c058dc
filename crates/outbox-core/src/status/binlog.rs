//! The part of `outbox status` only the MySQL/MariaDB binlog route gives: its sequencer. It lives
//! in core because the [`Report`](super::Report) holds it and every view reads it without naming
//! a backend crate.

use chrono::{DateTime, Utc};
use serde::Serialize;

/// The binlog route's sequencer (MySQL/MariaDB) as `outbox status` shows it: who holds its
/// lease, how far it has read the binlog, and how far the seal is.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SequencerStatus {
    /// The relay's sequencer holding the lease; `None` when none holds an unexpired one (no
    /// relay runs on this outbox, or its sequencer is stuck): nothing written is relayed then.
    pub owner: Option<String>,
    /// Fencing token: bumped at every new holder.
    pub epoch: i64,
    /// When the lease ends; renewed every few seconds while a sequencer runs.
    pub lease_until: Option<DateTime<Utc>>,
    /// When a sequencer last wrote its row (lease renewed, position saved).
    pub saved_at: Option<DateTime<Utc>>,
    /// The binlog position (`file:offset`) every outbox row committed before has its position
    /// through; `None` before the route's first start.
    pub through: Option<String>,
    /// Where the server's binlog ends now.
    pub binlog_end: Option<String>,
    /// Binlog bytes from `through` to the end: what the sequencer still has to read (the
    /// server's whole binlog, other databases included). `None` when `through` names a file
    /// the server no longer holds (it then takes what it missed from the table).
    pub lag_bytes: Option<i64>,
    /// The seal: every row with a lower `seq` is sequenced or was rolled back. Retention drops
    /// only ranges below it.
    pub sequenced_below: i64,
    /// The next `seq` the outbox gives: what lies between the seal and it waits for the next
    /// seal (a transaction that stays open holds it).
    pub next_seq: i64,
    /// Rows the binlog did not carry (written with `sql_log_bin = 0`, or logged as statements),
    /// sequenced from the table since the route was turned on.
    pub rows_from_table: i64,
    /// How long the sequencer's position has not moved while the binlog holds more after it,
    /// in seconds (0 when it has read everything): a reader stuck on a dead connection shows
    /// here, while its lease renewals keep `saved_at` fresh.
    pub lag_seconds: f64,
    /// Partitions whose next position names a row the relay cannot see (deleted by hand, or
    /// never committed): the relay waits there, and the partition's later messages with it.
    /// A moment's wait is normal (a row becomes visible just after its binlog event); one that
    /// lasts is not.
    pub stuck_partitions: i64,
}
