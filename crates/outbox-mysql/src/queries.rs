//! The store's fixed SQL, rendered once per database. Statements whose shape follows the claim
//! (one range per partition, one `IN` entry per row) are completed in `store/` with one bound
//! term per partition, key or row.
//!
//! Every time the relay compares (leases, heartbeats, retries) is the server's
//! `UTC_TIMESTAMP(6)`, so relays on several hosts never compare their own clocks.

use crate::schema::Schema;

/// Text columns of `outbox` as sqlx reads them: `utf8mb4_bin` columns come back as binary
/// unless cast. The `{columns}` of the claim's statements.
pub(crate) const MESSAGE_COLUMNS: &str = include_str!("../queries/message_columns.sql");

/// The partitions `?` owns under a live lease, with their positions, the last position
/// handed out there (`n`: every row up to it is committed and visible; `{n}` is
/// [`Positions::last_handed_out`] of `w.part`), and the seq below which every row is passed
/// (`passed_below`, moved up by retention).
const POSITIONS: &str = include_str!("../queries/positions.sql");

/// Each parked key of the partitions in the comma-separated list `?`: how many rows it has
/// parked, whether one failed, and whether its head is due. `{skip}` leaves failed rows out
/// (under `--on-failed skip` they hold nothing back).
const PARKED_KEYS: &str = include_str!("../queries/parked_keys.sql");

/// The rows of the due parked keys (`{keys}`: one `(part = ? AND aggregate_id = ?)` term per
/// key, joined by `OR`), up to `?` per key in position order. `{skip}` leaves failed rows out.
const CLAIM_PARKED: &str = include_str!("../queries/claim_parked.sql");

/// The next rows of each owned partition: `?` the seq below which every row is passed, and
/// `{ranges}` one `(o.part = ? AND o.part_seq BETWEEN ? AND ?)` term per partition, joined by
/// `OR`. `{held}` says whether a row's key has parked messages ([`CLAIM_HELD`], or `0` when no
/// partition of the claim has any).
const CLAIM_WINDOW: &str = include_str!("../queries/claim_window.sql");

/// [`CLAIM_WINDOW`] stopped by the server at a byte bound (the last `?`): `{passed}` is one
/// `WHEN ? THEN ?` (partition, its position) per partition, and `{ranges}` ranges over `i.`
/// (the derived table that counts the bytes) rather than `o.`.
const CLAIM_WINDOW_BYTES: &str = include_str!("../queries/claim_window_bytes.sql");

/// Whether the row `o`'s key has parked messages (`{skip}`: failed ones left out).
const CLAIM_HELD: &str = include_str!("../queries/claim_held.sql");

const STATS: &str = include_str!("../queries/stats.sql");

const MEMBERS: &str = include_str!("../queries/members.sql");

const BLOCKED: &str = include_str!("../queries/blocked.sql");

const FAILED: &str = include_str!("../queries/failed.sql");

/// The failed messages that match a filter (`Store::failed_matching`): how many in all, and
/// one page of them after a seq, oldest first; the first row carries the total even when the
/// page is empty. LOCATE, not LIKE, so `%` and `_` typed by an operator mean themselves.
/// Binds: the key twice (exact, or NULL), part of `aggregate_type/event_type` twice (lower
/// case, or NULL), part of the last error twice (lower case, or NULL), the seq to start after
/// twice (or NULL), the page's size.
const FAILED_MATCHING: &str = include_str!("../queries/failed_matching.sql");

const HEARTBEAT: &str = include_str!("../queries/heartbeat.sql");

const REAP_MEMBERS: &str = include_str!("../queries/reap_members.sql");

const COUNT_MEMBERS: &str = include_str!("../queries/count_members.sql");

/// Every partition row, locked in key order: rebalances run one at a time.
const LOCK_PARTITIONS: &str = include_str!("../queries/lock_partitions.sql");

const RENEW: &str = include_str!("../queries/renew.sql");

const GIVE_BACK: &str = include_str!("../queries/give_back.sql");

/// Takes partitions (already locked by [`LOCK_PARTITIONS`]); a new owner is a new epoch.
const ACQUIRE: &str = include_str!("../queries/acquire.sql");

const RELEASE_PARTITIONS: &str = include_str!("../queries/release.sql");

const RELEASE_MEMBER: &str = include_str!("../queries/release_member.sql");

const REPORT_HEALTH: &str = include_str!("../queries/report_health.sql");

/// Where the polling engine finds the messages' positions: the trigger's, in `outbox` itself
/// (the default), or the binlog sequencer's, in `outbox_sequence` (see `binlog::route`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Positions {
    Trigger,
    Binlog,
}

impl Positions {
    /// The table (or view) to read messages with their `part` and `part_seq` from.
    pub fn messages(self, schema: &Schema) -> String {
        match self {
            Self::Trigger => schema.render("{schema}.outbox"),
            Self::Binlog => schema.render("{schema}.outbox_sequenced"),
        }
    }

    /// The last position handed out in the partition `part` (an SQL expression) whose counter
    /// row is `p` and whose `passed` is `passed`. On the trigger's route the counter itself; on
    /// the binlog route the highest sequenced position, the trigger's last one from before the
    /// switch, or `passed` (retention may have dropped every position it passed), whichever is
    /// highest: one index entry read (`ORDER BY … DESC LIMIT 1`; MariaDB reads a dependent
    /// `MAX` by scanning the partition's whole run of the index, 15 ms per claim at 100,000
    /// rows, against 0.3).
    ///
    /// The claim reads it in its select list, for the partitions it owns only: joined as the
    /// [`Self::counters`] table instead, MariaDB materialises all 64 partitions for each claim
    /// (257 index reads against 193 for a member owning 32; about 0.30 against 0.26 ms of
    /// server time per claim, on 600,000 sequenced rows).
    fn last_handed_out(self, part: &str, passed: &str) -> String {
        match self {
            Self::Trigger => "p.n".to_string(),
            Self::Binlog => format!(
                "GREATEST(p.n, COALESCE((SELECT q.part_seq FROM {{schema}}.outbox_sequence AS q \
                 WHERE q.part = {part} ORDER BY q.part_seq DESC LIMIT 1), 0), {passed})"
            ),
        }
    }

    /// A table of `(part, n)`: every position up to `n` of each partition is handed out and
    /// its row committed ([`Self::last_handed_out`]).
    pub fn counters(self, schema: &Schema) -> String {
        match self {
            Self::Trigger => schema.render("{schema}.outbox_part_seq"),
            Self::Binlog => schema.render(&format!(
                "(SELECT p.part, {} AS n FROM {{schema}}.outbox_part_seq AS p)",
                self.last_handed_out(
                    "p.part",
                    "COALESCE((SELECT r.passed FROM {schema}.outbox_positions AS r \
                     WHERE r.part = p.part), 0)"
                )
            )),
        }
    }
}

/// Every statement with a fixed shape, rendered for one database.
#[derive(Debug)]
pub(crate) struct Queries {
    pub positions: String,
    pub parked_keys_block: String,
    pub parked_keys_skip: String,
    pub claim_parked_block: String,
    pub claim_parked_skip: String,
    pub claim_window: String,
    pub claim_window_bytes: String,
    pub claim_held_block: String,
    pub claim_held_skip: String,
    pub stats: String,
    pub members: String,
    pub blocked: String,
    pub failed: String,
    pub failed_matching: String,
    pub heartbeat: String,
    pub reap_members: String,
    pub count_members: String,
    pub lock_partitions: String,
    pub renew: String,
    pub give_back: String,
    pub acquire: String,
    pub release_partitions: String,
    pub release_member: String,
    pub report_health: String,
}

impl Queries {
    pub fn new(schema: &Schema, positions: Positions) -> Self {
        let r = |sql: &str| {
            schema.render(
                &sql.replace("{counters}", &positions.counters(schema))
                    .replace("{messages}", &positions.messages(schema))
                    .replace("{n}", &positions.last_handed_out("w.part", "w.passed"))
                    .replace("{columns}", MESSAGE_COLUMNS),
            )
        };
        Self {
            positions: r(POSITIONS),
            parked_keys_block: r(&PARKED_KEYS.replace("{skip}", "")),
            parked_keys_skip: r(&PARKED_KEYS.replace("{skip}", "AND state <> 'failed'")),
            claim_parked_block: r(&CLAIM_PARKED.replace("{skip}", "")),
            claim_parked_skip: r(&CLAIM_PARKED.replace("{skip}", "AND state <> 'failed'")),
            claim_window: r(CLAIM_WINDOW),
            claim_window_bytes: r(CLAIM_WINDOW_BYTES),
            claim_held_block: r(&CLAIM_HELD.replace("{skip}", "")),
            claim_held_skip: r(&CLAIM_HELD.replace("{skip}", "AND q.state <> 'failed'")),
            stats: r(STATS),
            members: r(MEMBERS),
            blocked: r(BLOCKED),
            failed: r(FAILED),
            failed_matching: r(FAILED_MATCHING),
            heartbeat: r(HEARTBEAT),
            reap_members: r(REAP_MEMBERS),
            count_members: r(COUNT_MEMBERS),
            lock_partitions: r(LOCK_PARTITIONS),
            renew: r(RENEW),
            give_back: r(GIVE_BACK),
            acquire: r(ACQUIRE),
            release_partitions: r(RELEASE_PARTITIONS),
            release_member: r(RELEASE_MEMBER),
            report_health: r(REPORT_HEALTH),
        }
    }
}
