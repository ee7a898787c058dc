//! The store's fixed SQL, rendered once per database. Statements whose shape follows the claim
//! (one range per partition, one `IN` entry per row) are built in `store.rs` with bound values.
//!
//! Every time the relay compares (leases, heartbeats, retries) is the server's
//! `UTC_TIMESTAMP(6)`, so relays on several hosts never compare their own clocks.

use crate::schema::Schema;

/// Text columns of `outbox` as sqlx reads them: `utf8mb4_bin` columns come back as binary
/// unless cast.
pub(crate) const MESSAGE_COLUMNS: &str = "o.seq, o.part, o.part_seq, CAST(o.id AS CHAR) AS id, \
     CAST(o.aggregate_type AS CHAR) AS aggregate_type, \
     CAST(o.aggregate_id AS CHAR) AS aggregate_id, CAST(o.event_type AS CHAR) AS event_type, \
     CAST(o.payload AS CHAR) AS payload, CAST(o.headers AS CHAR) AS headers, \
     CAST(o.topic AS CHAR) AS topic, o.created_at";

/// The partitions `?` owns under a live lease, with their positions, the last position
/// handed out there (`n`: every row up to it is committed and visible; `{n}` is
/// [`Positions::last_handed_out`] of `w.part`), and the seq below which every row is passed
/// (`passed_below`, moved up by retention).
const POSITIONS: &str = "SELECT w.part, w.passed, w.parked, w.epoch, w.recorded, {n} AS n, \
     s.value AS passed_below \
     FROM {schema}.outbox_positions AS w \
     JOIN {schema}.outbox_part_seq AS p ON p.part = w.part \
     JOIN {schema}.outbox_settings AS s ON s.name = 'passed_below' \
     WHERE w.owner = ? AND w.lease_until > UTC_TIMESTAMP(6)";

/// Each parked key of the partitions in the comma-separated list `?`: how many rows it has
/// parked, whether one failed, and whether its head is due. `{skip}` leaves failed rows out
/// (under `--on-failed skip` they hold nothing back).
const PARKED_KEYS: &str = "SELECT g.part, CAST(g.aggregate_id AS CHAR) AS aggregate_id, g.n, \
     CAST(g.failed AS SIGNED) AS failed, \
     CAST(h.next_attempt_at IS NULL OR h.next_attempt_at <= UTC_TIMESTAMP(6) AS SIGNED) AS due, \
     h.next_attempt_at \
     FROM (SELECT part, aggregate_id, COUNT(*) AS n, MIN(part_seq) AS head, \
                  SUM(state = 'failed') AS failed \
           FROM {schema}.outbox_parked WHERE FIND_IN_SET(part, ?) {skip} \
           GROUP BY part, aggregate_id) AS g \
     JOIN {schema}.outbox_parked AS h \
       ON h.part = g.part AND h.aggregate_id = g.aggregate_id AND h.part_seq = g.head";

const STATS: &str = "SELECT \
     (SELECT CAST(COALESCE(SUM(c.n - w.passed), 0) AS SIGNED) \
        FROM {schema}.outbox_positions AS w \
        JOIN {counters} AS c ON c.part = w.part) AS unpassed, \
     (SELECT CAST(COALESCE(SUM(passed), 0) AS SIGNED) FROM {schema}.outbox_positions) AS passed, \
     (SELECT COUNT(*) FROM {schema}.outbox_parked) AS parked, \
     (SELECT COUNT(*) FROM {schema}.outbox_parked WHERE state = 'failed') AS failed, \
     (SELECT COUNT(*) FROM {schema}.outbox_parked WHERE state = 'retrying') AS retrying, \
     (SELECT COUNT(*) FROM (SELECT DISTINCT part, aggregate_id FROM {schema}.outbox_parked \
        WHERE state IN ('retrying', 'failed')) AS k) AS blocked_keys, \
     (SELECT COUNT(*) FROM {schema}.outbox_positions WHERE parked >= ?) AS at_cap, \
     (SELECT TIMESTAMPDIFF(MICROSECOND, MIN(t), UTC_TIMESTAMP(6)) FROM ( \
        SELECT o.created_at AS t FROM {schema}.outbox_positions AS w \
          JOIN {messages} AS o ON o.part = w.part AND o.part_seq = w.passed + 1 \
        UNION ALL \
        SELECT o.created_at FROM {schema}.outbox_parked AS p \
          JOIN {schema}.outbox AS o ON o.seq = p.seq WHERE p.state <> 'failed') AS a) AS oldest_us, \
     (SELECT TIMESTAMPDIFF(MICROSECOND, MIN(o.created_at), UTC_TIMESTAMP(6)) \
        FROM {schema}.outbox_parked AS p JOIN {schema}.outbox AS o ON o.seq = p.seq \
        WHERE p.state <> 'failed') AS oldest_waiting_us";

const MEMBERS: &str = "SELECT CAST(m.member AS CHAR) AS member, m.heartbeat_at, \
     CAST(m.circuit AS CHAR) AS circuit, CAST(m.sink_error AS CHAR) AS sink_error, \
     COUNT(w.part) AS partitions \
     FROM {schema}.outbox_members AS m \
     LEFT JOIN {schema}.outbox_positions AS w \
       ON w.owner = m.member AND w.lease_until > UTC_TIMESTAMP(6) \
     GROUP BY m.member, m.heartbeat_at, m.circuit, m.sink_error \
     ORDER BY m.member";

const BLOCKED: &str = "SELECT CAST(aggregate_id AS CHAR) AS aggregate_id, \
     CAST(state AS CHAR) AS state, attempts, CAST(last_error AS CHAR) AS last_error \
     FROM {schema}.outbox_parked WHERE state IN ('retrying', 'failed') ORDER BY seq LIMIT 20";

const FAILED: &str = "SELECT o.seq, CAST(o.id AS CHAR) AS id, \
     CAST(o.aggregate_type AS CHAR) AS aggregate_type, \
     CAST(o.aggregate_id AS CHAR) AS aggregate_id, CAST(o.event_type AS CHAR) AS event_type, \
     p.attempts, CAST(p.last_error AS CHAR) AS last_error, o.created_at \
     FROM {schema}.outbox_parked AS p JOIN {schema}.outbox AS o ON o.seq = p.seq \
     WHERE p.state = 'failed' ORDER BY p.seq LIMIT ?";

/// The failed messages that match a filter (`Store::failed_matching`): how many in all, and
/// one page of them after a seq, oldest first; the first row carries the total even when the
/// page is empty. LOCATE, not LIKE, so `%` and `_` typed by an operator mean themselves.
/// Binds: the key twice (exact, or NULL), part of `aggregate_type/event_type` twice (lower
/// case, or NULL), part of the last error twice (lower case, or NULL), the seq to start after
/// twice (or NULL), the page's size.
const FAILED_MATCHING: &str = "WITH matching AS ( \
     SELECT p.seq, o.id, o.aggregate_type, o.aggregate_id, o.event_type, p.attempts, \
            p.last_error, o.created_at \
     FROM {schema}.outbox_parked AS p JOIN {schema}.outbox AS o ON o.seq = p.seq \
     WHERE p.state = 'failed' \
       AND (? IS NULL OR p.aggregate_id = ?) \
       AND (? IS NULL OR LOCATE(?, LOWER(CONCAT(o.aggregate_type, '/', o.event_type))) > 0) \
       AND (? IS NULL OR LOCATE(?, LOWER(COALESCE(p.last_error, ''))) > 0)), \
   page AS (SELECT * FROM matching WHERE ? IS NULL OR seq > ? ORDER BY seq LIMIT ?) \
   SELECT t.total, m.seq, CAST(m.id AS CHAR) AS id, \
          CAST(m.aggregate_type AS CHAR) AS aggregate_type, \
          CAST(m.aggregate_id AS CHAR) AS aggregate_id, \
          CAST(m.event_type AS CHAR) AS event_type, m.attempts, \
          CAST(m.last_error AS CHAR) AS last_error, m.created_at \
   FROM (SELECT COUNT(*) AS total FROM matching) AS t LEFT JOIN page AS m ON TRUE \
   ORDER BY m.seq";

const HEARTBEAT: &str = "INSERT INTO {schema}.outbox_members (member, heartbeat_at) \
     VALUES (?, UTC_TIMESTAMP(6)) \
     ON DUPLICATE KEY UPDATE heartbeat_at = VALUES(heartbeat_at)";

const REAP_MEMBERS: &str = "DELETE FROM {schema}.outbox_members \
     WHERE heartbeat_at < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND";

const COUNT_MEMBERS: &str = "SELECT COUNT(*) FROM {schema}.outbox_members";

/// Every partition row, locked in key order: rebalances run one at a time.
const LOCK_PARTITIONS: &str = "SELECT part, CAST(owner AS CHAR) AS owner, \
     CAST(lease_until > UTC_TIMESTAMP(6) AS SIGNED) AS live \
     FROM {schema}.outbox_positions ORDER BY part FOR UPDATE";

const RENEW: &str = "UPDATE {schema}.outbox_positions \
     SET lease_until = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND WHERE owner = ?";

const GIVE_BACK: &str = "UPDATE {schema}.outbox_positions \
     SET owner = NULL, lease_until = '1970-01-01 00:00:00' \
     WHERE owner = ? AND FIND_IN_SET(part, ?)";

/// Takes partitions (already locked by [`LOCK_PARTITIONS`]); a new owner is a new epoch.
const ACQUIRE: &str = "UPDATE {schema}.outbox_positions \
     SET owner = ?, lease_until = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, epoch = epoch + 1 \
     WHERE FIND_IN_SET(part, ?)";

const RELEASE_PARTITIONS: &str = "UPDATE {schema}.outbox_positions \
     SET owner = NULL, lease_until = '1970-01-01 00:00:00' WHERE owner = ?";

const RELEASE_MEMBER: &str = "DELETE FROM {schema}.outbox_members WHERE member = ?";

const REPORT_HEALTH: &str =
    "UPDATE {schema}.outbox_members SET circuit = ?, sink_error = ? WHERE member = ?";

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
                    .replace("{n}", &positions.last_handed_out("w.part", "w.passed")),
            )
        };
        Self {
            positions: r(POSITIONS),
            parked_keys_block: r(&PARKED_KEYS.replace("{skip}", "")),
            parked_keys_skip: r(&PARKED_KEYS.replace("{skip}", "AND state <> 'failed'")),
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
