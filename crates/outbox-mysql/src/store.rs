//! The store's work ([`Engine`], held by the relay as [`crate::MysqlStore`]): the relay's view of a
//! MySQL/MariaDB outbox (partition leases, claims by
//! position, fenced compare-and-set records, parking, failed and redrive).
//!
//! A claim reads each owned partition as the index range `passed + 1 ..= passed + k` of
//! `(part, part_seq)`: positions are gapless and drawn in commit order (docs/engine-mysql.md),
//! so the range holds exactly the next `k` messages, all committed, and nothing can appear
//! below it later. Relay sessions run `READ COMMITTED`; the only locking reads are the
//! partition rows, by primary key.

use std::collections::{BTreeMap, HashMap};
use std::str::FromStr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use chrono::{DateTime, NaiveDateTime, Utc};
use outbox_core::store::MemberStatus;
use outbox_core::{
    BlockedKey, ClaimLimits, Error, FailedFilter, FailedMessage, FailedPage, Maintenance, MemberId,
    Message, NewMessage, OnFailed, Outcome, RedriveScope, Result, Stats, Store,
};
use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions, MySqlRow};
use sqlx::{Executor, MySql, MySqlPool, QueryBuilder, Row};
use tokio::sync::watch;

use crate::error::map_sqlx_error;
use crate::queries::{Positions, Queries, MESSAGE_COLUMNS};
use crate::schema::Schema;
use crate::ticket::{assemble, Fence, ParkedKey, PartPlan, Ticket, WindowRead};

/// Parked messages a partition may hold before it stops advancing (its other keys wait too)
/// until they drain: a bound on the parked table, whatever a broker outage lasts.
pub const PARKED_CAP: i64 = 10_000;

/// How long a relay statement waits for a row lock (`innodb_lock_wait_timeout`) before failing
/// as a timeout the relay retries: well inside the relay's store deadline.
const LOCK_WAIT_SECS: u32 = 5;

/// How often parked messages are looked at while nothing says a head came due (a redrive or a
/// hand-made change in another process is noticed within this).
/// How long an insert on the binlog route waits for its rows to be sequenced.
const INSERT_SEQUENCED: Duration = Duration::from_secs(30);

const PARKED_RECHECK: Duration = Duration::from_secs(1);

/// Connection options for a `mysql://` or `mariadb://` URL.
pub fn connect_options(url: &str) -> Result<MySqlConnectOptions> {
    let shown = outbox_core::redact::url(url);
    let rest = url
        .split_once("://")
        .filter(|(scheme, _)| {
            scheme.eq_ignore_ascii_case("mysql") || scheme.eq_ignore_ascii_case("mariadb")
        })
        .map(|(_, rest)| rest)
        .ok_or_else(|| {
            Error::config(format!(
                "database URL `{shown}` is not a MySQL URL; use mysql://user:password@host:3306/database"
            ))
        })?;
    MySqlConnectOptions::from_str(&format!("mysql://{rest}"))
        .map_err(|e| map_sqlx_error(&format!("database URL `{shown}`"), e))
}

/// The database a URL names (its path), if any.
pub fn url_database(url: &str) -> Result<Option<String>> {
    Ok(connect_options(url)?.get_database().map(str::to_string))
}

/// Opens a pool of at most `max_connections` relay sessions to `url`: `READ COMMITTED`, and
/// row-lock waits cut at a few seconds. Fails at once if the server cannot be reached.
pub async fn connect_pool(url: &str, max_connections: u32) -> Result<MySqlPool> {
    let options = connect_options(url)?;
    let shown = outbox_core::redact::url(url);
    MySqlPoolOptions::new()
        .max_connections(max_connections.max(1))
        .acquire_timeout(Duration::from_secs(10))
        .after_connect(|conn, _| {
            Box::pin(async move {
                conn.execute(include_str!("../queries/read_committed.sql"))
                    .await?;
                conn.execute(
                    include_str!("../queries/lock_wait.sql")
                        .replace("{secs}", &LOCK_WAIT_SECS.to_string())
                        .as_str(),
                )
                .await?;
                Ok(())
            })
        })
        .connect_with(options)
        .await
        .map_err(|e| map_sqlx_error(&format!("connecting to MySQL at {shown}"), e))
}

/// What the store keeps per member between calls.
#[derive(Debug, Default)]
struct MemberState {
    /// The last claim's ticket, until its batch is recorded; with a number, so a record that
    /// finishes after a newer claim does not drop that claim's ticket.
    ticket: Option<(u64, Ticket)>,
    claims: u64,
    /// When parked messages were last read, under which `--on-failed` (what is due depends
    /// on it), and the earliest next attempt seen then.
    parked_read_at: Option<(Instant, OnFailed)>,
    parked_next_due: Option<DateTime<Utc>>,
    /// This member parked or released something since it last read them.
    parked_changed: bool,
    /// The `failed` outcomes of the rows the last claim could not read as stored (withheld
    /// from the relay), recorded with its batch.
    failed_in_claim: Vec<Outcome>,
}

impl MemberState {
    fn should_read_parked(&self, now: DateTime<Utc>, on_failed: OnFailed) -> bool {
        self.parked_changed
            || self
                .parked_read_at
                .is_none_or(|(t, mode)| mode != on_failed || t.elapsed() >= PARKED_RECHECK)
            || self.parked_next_due.is_some_and(|due| due <= now)
    }
}

/// An owned partition as a claim reads it.
#[derive(Debug, Clone, Copy)]
struct Position {
    part: i16,
    passed: i64,
    parked: i64,
    fence: Fence,
    /// The last position handed out in the partition.
    last: i64,
    /// Every row below this seq is passed: the claim reads no range below it.
    passed_below: i64,
}

/// The store's work on MySQL 8.0.29+ / MariaDB 10.6+; the relay holds it as
/// [`MysqlStore`](crate::MysqlStore), which runs each call on a task of its own.
pub(crate) struct Engine {
    pool: MySqlPool,
    schema: Schema,
    q: Queries,
    /// `outbox`, or on the binlog route the view of sequenced messages.
    messages: String,
    /// On the binlog route: the sequencer this store runs while it relays.
    sequencer: Option<crate::binlog::sequencer::Sequencer>,
    members: Mutex<HashMap<MemberId, MemberState>>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MysqlStore")
            .field("schema", &self.schema)
            .finish_non_exhaustive()
    }
}

fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

fn utc(t: NaiveDateTime) -> DateTime<Utc> {
    t.and_utc()
}

fn csv(parts: impl IntoIterator<Item = i16>) -> String {
    parts
        .into_iter()
        .map(|p| p.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// A message from a row selected with [`MESSAGE_COLUMNS`]; `attempts` from the caller, with
/// its partition and position, and why it cannot be published as stored (`None` when it can).
///
/// A column that does not hold what the SQL contract says (an `id` that is not a UUID, a zero
/// or partly zero `created_at`, text that cannot be read) does not fail the read, which would
/// stop every partition of the claim, again at every retry: the message comes back with a
/// stand-in value (the nil UUID, the epoch, empty text) and the reason, naming the column, and
/// the claim fails that row alone ([`Engine::claim`]). Only the position columns, which the
/// store itself writes, fail the read.
fn message_from_row(r: &MySqlRow, attempts: i32) -> Result<(Message, i16, i64, Option<String>)> {
    let get = |e| map_sqlx_error("reading claimed messages", e);
    let seq: i64 = r.try_get("seq").map_err(get)?;
    let part: i16 = r.try_get("part").map_err(get)?;
    let part_seq: i64 = r.try_get("part_seq").map_err(get)?;
    let mut problems: Vec<String> = Vec::new();
    let (id, why) = row_id(r);
    problems.extend(why);
    let (created_at, why) = row_time(r);
    problems.extend(why);
    let mut text = |column: &str| -> String {
        r.try_get::<String, _>(column).unwrap_or_else(|e| {
            problems.push(format!("the column `{column}` cannot be read as text: {e}"));
            String::new()
        })
    };
    let payload = text("payload");
    let aggregate_type = text("aggregate_type");
    let aggregate_id = text("aggregate_id");
    let event_type = text("event_type");
    let headers = text("headers");
    let topic = r.try_get::<Option<String>, _>("topic").unwrap_or_else(|e| {
        problems.push(format!("the column `topic` cannot be read as text: {e}"));
        None
    });
    let message = Message {
        seq,
        id,
        aggregate_type,
        aggregate_id,
        event_type,
        payload: payload.into(),
        headers,
        topic,
        created_at,
        attempts,
    };
    let why = (!problems.is_empty()).then(|| {
        format!(
            "outbox row {seq} cannot be published as stored: {}",
            problems.join("; ")
        )
    });
    Ok((message, part, part_seq, why))
}

/// The row's `id` as a UUID, or the nil UUID and why (naming the column).
fn row_id(r: &MySqlRow) -> (uuid::Uuid, Option<String>) {
    match r.try_get::<String, _>("id") {
        Ok(id) => match uuid::Uuid::parse_str(&id) {
            Ok(id) => (id, None),
            Err(e) => (
                uuid::Uuid::nil(),
                Some(format!(
                    "the column `id` holds `{}`, which is not a UUID (8-4-4-4-12 hexadecimal \
                     text): {e}",
                    id.chars().take(64).collect::<String>()
                )),
            ),
        },
        Err(e) => (
            uuid::Uuid::nil(),
            Some(format!("the column `id` cannot be read as text: {e}")),
        ),
    }
}

/// The row's `created_at`, or the epoch and why (naming the column): MariaDB's default
/// `sql_mode` stores zero and partly zero dates, which are no time at all.
fn row_time(r: &MySqlRow) -> (DateTime<Utc>, Option<String>) {
    match r.try_get::<NaiveDateTime, _>("created_at") {
        Ok(t) => (utc(t), None),
        Err(e) => (
            DateTime::<Utc>::UNIX_EPOCH,
            Some(format!(
                "the column `created_at` is not a valid time (a zero date?): {e}"
            )),
        ),
    }
}

/// Splits a claim's messages: those the relay gets, and a `failed` outcome for each row that
/// cannot be published as stored (`malformed`: `seq`, why). The later messages of such a row's
/// key in the batch are withheld too (no outcome: they wait behind it, or come again in the
/// next claim), so a key never overtakes its failed message.
fn withhold(messages: Vec<Message>, malformed: &[(i64, String)]) -> (Vec<Message>, Vec<Outcome>) {
    if malformed.is_empty() {
        return (messages, Vec::new());
    }
    let bad: HashMap<i64, &str> = malformed.iter().map(|(s, w)| (*s, w.as_str())).collect();
    let mut stopped: std::collections::HashSet<String> = std::collections::HashSet::new();
    let mut failed = Vec::new();
    let mut out = Vec::with_capacity(messages.len());
    for m in messages {
        if let Some(why) = bad.get(&m.seq) {
            tracing::warn!(seq = m.seq, error = %why, "an outbox row cannot be published as stored: it goes `failed` alone, other keys flow");
            failed.push(Outcome::Failed {
                seq: m.seq,
                error: (*why).to_string(),
            });
            stopped.insert(m.aggregate_id.clone());
        } else if !stopped.contains(&m.aggregate_id) {
            out.push(m);
        }
    }
    (out, failed)
}

/// Shares `budget` rows among partitions with `available` rows each, evenly, giving what a
/// partition cannot use to the others.
fn share(available: &[i64], budget: i64) -> Vec<i64> {
    let mut take = vec![0i64; available.len()];
    let mut left = budget.max(0);
    let mut open: Vec<usize> = (0..available.len()).filter(|&i| available[i] > 0).collect();
    while left > 0 && !open.is_empty() {
        let each = (left / open.len() as i64).max(1);
        let mut still = Vec::new();
        for &i in &open {
            if left == 0 {
                break;
            }
            let give = each.min(available[i] - take[i]).min(left);
            take[i] += give;
            left -= give;
            if take[i] < available[i] {
                still.push(i);
            }
        }
        open = still;
    }
    take
}

impl Engine {
    /// A store over `pool` (see [`connect_pool`]) for the outbox in database `schema`.
    pub fn new(pool: MySqlPool, schema: Schema) -> Self {
        Self {
            q: Queries::new(&schema, Positions::Trigger),
            messages: Positions::Trigger.messages(&schema),
            sequencer: None,
            pool,
            schema,
            members: Mutex::new(HashMap::new()),
        }
    }

    /// The store on the binlog route (`outbox migrate --binlog`): messages are read with the
    /// positions the sequencer gives them, and the store runs the sequencer, reading the
    /// binlog through `url`, while it relays (from its first rebalance, claim or insert; one
    /// sequencer per outbox holds the lease at a time). See docs/engine-mysql.md.
    pub fn binlog(pool: MySqlPool, schema: Schema, url: &str) -> Result<Self> {
        let sequencer =
            crate::binlog::sequencer::Sequencer::new(pool.clone(), schema.clone(), url)?;
        Ok(Self {
            q: Queries::new(&schema, Positions::Binlog),
            messages: Positions::Binlog.messages(&schema),
            sequencer: Some(sequencer),
            pool,
            schema,
            members: Mutex::new(HashMap::new()),
        })
    }

    /// On the binlog route, the sequencer (`None` on the trigger's).
    pub fn sequencer(&self) -> Option<&crate::binlog::sequencer::Sequencer> {
        self.sequencer.as_ref()
    }

    /// The pool.
    pub fn pool(&self) -> &MySqlPool {
        &self.pool
    }

    /// The database that holds the outbox.
    pub fn schema(&self) -> &Schema {
        &self.schema
    }

    fn state<T>(&self, member: &MemberId, f: impl FnOnce(&mut MemberState) -> T) -> T {
        let mut members = self
            .members
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f(members.entry(member.clone()).or_default())
    }

    async fn positions(&self, member: &MemberId, partitions: &[i32]) -> Result<Vec<Position>> {
        let rows = sqlx::query(&self.q.positions)
            .bind(member.as_str())
            .fetch_all(&self.pool)
            .await
            .map_err(|e| map_sqlx_error("reading the partitions' positions", e))?;
        let get = |e| map_sqlx_error("reading the partitions' positions", e);
        let mut out = Vec::with_capacity(rows.len());
        for r in rows {
            let part: i16 = r.try_get("part").map_err(get)?;
            if !partitions.contains(&i32::from(part)) {
                continue;
            }
            out.push(Position {
                part,
                passed: r.try_get("passed").map_err(get)?,
                parked: r.try_get("parked").map_err(get)?,
                fence: Fence {
                    epoch: r.try_get("epoch").map_err(get)?,
                    recorded: r.try_get("recorded").map_err(get)?,
                },
                last: r.try_get("n").map_err(get)?,
                passed_below: r.try_get("passed_below").map_err(get)?,
            });
        }
        Ok(out)
    }

    /// The parked keys of `parts` that may go out now, with up to `per_key` of their rows each,
    /// and the earliest next attempt among the heads not due yet.
    async fn read_parked(
        &self,
        parts: &[i16],
        on_failed: OnFailed,
        per_key: i64,
        malformed: &mut Vec<(i64, String)>,
    ) -> Result<(Vec<ParkedKey>, Option<DateTime<Utc>>)> {
        let err = |e| map_sqlx_error("reading parked messages", e);
        let sql = match on_failed {
            OnFailed::Block => &self.q.parked_keys_block,
            OnFailed::Skip => &self.q.parked_keys_skip,
        };
        let keys = sqlx::query(sql)
            .bind(csv(parts.iter().copied()))
            .fetch_all(&self.pool)
            .await
            .map_err(err)?;
        let mut due: Vec<(i16, String, i64)> = Vec::new();
        let mut next_due: Option<DateTime<Utc>> = None;
        for r in keys {
            let part: i16 = r.try_get("part").map_err(err)?;
            let key: String = r.try_get("aggregate_id").map_err(err)?;
            let n: i64 = r.try_get("n").map_err(err)?;
            let failed: i64 = r.try_get("failed").map_err(err)?;
            let is_due: i64 = r.try_get("due").map_err(err)?;
            let at: Option<NaiveDateTime> = r.try_get("next_attempt_at").map_err(err)?;
            if failed > 0 && on_failed == OnFailed::Block {
                continue;
            }
            if is_due != 0 {
                due.push((part, key, n));
            } else if let Some(at) = at.map(utc) {
                next_due = Some(next_due.map_or(at, |d| d.min(at)));
            }
        }
        if due.is_empty() {
            return Ok((Vec::new(), next_due));
        }
        let mut select = QueryBuilder::<MySql>::new(format!(
            "SELECT {MESSAGE_COLUMNS}, x.attempts FROM (SELECT seq, part, aggregate_id, part_seq, \
             attempts, ROW_NUMBER() OVER (PARTITION BY part, aggregate_id ORDER BY part_seq) AS rn \
             FROM {}.outbox_parked WHERE (",
            self.schema.as_str()
        ));
        let mut each = select.separated(" OR ");
        for (part, key, _) in &due {
            each.push("(part = ")
                .push_bind_unseparated(*part)
                .push_unseparated(" AND aggregate_id = ")
                .push_bind_unseparated(key.as_str())
                .push_unseparated(")");
        }
        select.push(")");
        if on_failed == OnFailed::Skip {
            select.push(" AND state <> 'failed'");
        }
        select.push(format!(
            ") AS x JOIN {} AS o ON o.seq = x.seq WHERE x.rn <= ",
            self.messages
        ));
        select.push_bind(per_key);
        select.push(" ORDER BY x.part, x.aggregate_id, x.part_seq");
        let rows = select.build().fetch_all(&self.pool).await.map_err(err)?;
        let mut by_key: BTreeMap<(i16, String), Vec<(Message, i64)>> = BTreeMap::new();
        for r in &rows {
            let attempts: i32 = r.try_get("attempts").map_err(err)?;
            let (m, part, part_seq, why) = message_from_row(r, attempts)?;
            if let Some(why) = why {
                malformed.push((m.seq, why));
            }
            by_key
                .entry((part, m.aggregate_id.clone()))
                .or_default()
                .push((m, part_seq));
        }
        let counts: HashMap<(i16, String), i64> =
            due.into_iter().map(|(p, k, n)| ((p, k), n)).collect();
        let keys = by_key
            .into_iter()
            .map(|((part, key), rows)| {
                let complete = counts
                    .get(&(part, key.clone()))
                    .is_some_and(|&n| n <= rows.len() as i64);
                ParkedKey {
                    part,
                    key,
                    rows,
                    complete,
                }
            })
            .collect();
        Ok((keys, next_due))
    }

    /// The next rows of each partition in `take` (`(position, rows)`), each flagged with
    /// whether its key has parked messages. Keeps, per partition, only the run that continues
    /// the position without a gap (there is none unless the trigger was bypassed).
    async fn read_windows(
        &self,
        take: &[(Position, i64)],
        probe_parked: bool,
        on_failed: OnFailed,
        bytes: Option<usize>,
        malformed: &mut Vec<(i64, String)>,
    ) -> Result<Vec<WindowRead>> {
        let err = |e| map_sqlx_error("reading the partitions' next messages", e);
        let m = self.messages.as_str();
        let held = if probe_parked {
            format!(
                "CAST(EXISTS (SELECT 1 FROM {}.outbox_parked AS q WHERE q.part = o.part \
                 AND q.aggregate_id = o.aggregate_id{}) AS SIGNED)",
                self.schema.as_str(),
                if on_failed == OnFailed::Skip {
                    " AND q.state <> 'failed'"
                } else {
                    ""
                }
            )
        } else {
            "0".to_string()
        };
        // With a byte bound the server stops at it. Rows are counted round-robin over the
        // partitions (every partition's first row, then every second row, …, each level in seq
        // order), and a row goes out only if the payloads counted before it stay under the
        // bound. Within a partition that order is its position order, so each partition gives a
        // prefix, and no partition waits behind another's big payloads; `assemble` then trims
        // the merge (by seq) to the exact bound, which drops at most the last row counted. The count runs over a narrow derived table (seq and length only)
        // joined back by key: one running SUM, which the server keeps incrementally. (The gate
        // before took a running MAX per partition, which MariaDB recomputes over the whole frame
        // for every row: 160 ms for a 1,000-row claim of one key, against 7.5 ms for this one.)
        let alias = if bytes.is_some() { "i" } else { "o" };
        let mut select = match bytes {
            None => QueryBuilder::<MySql>::new(format!(
                "SELECT {MESSAGE_COLUMNS}, {held} AS held FROM {m} AS o WHERE "
            )),
            Some(_) => {
                let mut q = QueryBuilder::<MySql>::new(format!(
                    "SELECT {MESSAGE_COLUMNS}, {held} AS held FROM (SELECT i.seq, \
                     SUM(LENGTH(i.payload)) OVER (ORDER BY i.part_seq - CASE i.part"
                ));
                for (p, _) in take {
                    q.push(" WHEN ")
                        .push_bind(p.part)
                        .push(" THEN ")
                        .push_bind(p.passed);
                }
                q.push(format!(
                    " END, i.seq) - LENGTH(i.payload) AS bytes_before FROM {m} AS i WHERE "
                ));
                q
            }
        };
        // Ranges wholly passed hold none of these rows: the bound keeps the server from
        // probing each of them (partition pruning), so a claim's cost does not grow with the
        // ranges retention keeps.
        let passed_below = take.iter().map(|(p, _)| p.passed_below).min().unwrap_or(0);
        select
            .push(format!("{alias}.seq >= "))
            .push_bind(passed_below)
            .push(" AND (");
        let mut each = select.separated(" OR ");
        for (p, k) in take {
            each.push(format!("({alias}.part = "))
                .push_bind_unseparated(p.part)
                .push_unseparated(format!(" AND {alias}.part_seq BETWEEN "))
                .push_bind_unseparated(p.passed + 1)
                .push_unseparated(" AND ")
                .push_bind_unseparated(p.passed + k)
                .push_unseparated(")");
        }
        select.push(")");
        if let Some(bytes) = bytes {
            select.push(format!(
                ") AS g JOIN {m} AS o ON o.seq = g.seq WHERE g.bytes_before < "
            ));
            select.push_bind(i64::try_from(bytes).unwrap_or(i64::MAX));
        }
        let rows = select.build().fetch_all(&self.pool).await.map_err(err)?;
        let mut by_part: BTreeMap<i16, Vec<(Message, i64, bool)>> = BTreeMap::new();
        for r in &rows {
            let held: i64 = r.try_get("held").map_err(err)?;
            let (m, part, part_seq, why) = message_from_row(r, 0)?;
            if let Some(why) = why {
                malformed.push((m.seq, why));
            }
            by_part
                .entry(part)
                .or_default()
                .push((m, part_seq, held != 0));
        }
        let mut out = Vec::with_capacity(take.len());
        for (p, _) in take {
            let mut rows = by_part.remove(&p.part).unwrap_or_default();
            rows.sort_by_key(|(_, part_seq, _)| *part_seq);
            let run = rows
                .iter()
                .zip(p.passed + 1..)
                .take_while(|((_, part_seq, _), want)| part_seq == want)
                .count();
            if run < rows.len() {
                if self.sequencer.is_some() {
                    // The sequencer read the row from the binlog, which the server writes
                    // just before the row becomes visible: it comes in the next claim.
                    tracing::debug!(
                        partition = p.part,
                        after = p.passed + run as i64,
                        "a sequenced row is not visible yet; rows past it wait a moment"
                    );
                } else {
                    tracing::warn!(
                        partition = p.part,
                        after = p.passed + run as i64,
                        "a gap in a partition's positions: rows past it wait; was the outbox \
                         trigger bypassed or the counter table changed by hand?"
                    );
                }
                rows.truncate(run);
            }
            out.push(WindowRead {
                part: p.part,
                passed: p.passed,
                rows,
            });
        }
        Ok(out)
    }

    /// Reads what `member` may hand out now and remembers it as its ticket; with the rows
    /// read that cannot be published as stored (`seq`, why), which are in the ticket too.
    async fn read_claim(
        &self,
        member: &MemberId,
        partitions: &[i32],
        limits: ClaimLimits,
        on_failed: OnFailed,
    ) -> Result<(Vec<Message>, Ticket, Vec<(i64, String)>)> {
        let mut malformed = Vec::new();
        let positions = self.positions(member, partitions).await?;
        let fences: BTreeMap<i16, Fence> = positions.iter().map(|p| (p.part, p.fence)).collect();
        let now = Utc::now();
        let with_parked: Vec<i16> = positions
            .iter()
            .filter(|p| p.parked > 0)
            .map(|p| p.part)
            .collect();
        let read_parked =
            !with_parked.is_empty() && self.state(member, |s| s.should_read_parked(now, on_failed));
        let rows = i64::try_from(limits.rows).unwrap_or(i64::MAX);
        let mut parked = Vec::new();
        if read_parked {
            let (keys, next_due) = self
                .read_parked(&with_parked, on_failed, rows, &mut malformed)
                .await?;
            self.state(member, |s| {
                s.parked_read_at = Some((Instant::now(), on_failed));
                s.parked_next_due = next_due;
                s.parked_changed = false;
            });
            parked = keys;
        }
        let parked_rows: i64 = parked.iter().map(|k| k.rows.len() as i64).sum();
        let parked_bytes: usize = parked
            .iter()
            .flat_map(|k| &k.rows)
            .map(|(m, _)| m.payload.len())
            .sum();
        let budget = rows.saturating_sub(parked_rows);
        // The byte bound left after the parked messages; the first row always goes.
        let bytes =
            (limits.bytes != usize::MAX).then(|| limits.bytes.saturating_sub(parked_bytes).max(1));
        let open: Vec<Position> = positions
            .iter()
            .filter(|p| p.last > p.passed && p.parked < PARKED_CAP)
            .copied()
            .collect();
        let available: Vec<i64> = open.iter().map(|p| p.last - p.passed).collect();
        let take: Vec<(Position, i64)> = open
            .into_iter()
            .zip(share(&available, budget.max(1)))
            .filter(|(_, k)| *k > 0)
            .collect();
        let windows = if take.is_empty() {
            Vec::new()
        } else {
            let probe = take.iter().any(|(p, _)| p.parked > 0);
            self.read_windows(&take, probe, on_failed, bytes, &mut malformed)
                .await?
        };
        let (messages, ticket) = assemble(parked, windows, limits, on_failed, fences);
        Ok((messages, ticket, malformed))
    }

    /// Writes `plans` in one transaction, each partition only if its fence still holds (owned
    /// by `member`, same epoch, no record since its claim). Returns the outcomes settled.
    async fn record(&self, member: &MemberId, plans: &[PartPlan]) -> Result<u64> {
        if plans.is_empty() {
            return Ok(0);
        }
        let err =
            |what: &'static str| move |e| map_sqlx_error(&format!("recording a batch: {what}"), e);
        let r = |sql: &str| self.schema.render(sql);
        let mut tx = self.pool.begin().await.map_err(err("begin"))?;
        let mut lock =
            QueryBuilder::<MySql>::new(r(include_str!("../queries/record_lock_head.sql")));
        let mut each = lock.separated(", ");
        for p in plans {
            each.push_bind(p.part);
        }
        lock.push(") ORDER BY part FOR UPDATE");
        let rows = lock
            .build()
            .fetch_all(&mut *tx)
            .await
            .map_err(err("locking the partitions"))?;
        let mut current: HashMap<i16, (i64, i64, Option<String>)> = HashMap::new();
        for r in rows {
            let part: i16 = r.try_get("part").map_err(err("reading partitions"))?;
            current.insert(
                part,
                (
                    r.try_get("epoch").map_err(err("reading partitions"))?,
                    r.try_get("recorded").map_err(err("reading partitions"))?,
                    r.try_get("owner").map_err(err("reading partitions"))?,
                ),
            );
        }
        let fenced: Vec<&PartPlan> = plans
            .iter()
            .filter(|p| {
                current
                    .get(&p.part)
                    .is_some_and(|(epoch, recorded, owner)| {
                        *epoch == p.fence.epoch
                            && *recorded == p.fence.recorded
                            && owner.as_deref() == Some(member.as_str())
                    })
            })
            .collect();
        if fenced.is_empty() {
            tx.rollback().await.map_err(err("rollback"))?;
            return Ok(0);
        }
        let parks: Vec<_> = fenced.iter().flat_map(|p| &p.parks).collect();
        if !parks.is_empty() {
            let mut upsert =
                QueryBuilder::<MySql>::new(r(include_str!("../queries/park_head.sql")));
            upsert.push_values(parks, |mut row, k| {
                row.push_bind(k.seq)
                    .push_bind(k.part)
                    .push_bind(k.part_seq)
                    .push_bind(k.key.as_str())
                    .push_bind(k.state)
                    .push_bind(k.attempts)
                    .push("UTC_TIMESTAMP(6) + INTERVAL ")
                    .push_bind_unseparated(k.next_attempt_in.map(micros))
                    .push_unseparated(" MICROSECOND")
                    .push_bind(k.error.as_deref());
            });
            upsert.push(
                " ON DUPLICATE KEY UPDATE state = VALUES(state), attempts = VALUES(attempts), \
                 next_attempt_at = VALUES(next_attempt_at), last_error = VALUES(last_error)",
            );
            upsert
                .build()
                .execute(&mut *tx)
                .await
                .map_err(err("parking messages"))?;
        }
        let deletes: Vec<i64> = fenced
            .iter()
            .flat_map(|p| p.deletes.iter().copied())
            .collect();
        if !deletes.is_empty() {
            let mut delete =
                QueryBuilder::<MySql>::new(r(include_str!("../queries/unpark_head.sql")));
            let mut each = delete.separated(", ");
            for seq in &deletes {
                each.push_bind(*seq);
            }
            delete.push(")");
            delete
                .build()
                .execute(&mut *tx)
                .await
                .map_err(err("releasing parked messages"))?;
        }
        let mut update =
            QueryBuilder::<MySql>::new(r(include_str!("../queries/record_positions_head.sql")));
        for p in &fenced {
            update.push(" WHEN ").push_bind(p.part).push(" THEN ");
            match p.passed {
                Some(passed) => update.push_bind(passed),
                None => update.push("passed"),
            };
        }
        update.push(" ELSE passed END, parked = parked + CASE part");
        for p in &fenced {
            update
                .push(" WHEN ")
                .push_bind(p.part)
                .push(" THEN ")
                .push_bind(p.parked_delta);
        }
        update.push(" ELSE 0 END, passed_at = UTC_TIMESTAMP(6) WHERE part IN (");
        let mut each = update.separated(", ");
        for p in &fenced {
            each.push_bind(p.part);
        }
        update.push(")");
        update
            .build()
            .execute(&mut *tx)
            .await
            .map_err(err("moving the positions"))?;
        tx.commit().await.map_err(err("commit"))?;
        Ok(fenced.iter().map(|p| p.settled).sum())
    }

    async fn stats_counts(&self) -> Result<Stats> {
        let err = |e| map_sqlx_error("reading outbox status", e);
        let r = sqlx::query(&self.q.stats)
            .bind(PARKED_CAP)
            .fetch_one(&self.pool)
            .await
            .map_err(err)?;
        let unpassed: i64 = r.try_get("unpassed").map_err(err)?;
        let passed: i64 = r.try_get("passed").map_err(err)?;
        let parked: i64 = r.try_get("parked").map_err(err)?;
        let failed: i64 = r.try_get("failed").map_err(err)?;
        let oldest_us: Option<i64> = r.try_get("oldest_us").map_err(err)?;
        let oldest_waiting_us: Option<i64> = r.try_get("oldest_waiting_us").map_err(err)?;
        Ok(Stats {
            pending: unpassed + parked - failed,
            oldest_pending_age_seconds: oldest_us.map(|us| us.max(0) as f64 / 1e6),
            failed,
            published: passed - parked,
            retrying: r.try_get("retrying").map_err(err)?,
            blocked_keys: r.try_get("blocked_keys").map_err(err)?,
            parked,
            partitions_at_parking_cap: r.try_get("at_cap").map_err(err)?,
            waiting: parked - failed,
            oldest_waiting_age_seconds: oldest_waiting_us.map(|us| us.max(0) as f64 / 1e6),
            members: Vec::new(),
            blocked: Vec::new(),
        })
    }
}

#[async_trait]
impl Store for Engine {
    async fn join(&self, member: &MemberId) -> Result<()> {
        sqlx::query(&self.q.heartbeat)
            .bind(member.as_str())
            .execute(&self.pool)
            .await
            .map_err(|e| map_sqlx_error("registering a relay member", e))?;
        Ok(())
    }

    async fn rebalance(&self, member: &MemberId, lease: Duration) -> Result<Vec<i32>> {
        if let Some(sequencer) = &self.sequencer {
            sequencer.start();
        }
        let err = |what: &'static str| {
            move |e| map_sqlx_error(&format!("rebalancing partitions: {what}"), e)
        };
        let lease_us = micros(lease);
        let mut tx = self.pool.begin().await.map_err(err("begin"))?;
        // Every partition row, locked: rebalances run one at a time, so two members can never
        // both take a partition.
        let rows = sqlx::query(&self.q.lock_partitions)
            .fetch_all(&mut *tx)
            .await
            .map_err(err("locking the partitions"))?;
        sqlx::query(&self.q.heartbeat)
            .bind(member.as_str())
            .execute(&mut *tx)
            .await
            .map_err(err("heartbeat"))?;
        sqlx::query(&self.q.reap_members)
            .bind(lease_us)
            .execute(&mut *tx)
            .await
            .map_err(err("forgetting silent members"))?;
        let live: i64 = sqlx::query_scalar(&self.q.count_members)
            .fetch_one(&mut *tx)
            .await
            .map_err(err("counting members"))?;
        let mut owned = Vec::new();
        let mut free = Vec::new();
        for r in &rows {
            let part: i16 = r.try_get("part").map_err(err("reading partitions"))?;
            let owner: Option<String> = r.try_get("owner").map_err(err("reading partitions"))?;
            let live: i64 = r.try_get("live").map_err(err("reading partitions"))?;
            match owner {
                Some(o) if o == member.as_str() => owned.push(part),
                Some(_) if live != 0 => {}
                _ => free.push(part),
            }
        }
        let total = rows.len();
        let fair = total.div_ceil(usize::try_from(live).unwrap_or(1).max(1));
        sqlx::query(&self.q.renew)
            .bind(lease_us)
            .bind(member.as_str())
            .execute(&mut *tx)
            .await
            .map_err(err("renewing leases"))?;
        if owned.len() > fair {
            let extra = owned.split_off(fair);
            sqlx::query(&self.q.give_back)
                .bind(member.as_str())
                .bind(csv(extra))
                .execute(&mut *tx)
                .await
                .map_err(err("giving back partitions"))?;
        } else if owned.len() < fair && !free.is_empty() {
            fastrand::shuffle(&mut free);
            free.truncate(fair - owned.len());
            sqlx::query(&self.q.acquire)
                .bind(member.as_str())
                .bind(lease_us)
                .bind(csv(free.iter().copied()))
                .execute(&mut *tx)
                .await
                .map_err(err("acquiring partitions"))?;
            owned.extend(free);
        }
        tx.commit().await.map_err(err("commit"))?;
        owned.sort_unstable();
        Ok(owned.into_iter().map(i32::from).collect())
    }

    async fn renew(&self, member: &MemberId, lease: Duration) -> Result<usize> {
        let done = sqlx::query(&self.q.renew)
            .bind(micros(lease))
            .bind(member.as_str())
            .execute(&self.pool)
            .await
            .map_err(|e| map_sqlx_error("renewing leases", e))?;
        Ok(usize::try_from(done.rows_affected()).unwrap_or(usize::MAX))
    }

    async fn claim(
        &self,
        member: &MemberId,
        partitions: &[i32],
        limits: ClaimLimits,
        on_failed: OnFailed,
    ) -> Result<Vec<Message>> {
        if let Some(sequencer) = &self.sequencer {
            sequencer.start();
        }
        let (messages, ticket, malformed) = self
            .read_claim(member, partitions, limits, on_failed)
            .await?;
        let (messages, failed) = withhold(messages, &malformed);
        if messages.is_empty() {
            // Nothing to send, but rows held behind parked keys are parked now, else the next
            // claim would read them again (and the partition's other keys would wait); and
            // rows that cannot be published as stored go `failed`.
            let plans = ticket.plan(&failed);
            self.state(member, |s| s.ticket = None);
            if !plans.is_empty() {
                self.record(member, &plans).await?;
                self.state(member, |s| s.parked_changed = true);
            }
            return Ok(messages);
        }
        self.state(member, |s| {
            s.claims += 1;
            s.ticket = Some((s.claims, ticket));
            s.failed_in_claim = failed;
        });
        Ok(messages)
    }

    async fn complete(&self, member: &MemberId, outcomes: &[Outcome]) -> Result<u64> {
        let Some((number, plans)) = self.state(member, |s| {
            let (n, t) = s.ticket.as_ref()?;
            // The rows the claim failed itself come with the relay's outcomes.
            let all: Vec<Outcome> = if s.failed_in_claim.is_empty() {
                Vec::new()
            } else {
                s.failed_in_claim.iter().chain(outcomes).cloned().collect()
            };
            let plan = if all.is_empty() {
                t.plan(outcomes)
            } else {
                t.plan(&all)
            };
            Some((*n, plan))
        }) else {
            return Ok(0);
        };
        let parks = plans
            .iter()
            .any(|p| !p.parks.is_empty() || !p.deletes.is_empty());
        // The ticket stays until the record commits: a call dropped before that can be made
        // again, and one that did commit makes its repeat change nothing (the fence moved).
        let settled = self.record(member, &plans).await?;
        self.state(member, |s| {
            if s.ticket.as_ref().is_some_and(|(n, _)| *n == number) {
                s.ticket = None;
            }
            if parks {
                s.parked_changed = true;
            }
        });
        Ok(settled)
    }

    async fn report_health(
        &self,
        member: &MemberId,
        circuit: &str,
        sink_error: Option<&str>,
    ) -> Result<()> {
        sqlx::query(&self.q.report_health)
            .bind(circuit)
            .bind(sink_error)
            .bind(member.as_str())
            .execute(&self.pool)
            .await
            .map_err(|e| map_sqlx_error("reporting relay health", e))?;
        Ok(())
    }

    async fn release(&self, member: &MemberId) -> Result<()> {
        let err = |e| map_sqlx_error("releasing partitions", e);
        sqlx::query(&self.q.release_partitions)
            .bind(member.as_str())
            .execute(&self.pool)
            .await
            .map_err(err)?;
        sqlx::query(&self.q.release_member)
            .bind(member.as_str())
            .execute(&self.pool)
            .await
            .map_err(err)?;
        let none_left = {
            let mut members = self
                .members
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            members.remove(member);
            members.is_empty()
        };
        if let Some(sequencer) = self.sequencer.as_ref().filter(|_| none_left) {
            // Its lease goes too: another relay's sequencer takes over at once.
            sequencer.stop().await;
        }
        Ok(())
    }

    /// Ranges ahead of the writers, and ranges retention no longer needs dropped whole
    /// ([`crate::ranges::maintain`]).
    async fn maintain(&self, retention: Duration) -> Result<Maintenance> {
        crate::ranges::maintain(&self.pool, &self.schema, retention).await
    }

    /// MySQL has no notifications: the relay polls. On the binlog route the sequencer rings
    /// the relay after each batch it sequenced.
    async fn listen(&self, wake: watch::Sender<u64>) -> Result<()> {
        let Some(sequencer) = &self.sequencer else {
            return Ok(());
        };
        let mut progress = sequencer.progress();
        let mut seen = 0;
        while progress.changed().await.is_ok() {
            let n = progress.borrow_and_update().sequenced;
            if n != seen {
                seen = n;
                wake.send_modify(|w| *w = w.wrapping_add(1));
            }
        }
        Ok(())
    }

    async fn stats(&self) -> Result<Stats> {
        let err = |e| map_sqlx_error("reading outbox status", e);
        let mut stats = self.stats_counts().await?;
        for r in sqlx::query(&self.q.members)
            .fetch_all(&self.pool)
            .await
            .map_err(err)?
        {
            let heartbeat_at: NaiveDateTime = r.try_get("heartbeat_at").map_err(err)?;
            stats.members.push(MemberStatus {
                member: r.try_get("member").map_err(err)?,
                partitions: r.try_get("partitions").map_err(err)?,
                heartbeat_at: utc(heartbeat_at),
                circuit: r.try_get("circuit").map_err(err)?,
                sink_error: r.try_get("sink_error").map_err(err)?,
            });
        }
        for r in sqlx::query(&self.q.blocked)
            .fetch_all(&self.pool)
            .await
            .map_err(err)?
        {
            stats.blocked.push(BlockedKey {
                key: r.try_get("aggregate_id").map_err(err)?,
                state: r.try_get("state").map_err(err)?,
                attempts: r.try_get("attempts").map_err(err)?,
                last_error: r.try_get("last_error").map_err(err)?,
            });
        }
        Ok(stats)
    }

    async fn gauges(&self) -> Result<outbox_core::Gauges> {
        let mut g = outbox_core::Gauges::from_stats(&self.stats_counts().await?);
        if self.sequencer.is_some() {
            let s = crate::binlog::status::read(&self.pool, &self.schema).await?;
            g.binlog_sequencer = Some(crate::binlog::status::gauges(&s, Utc::now()));
        }
        Ok(g)
    }

    /// No backlog by type on MySQL yet: said here, so that the metrics' 30-second read does not
    /// go through [`Store::status_detail`] (the sequencer's three statements) for nothing.
    async fn pending_by_type(&self, _cap: i64) -> Result<Vec<outbox_core::status::PendingCell>> {
        Ok(Vec::new())
    }

    /// On the binlog route, the sequencer (its lease, how far it has read, the seal); nothing
    /// more on either route yet (`outbox status` shows the counts).
    async fn status_detail(&self) -> Result<outbox_core::status::StatusDetail> {
        let binlog_sequencer = match self.sequencer {
            Some(_) => Some(crate::binlog::status::read(&self.pool, &self.schema).await?),
            None => None,
        };
        Ok(outbox_core::status::StatusDetail {
            binlog_sequencer,
            ..Default::default()
        })
    }

    async fn ping(&self) -> Result<()> {
        sqlx::query(include_str!("../queries/ping.sql"))
            .execute(&self.pool)
            .await
            .map_err(|e| map_sqlx_error("pinging MySQL", e))?;
        Ok(())
    }

    async fn failed(&self, limit: usize) -> Result<Vec<FailedMessage>> {
        let err = |e| map_sqlx_error("listing failed messages", e);
        let rows = sqlx::query(&self.q.failed)
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .fetch_all(&self.pool)
            .await
            .map_err(err)?;
        rows.iter()
            .map(|r| {
                let seq: i64 = r.try_get("seq").map_err(err)?;
                // A row failed because of its id or time is listed with stand-ins (its
                // `last_error` says what it holds).
                let (id, _) = row_id(r);
                let (created_at, _) = row_time(r);
                Ok(FailedMessage {
                    id,
                    seq,
                    aggregate_type: r.try_get("aggregate_type").map_err(err)?,
                    aggregate_id: r.try_get("aggregate_id").map_err(err)?,
                    event_type: r.try_get("event_type").map_err(err)?,
                    attempts: r.try_get("attempts").map_err(err)?,
                    last_error: r.try_get("last_error").map_err(err)?,
                    created_at,
                })
            })
            .collect()
    }

    async fn failed_matching(
        &self,
        filter: &FailedFilter,
        after: Option<i64>,
        limit: usize,
    ) -> Result<FailedPage> {
        let err = |e| map_sqlx_error("listing failed messages", e);
        let kind = filter.kind.as_deref().map(str::to_lowercase);
        let error = filter.error.as_deref().map(str::to_lowercase);
        let rows = sqlx::query(&self.q.failed_matching)
            .bind(filter.key.as_deref())
            .bind(filter.key.as_deref())
            .bind(kind.as_deref())
            .bind(kind.as_deref())
            .bind(error.as_deref())
            .bind(error.as_deref())
            .bind(after)
            .bind(after)
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .fetch_all(&self.pool)
            .await
            .map_err(err)?;
        let mut page = FailedPage::default();
        for r in &rows {
            page.total = r.try_get("total").map_err(err)?;
            let Some(seq) = r.try_get::<Option<i64>, _>("seq").map_err(err)? else {
                continue;
            };
            let (id, _) = row_id(r);
            let (created_at, _) = row_time(r);
            page.messages.push(FailedMessage {
                id,
                seq,
                aggregate_type: r.try_get("aggregate_type").map_err(err)?,
                aggregate_id: r.try_get("aggregate_id").map_err(err)?,
                event_type: r.try_get("event_type").map_err(err)?,
                attempts: r.try_get("attempts").map_err(err)?,
                last_error: r.try_get("last_error").map_err(err)?,
                created_at,
            });
        }
        Ok(page)
    }

    async fn redrive(&self, scope: &RedriveScope, reason: &str) -> Result<u64> {
        let ids: Option<Vec<String>> = match scope {
            RedriveScope::All => None,
            RedriveScope::Ids(ids) if ids.is_empty() => return Ok(0),
            RedriveScope::Ids(ids) => Some(ids.iter().map(|id| id.to_string()).collect()),
        };
        let err = |what: &'static str| {
            move |e| map_sqlx_error(&format!("redriving failed messages: {what}"), e)
        };
        let which = |q: &mut QueryBuilder<'_, MySql>| {
            if let Some(ids) = &ids {
                q.push(" AND o.id IN (");
                let mut each = q.separated(", ");
                for id in ids {
                    each.push_bind(id.clone());
                }
                q.push(")");
            }
        };
        let mut tx = self.pool.begin().await.map_err(err("begin"))?;
        // The reason is bound where the statement names `{reason}`.
        let audit_sql = self
            .schema
            .render(include_str!("../queries/redrive_audit.sql"));
        let (head, tail) = audit_sql
            .split_once("{reason}")
            .expect("redrive_audit.sql names {reason}");
        let mut audit = QueryBuilder::<MySql>::new(head);
        audit.push_bind(reason);
        audit.push(tail);
        which(&mut audit);
        audit
            .build()
            .execute(&mut *tx)
            .await
            .map_err(err("auditing"))?;
        let mut update =
            QueryBuilder::<MySql>::new(self.schema.render(include_str!("../queries/redrive.sql")));
        which(&mut update);
        let done = update
            .build()
            .execute(&mut *tx)
            .await
            .map_err(err("releasing"))?;
        tx.commit().await.map_err(err("commit"))?;
        Ok(done.rows_affected())
    }

    async fn insert(&self, messages: &[NewMessage]) -> Result<()> {
        let err = |e| map_sqlx_error("inserting messages", e);
        let mut tx = self.pool.begin().await.map_err(err)?;
        crate::writer::enqueue_many(&mut tx, &self.schema, messages).await?;
        tx.commit().await.map_err(err)?;
        if let (Some(sequencer), Some(last)) = (&self.sequencer, messages.last()) {
            // Claimable once it returns, as on the trigger's route: the sequencer positions a
            // transaction's rows together, so once one of them has its position all have.
            sequencer.start();
            let seq: i64 =
                sqlx::query_scalar(&self.schema.render(include_str!("../queries/seq_of_id.sql")))
                    .bind(last.id.to_string())
                    .fetch_one(&self.pool)
                    .await
                    .map_err(err)?;
            sequencer
                .wait_until_positioned(seq, INSERT_SEQUENCED)
                .await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_is_shared_evenly_and_what_one_cannot_use_goes_to_the_others() {
        assert_eq!(share(&[100, 100, 100], 90), vec![30, 30, 30]);
        assert_eq!(share(&[5, 100, 100], 90), vec![5, 43, 42]);
        assert_eq!(share(&[0, 3], 10), vec![0, 3]);
        assert_eq!(share(&[10, 10, 10], 2).iter().sum::<i64>(), 2);
        assert_eq!(share(&[], 10), Vec::<i64>::new());
    }

    #[test]
    fn only_mysql_and_mariadb_urls_are_taken_and_the_password_is_not_shown() {
        assert!(connect_options("mariadb://root@127.0.0.1:3306/test").is_ok());
        assert!(connect_options("MySQL://root@127.0.0.1/test").is_ok());
        let e = connect_options("postgres://u:hunter2@db/x").unwrap_err();
        assert!(!e.to_string().contains("hunter2"), "{e}");
        assert_eq!(
            url_database("mysql://root@127.0.0.1/shop").ok().flatten(),
            Some("shop".into())
        );
    }
}
