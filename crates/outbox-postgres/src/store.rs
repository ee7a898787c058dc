//! [`PgStore`]: the relay's view of a PostgreSQL outbox (partition leases, window claims,
//! fenced positions, parked messages, retention).
//!
//! The message table is insert-only: nothing here updates or deletes a message row. See
//! `migrations/0003_engine_v2.sql` and `docs/engine.md` for the model.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use futures::TryStreamExt;
use outbox_core::status::{
    KeptBecause, PartitionStatus, PendingCell, Position, RetentionPin, RetentionStatus, Segment,
    StatusDetail,
};
use outbox_core::store::MemberStatus;
use outbox_core::{
    BlockedKey, ClaimLimits, FailedFilter, FailedMessage, FailedPage, Maintenance, MemberId,
    Message, NewMessage, OnFailed, Outcome, RedriveScope, Result, Stats, Store,
};
use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions};
use sqlx::{PgPool, Row};
use tokio::sync::watch;

use crate::error::map_sqlx_error;
use crate::schema::Schema;
use crate::ticket::{NewPosition, ParkedRow, Plan, Ticket, Window, WindowRow};
use crate::writer::Writer;

/// Number of relay partitions; fixed by the migration that computes `outbox.partition`.
pub const PARTITIONS: usize = 64;

/// Pending rows counted per partition by `stats` before it stops counting.
pub const PENDING_COUNT_CAP: i64 = 100_000;

/// Parked messages per partition at which the partition's window stops advancing: its parked
/// keys still drain, other partitions flow, and the relay warns. Bounds the parked table when a
/// key is stuck behind a failed head with a long backlog.
pub const PARKED_CAP: i64 = 10_000;

/// How often a member with nothing to do records that its empty windows are passed, so that
/// retention can move on while no message flows.
const IDLE_ADVANCE_EVERY: Duration = Duration::from_secs(5);

/// Session settings of every relay connection, sent as startup options. Claims must have one
/// obvious plan whatever the statistics say: JIT compiling a claim cost 160 ms per claim in
/// production-like tests, so it is off. A lock wait longer than this is an outage, not a plan
/// to wait for. `statement_timeout` is set apart: see [`statement_timeout_for`].
const SESSION_SETTINGS: [(&str, &str); 3] = [
    ("jit", "off"),
    ("lock_timeout", "5s"),
    ("idle_in_transaction_session_timeout", "60s"),
];

/// A claim at least this long logs where its time went (at debug).
const SLOW_CLAIM: Duration = Duration::from_millis(100);

/// How long this process's threads have waited, all together, for a core while ready to run
/// (Linux's `schedstat`; `None` elsewhere). Read only when debug logging is on.
fn runqueue_wait() -> Option<Duration> {
    let tasks = std::fs::read_dir("/proc/self/task").ok()?;
    let mut nanos: u64 = 0;
    for task in tasks.flatten() {
        let Ok(stat) = std::fs::read_to_string(task.path().join("schedstat")) else {
            continue; // the thread ended meanwhile
        };
        nanos += stat
            .split_whitespace()
            .nth(1)
            .and_then(|w| w.parse::<u64>().ok())
            .unwrap_or(0);
    }
    Some(Duration::from_nanos(nanos))
}

/// How a claim's transaction begins. Reads only: the transaction exists to scope the planner
/// settings. READ COMMITTED whatever the server's default: each statement reads as of its own
/// start, the window claim's snapshot included. Each part of the window claim has an index path
/// that yields its rows in the order it asks for (see claim_window.sql): sorts, bitmap scans and
/// sequential scans are priced out, so no statistics can make a read-and-sort of a whole txid
/// range, partition or backlog look cheaper. JIT is off here too, whatever pool the store was
/// given: the disabled paths inflate the plan's cost past any JIT threshold, and compiling a
/// claim costs a second (measured).
const CLAIM_BEGIN: &str = include_str!("../queries/claim_begin.sql");

/// How a read of the backlog's figures begins (the status counts, the backlog by type, a
/// scrape's gauges): read-only, JIT off, bitmap scans and sorts priced out, as a claim's. Each
/// part of pending_rows.sql walks an ordered index range and stops at its limit; on a table
/// without statistics yet (a backlog just written) the planner otherwise chose a bitmap scan of
/// each partition's whole range, and a scrape in the middle of a drain then read every pending
/// row's heap tuple (1.3 s for 400,000 rows, against 0.2 s walking the index).
pub(crate) const READ_BEGIN: &str = include_str!("../queries/read_begin.sql");

/// A query of the backlog's figures, run by [`read_backlog`].
pub(crate) type BacklogQuery<'q> =
    sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>;

/// Runs `query` in a [`READ_BEGIN`] transaction on `pool`: the rows it returns.
pub(crate) async fn read_backlog(
    pool: &PgPool,
    query: BacklogQuery<'_>,
) -> std::result::Result<Vec<sqlx::postgres::PgRow>, sqlx::Error> {
    let (mut tx, _) = crate::begin::begin_with(pool, READ_BEGIN).await?;
    let rows = query.fetch_all(&mut *tx).await?;
    tx.commit().await?;
    Ok(rows)
}

/// [`read_backlog`] of a query that returns one row.
pub(crate) async fn read_backlog_row(
    pool: &PgPool,
    query: BacklogQuery<'_>,
) -> std::result::Result<sqlx::postgres::PgRow, sqlx::Error> {
    read_backlog(pool, query)
        .await?
        .into_iter()
        .next()
        .ok_or(sqlx::Error::RowNotFound)
}

/// The store deadline [`connect_pool`] assumes: the relay's default (15 s).
pub const DEFAULT_STORE_DEADLINE: Duration = Duration::from_secs(15);

/// The server-side `statement_timeout` of the relay's sessions when the relay abandons a store
/// call after `store_deadline`: two thirds of it (at least 100 ms). Below the deadline on
/// purpose: dropping a call does not stop its statement on the server, and a record that kept
/// running past its caller's deadline could land after the record that retried it. The store
/// cancels the statements it abandons too; this bounds them even when the cancel is lost.
pub fn statement_timeout_for(store_deadline: Duration) -> Duration {
    (store_deadline * 2 / 3).max(Duration::from_millis(100))
}

struct Queries {
    claim_window: String,
    claim_parked: String,
    record: String,
    heartbeat: String,
    reap_members: String,
    renew: String,
    renew_due: String,
    give_back: String,
    acquire: String,
    release: String,
    stats: String,
    members: String,
    blocked: String,
    report_health: String,
    failed: String,
    failed_matching: String,
    redrive: String,
    status_pending: String,
    status_partitions: String,
    status_retention: String,
}

/// `sql` with its `{pending_rows}` replaced by `queries/pending_rows.sql`, the one statement of
/// which rows are pending (shared by the status counts, the backlog by type and the scrape),
/// returning `cols` (`o.`-qualified, each after a comma) beside seq and txid.
pub(crate) fn with_pending_rows(sql: &str, cols: &str) -> String {
    sql.replace(
        "{pending_rows}",
        &include_str!("../queries/pending_rows.sql").replace("{cols}", cols),
    )
}

impl Queries {
    fn new(schema: &Schema) -> Self {
        Self {
            claim_window: schema.render(include_str!("../queries/claim_window.sql")),
            claim_parked: schema.render(include_str!("../queries/claim_parked.sql")),
            record: schema.render(include_str!("../queries/record.sql")),
            heartbeat: schema.render(include_str!("../queries/heartbeat.sql")),
            reap_members: schema.render(include_str!("../queries/reap_members.sql")),
            renew: schema.render(include_str!("../queries/renew.sql")),
            renew_due: schema.render(include_str!("../queries/renew_due.sql")),
            give_back: schema.render(include_str!("../queries/give_back.sql")),
            acquire: schema.render(include_str!("../queries/acquire.sql")),
            release: schema.render(include_str!("../queries/release.sql")),
            stats: schema.render(&with_pending_rows(
                include_str!("../queries/stats.sql"),
                ", o.created_at",
            )),
            members: schema.render(include_str!("../queries/members.sql")),
            blocked: schema.render(include_str!("../queries/blocked.sql")),
            report_health: schema.render(include_str!("../queries/report_health.sql")),
            failed: schema.render(include_str!("../queries/failed.sql")),
            failed_matching: schema.render(include_str!("../queries/failed_matching.sql")),
            redrive: schema.render(include_str!("../queries/redrive.sql")),
            status_pending: schema.render(&with_pending_rows(
                include_str!("../queries/status_pending.sql"),
                ", o.created_at, o.aggregate_type, o.event_type, o.topic",
            )),
            status_partitions: schema.render(include_str!("../queries/status_partitions.sql")),
            status_retention: schema.render(include_str!("../queries/status_retention.sql")),
        }
    }
}

/// Connection options for `url` set up for the relay (JIT off, lock timeout, and the
/// `statement_timeout` of the default store deadline). Errors never echo the password.
pub fn connect_options(url: &str) -> Result<PgConnectOptions> {
    connect_options_with(url, DEFAULT_STORE_DEADLINE)
}

/// [`connect_options`] for a relay that abandons store calls after `store_deadline`.
///
/// A URL naming several servers gives the first one's options: a pool follows the primary
/// among them ([`connect_pool_with`]), and anything else connects to the first.
pub fn connect_options_with(url: &str, store_deadline: Duration) -> Result<PgConnectOptions> {
    let servers = crate::servers::Servers::parse(url)?;
    let url = servers.first();
    let options: PgConnectOptions = url.parse().map_err(|e| {
        map_sqlx_error(
            &format!("parsing database URL {}", outbox_core::redact::url(url)),
            e,
        )
    })?;
    let timeout = format!("{}ms", statement_timeout_for(store_deadline).as_millis());
    Ok(options
        .options(SESSION_SETTINGS)
        .options([("statement_timeout", timeout.as_str())]))
}

/// Opens a pool to `url` with at most `max_connections`, every connection set up for the relay
/// (see [`connect_options`]). Errors never echo the password.
pub async fn connect_pool(url: &str, max_connections: u32) -> Result<PgPool> {
    connect_pool_with(url, max_connections, DEFAULT_STORE_DEADLINE).await
}

/// [`connect_pool`] for a relay that abandons store calls after `store_deadline`.
///
/// One connection is made first, on its own, so that a server that cannot be reached, a
/// database that does not exist or a refused login is reported at once, each with its cause
/// (see [`connect_error`]), rather than as the pool's "timed out" after ten seconds of retries.
pub async fn connect_pool_with(
    url: &str,
    max_connections: u32,
    store_deadline: Duration,
) -> Result<PgPool> {
    let servers = crate::servers::Servers::parse(url)?;
    if !servers.is_single() {
        return connect_followed(servers, max_connections, store_deadline).await;
    }
    let options = connect_options_with(url, store_deadline)?;
    match tokio::time::timeout(
        Duration::from_secs(10),
        sqlx::ConnectOptions::connect(&options),
    )
    .await
    {
        Ok(Ok(conn)) => drop(sqlx::Connection::close(conn).await),
        Ok(Err(e)) => return Err(connect_error(&options, e)),
        Err(_) => {
            return Err(outbox_core::Error::new(
                outbox_core::ErrorKind::Timeout,
                format!(
                    "cannot reach PostgreSQL at {}: no answer within 10s (is the host right, \
                     and the port open?)",
                    server_of(&options)
                ),
            ))
        }
    }
    PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(Duration::from_secs(10))
        .connect_with(options)
        .await
        .map_err(|e| {
            map_sqlx_error(
                &format!("connecting to {}", outbox_core::redact::url(url)),
                e,
            )
        })
}

/// A pool on a URL naming several servers or asking for a primary
/// (`target_session_attrs=read-write`): on the first server that will do, followed afterwards
/// (see [`crate::servers`]). With `read-write` every new connection is checked too, so none is
/// ever made to a standby.
async fn connect_followed(
    servers: crate::servers::Servers,
    max_connections: u32,
    store_deadline: Duration,
) -> Result<PgPool> {
    let options = move |u: &str| connect_options_with(u, store_deadline);
    let (chosen, conn) = crate::servers::find(&servers, &options).await?;
    let read_write = servers.read_write();
    let pool = PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(Duration::from_secs(10))
        .after_connect(move |conn, _| {
            Box::pin(async move {
                if read_write
                    && sqlx::query_scalar::<_, bool>(include_str!("../queries/in_recovery.sql"))
                        .fetch_one(&mut *conn)
                        .await?
                {
                    return Err(sqlx::Error::Protocol(
                        "this server is a standby; the primary is being looked for".into(),
                    ));
                }
                Ok(())
            })
        })
        .connect_lazy_with(chosen);
    crate::servers::follow(pool.clone(), servers, Some(conn), options);
    Ok(pool)
}

/// `host:port` (or the socket directory) of `options`, for error texts.
fn server_of(options: &PgConnectOptions) -> String {
    format!("{}:{}", options.get_host(), options.get_port())
}

/// The error of a first connection to PostgreSQL, its cause said once with what to do:
/// `cannot reach PostgreSQL at 127.0.0.1:1: connection refused (is the server running?)`,
/// `database "x" does not exist`, or PostgreSQL's own word on a refused login. Never the
/// password.
pub fn connect_error(options: &PgConnectOptions, e: sqlx::Error) -> outbox_core::Error {
    use outbox_core::{Error, ErrorKind};
    let server = server_of(options);
    match &e {
        sqlx::Error::Io(io) => {
            let why = match io.kind() {
                std::io::ErrorKind::ConnectionRefused => {
                    "connection refused (is the server running?)".to_string()
                }
                std::io::ErrorKind::TimedOut => {
                    "the connection timed out (is the host right, and the port open?)".to_string()
                }
                _ => io.to_string(),
            };
            Error::new(
                ErrorKind::Connection,
                format!("cannot reach PostgreSQL at {server}: {why}"),
            )
        }
        sqlx::Error::Database(db) if db.code().as_deref() == Some("3D000") => Error::new(
            ErrorKind::Config,
            format!(
                "database \"{}\" does not exist",
                options.get_database().unwrap_or_default()
            ),
        ),
        sqlx::Error::Database(db) if matches!(db.code().as_deref(), Some("28P01" | "28000")) => {
            Error::new(
                ErrorKind::Config,
                format!(
                    "PostgreSQL at {server} refused the login of user \"{}\": {}",
                    options.get_username(),
                    outbox_core::redact::sanitize(db.message())
                ),
            )
        }
        sqlx::Error::Tls(t) => Error::new(
            ErrorKind::Connection,
            format!("cannot reach PostgreSQL at {server}: TLS failed: {t}"),
        ),
        _ => map_sqlx_error(&format!("connecting to PostgreSQL at {server}"), e),
    }
}

/// What the store remembers per member between calls.
#[derive(Default)]
struct MemberState {
    /// Owned partitions and the epoch each was taken at (the fencing token).
    epochs: HashMap<i16, i64>,
    /// The last claim, until it is recorded.
    ticket: Option<Ticket>,
    /// Partitions that had rows at the last claim, to share a batch among them.
    active: usize,
    /// Which partitions those were (`None` before the member's first claim): only they get a
    /// share of the whole batch next time.
    busy: Option<HashSet<i16>>,
    /// When empty windows were last recorded as passed.
    last_idle_advance: Option<Instant>,
    /// When this member last warned about partitions at the parking cap.
    last_cap_warning: Option<Instant>,
    /// Mean payload size (bytes) of the rows the last claim measured, to size the next claim's
    /// reads to its byte bound.
    mean_payload: Option<usize>,
    /// The batch read ahead of the pending one, until adopted or dropped.
    ahead: Option<Ahead>,
    /// When the parked table needs reading.
    parked: ParkedReads,
    /// Whether the last claim's walk stopped at the end of its span in some partition.
    more_to_read: bool,
}

impl MemberState {
    /// Takes note of a record: the parked counts of the positions it appended, and whether it
    /// parked or released messages (the parked table then needs reading again).
    fn note_recorded(&mut self, plan: &Plan, appended: &[(i16, i64)]) {
        let written: Vec<NewPosition> = plan
            .positions
            .iter()
            .filter(|p| appended.iter().any(|(a, _)| *a == p.partition))
            .cloned()
            .collect();
        self.parked
            .recorded(&written, !plan.park.is_empty() || !plan.retried.is_empty());
    }

    /// Keeps what a claim's reads measured for the next claim: the partitions that had rows,
    /// the mean payload size, the parked counts.
    fn remember(&mut self, read: &ClaimRead) {
        self.active = read.active_now.max(1);
        self.busy = Some(
            read.ticket
                .windows
                .values()
                .filter(|w| w.found > 0)
                .map(|w| w.partition)
                .collect(),
        );
        self.mean_payload = read.mean_now.or(self.mean_payload);
        self.more_to_read = read.ticket.windows.values().any(|w| w.read_to.is_some());
        for w in read.ticket.windows.values() {
            self.parked.counts.insert(w.partition, w.parked);
        }
    }
}

/// How often a member reads the parked table at most while heads it knows of are not due:
/// a redrive (an operator's, or one made through the console) is picked up within this.
const PARKED_RECHECK: Duration = Duration::from_secs(1);

/// When a member reads the parked table. Only partitions whose latest position counts parked
/// messages (or whose count is not known yet) are read, and only when a head may be due: the
/// earliest next attempt seen has come, a record of this member parked or released messages
/// since, or [`PARKED_RECHECK`] passed. Claims in between, a broker outage with thousands of
/// parked messages included, do not read the parked table at all.
#[derive(Default)]
struct ParkedReads {
    /// Parked messages per partition, as the latest claim's positions (or this member's own
    /// records since) count them.
    counts: HashMap<i16, i64>,
    /// The last read, and the earliest next attempt of a head that was not due then.
    last_read: Option<Instant>,
    next_due: Option<DateTime<Utc>>,
    /// A record changed parked messages since the last read.
    changed: bool,
    /// The failed-message policy of the last read (`block`): the heads differ between them.
    block: Option<bool>,
}

impl ParkedReads {
    /// The partitions of `owned` to read now under the `block` policy (empty: no read).
    fn due(&self, owned: &[i16], block: bool) -> Vec<i16> {
        let with_parked: Vec<i16> = owned
            .iter()
            .copied()
            .filter(|p| self.counts.get(p).is_none_or(|n| *n > 0))
            .collect();
        let due = self.changed
            || self.block != Some(block)
            || self.last_read.is_none_or(|t| t.elapsed() >= PARKED_RECHECK)
            || self.next_due.is_some_and(|t| t <= Utc::now());
        if due {
            with_parked
        } else {
            Vec::new()
        }
    }

    /// A read of the parked table under the `block` policy happened now and found `next_due`.
    fn read(&mut self, block: bool, next_due: Option<DateTime<Utc>>) {
        self.block = Some(block);
        self.last_read = Some(Instant::now());
        self.next_due = next_due;
        self.changed = false;
    }

    /// A record appended `positions`, parking or releasing messages when `changed`.
    fn recorded(&mut self, positions: &[NewPosition], changed: bool) {
        for p in positions {
            self.counts.insert(p.partition, p.parked);
        }
        self.changed |= changed;
    }
}

/// A batch read ahead ([`Store::claim_ahead`]): its ticket, and the positions the batch before
/// it must record for it to follow on (every message published, no window closed).
struct Ahead {
    ticket: Ticket,
    expected: Vec<NewPosition>,
    /// Set by `complete`: the batch before it was recorded exactly as `expected` says.
    recorded: bool,
}

/// What one claim read, before it becomes the member's claim.
struct ClaimRead {
    messages: Vec<Message>,
    ticket: Ticket,
    /// When the parked table was read: the earliest next attempt of a head not yet due.
    parked_read: Option<Option<DateTime<Utc>>>,
    active_now: usize,
    mean_now: Option<usize>,
    idle_due: bool,
}

/// What one window read asks for.
struct WindowRead<'a> {
    epochs: &'a [(i16, i64)],
    /// The most rows any partition may return.
    per_partition: i64,
    /// The rows each partition of `epochs` may return (at most `per_partition`).
    partition_limits: &'a [i64],
    rows: usize,
    block: bool,
    /// Payload bytes it may hand out.
    bytes: usize,
    /// Whether its first row may go alone whatever its size (nothing else was handed out).
    first_alone: bool,
    /// For a read ahead: per partition, the open window to continue and where (the position
    /// the pending batch will record) instead of the recorded one.
    follow: Option<&'a HashMap<i16, NewPosition>>,
}

/// How many rows each partition of `epochs` may return in a claim of `rows`, given the number
/// of partitions that had rows at the member's last claim (`active`) and which (`busy`, `None`
/// before its first claim); and the most any may return.
fn share_batch(
    rows: usize,
    epochs: &[(i16, i64)],
    active: usize,
    busy: Option<&HashSet<i16>>,
) -> (i64, Vec<i64>) {
    // A batch is shared among the partitions that had rows last time: one hot key gets the
    // whole batch, a thousand keys a slice each. The slice is rounded up, so that busy
    // partitions fill the batch (the few rows past it are cut below, highest seqs first):
    // rounded down, 32 busy partitions and a batch of 1,000 came back with 992 rows, which
    // the relay reads as "caught up", so it never read ahead and paused after every batch.
    let parts = epochs.len().max(1);
    let rows = rows.max(1);
    let per_partition = rows.div_ceil(active.clamp(1, parts)).clamp(1, rows) as i64;
    // Only the partitions that had rows get that slice; the others get twice an even share
    // of the batch, so a backlog that appears across many of them at once (a big
    // transaction commits, a bulk insert after a quiet spell) is read as about three
    // batches, not one batch per partition: after a trickle on one key, 32 partitions at
    // 1,000 rows each made a 32,000-row claim of 150 ms. The next claim shares by what this
    // one found. A member's first claim knows nothing yet and gives every partition the
    // slice.
    let quiet = ((rows.saturating_mul(2)).div_ceil(parts).clamp(1, rows) as i64).min(per_partition);
    let partition_limits: Vec<i64> = epochs
        .iter()
        .map(|(p, _)| match busy {
            Some(busy) if !busy.contains(p) => quiet,
            _ => per_partition,
        })
        .collect();
    (per_partition, partition_limits)
}

/// The seqs A2's walk may span in one claim of a partition: four times the rows it may return,
/// and at least [`WALK_SPAN`]. A claim's cost therefore follows its batch, whatever runs
/// beside it: a walk that meets rows of a transaction still being written (which the index scan
/// steps over one heap visit at a time, without returning them) moves the window's cursor to
/// the end of its span and reads on at the next claim, instead of stepping over all of them at
/// once (a million-row transaction in progress made claims step over up to 55,000 rows and take
/// 300 ms).
fn walk_span(per_partition: i64) -> i64 {
    per_partition.saturating_mul(4).max(WALK_SPAN)
}

/// The smallest walk span: at most this many index entries per partition (about 15 ms of heap
/// visits here when every one belongs to a transaction still running; a claim's partitions
/// share the seqs, so together they meet about as many), and four times what a partition's share
/// of a batch needs when a thousand keys share the outbox (16 rows over about 1,000 seqs).
/// Measured with `bench --mode big-tx` (2026-12-04): 8,192 left claims of 100–110 ms while a
/// thousand transactions were written, 4,096 none over 60 ms once they were committed.
const WALK_SPAN: i64 = 4_096;

/// What a claim's reads measured: rows to hand out and the text length of their payloads.
#[derive(Default)]
struct Measured {
    rows: u64,
    bytes: u64,
}

impl Measured {
    fn add(&mut self, rows: i64, bytes: i64) {
        self.rows += u64::try_from(rows).unwrap_or(0);
        self.bytes += u64::try_from(bytes).unwrap_or(0);
    }
}

/// Rows to read for a claim bounded by `limits`, after payloads of `mean` bytes: what the byte
/// bound holds and half as many again, plus one (at least one, at most `limits.rows`). Every row
/// read has its payload rendered to be measured, so a claim of large payloads renders at most
/// about one and a half bounds' worth, not `limits.rows` payloads; the slack keeps payloads of
/// mixed sizes from cutting claims short. Unknown sizes read `limits.rows`.
fn rows_to_read(limits: ClaimLimits, mean: Option<usize>) -> usize {
    match mean {
        Some(mean) if mean > 0 => {
            let fit = limits.bytes / mean;
            limits
                .rows
                .min(fit.saturating_add(fit / 2).saturating_add(1))
                .max(1)
        }
        _ => limits.rows.max(1),
    }
}

/// `n` as a bind parameter (PostgreSQL `int8`).
fn int8(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// One field of the windows a read ahead continues, as an array parameter aligned with the
/// claim's partitions (NULL where there is nothing to continue).
fn column<T>(
    follow: &[Option<&NewPosition>],
    field: impl Fn(&NewPosition) -> Option<T>,
) -> Vec<Option<T>> {
    follow.iter().map(|f| f.and_then(&field)).collect()
}

/// A PostgreSQL outbox in one schema.
pub struct PgStore {
    pool: PgPool,
    schema: Schema,
    writer: Writer,
    q: Queries,
    members: Mutex<HashMap<String, MemberState>>,
    parked_cap: i64,
    /// Set once the schema was found at this crate's version (checked at the first `join`).
    checked: tokio::sync::OnceCell<()>,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore")
            .field("schema", &self.schema)
            .finish_non_exhaustive()
    }
}

impl PgStore {
    /// A store over `pool` for the outbox in `schema` (which `migrate` has created).
    pub fn new(pool: PgPool, schema: Schema) -> Self {
        Self {
            writer: Writer::new(&schema),
            q: Queries::new(&schema),
            pool,
            schema,
            members: Mutex::new(HashMap::new()),
            parked_cap: PARKED_CAP,
            checked: tokio::sync::OnceCell::new(),
        }
    }

    /// Sets the parking cap per partition (default [`PARKED_CAP`]).
    pub fn with_parked_cap(mut self, cap: i64) -> Self {
        self.parked_cap = cap.max(1);
        self
    }

    /// The pool, for callers that also write business rows.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The schema.
    pub fn schema(&self) -> &Schema {
        &self.schema
    }

    /// The writer for this schema.
    pub fn writer(&self) -> &Writer {
        &self.writer
    }

    fn state<T>(&self, member: &MemberId, f: impl FnOnce(&mut MemberState) -> T) -> T {
        let mut map = self
            .members
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f(map.entry(member.0.clone()).or_default())
    }

    fn forget(&self, member: &MemberId) {
        self.members
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(member.as_str());
    }

    /// The floor audit of [`Maintenance::rows_below_floor`], on its own: rows a claim would pass
    /// over because they lie at or below their window's seq floor. For benchmarks and checks
    /// that want it more often than maintenance runs.
    pub async fn floor_audit(&self) -> Result<u64> {
        let mut conn = self
            .pool
            .acquire()
            .await
            .map_err(|e| map_sqlx_error("auditing the claims' seq floors", e))?;
        crate::retention::floor_audit(&mut conn, &self.schema).await
    }

    /// Drops, after `older_than`, every segment all positions have passed, whatever the
    /// configured retention. Never drops a segment holding a pending row.
    pub async fn purge(&self, older_than: Duration) -> Result<Maintenance> {
        crate::retention::run(&self.pool, &self.schema, older_than).await
    }

    /// One claim's reads, in one read-only transaction: the due parked messages, then the
    /// windows (continuing those in `follow`, for a read ahead). Changes no member state but
    /// the warning clock.
    async fn read_claim(
        &self,
        member: &MemberId,
        partitions: &[i32],
        limits: ClaimLimits,
        on_failed: OnFailed,
        follow: Option<&HashMap<i16, NewPosition>>,
    ) -> Result<Option<ClaimRead>> {
        let wanted = partitions_param(partitions);
        let (epochs, active, idle_due, mean, parked_parts, busy) = self.state(member, |s| {
            let e: Vec<(i16, i64)> = wanted
                .iter()
                .filter_map(|p| s.epochs.get(p).map(|e| (*p, *e)))
                .collect();
            let idle_due = s
                .last_idle_advance
                .is_none_or(|t| t.elapsed() >= IDLE_ADVANCE_EVERY);
            let owned: Vec<i16> = e.iter().map(|(p, _)| *p).collect();
            // A read ahead never reads the parked table: due parked messages are older work,
            // which `claim_ahead` leaves to a claim of its own.
            let parked = if follow.is_some() {
                Vec::new()
            } else {
                s.parked.due(&owned, on_failed == OnFailed::Block)
            };
            (
                e,
                s.active,
                idle_due,
                s.mean_payload,
                parked,
                s.busy.clone(),
            )
        });
        if epochs.is_empty() || limits.rows == 0 {
            return Ok(None);
        }
        let rows = rows_to_read(limits, mean);
        let (per_partition, partition_limits) = share_batch(rows, &epochs, active, busy.as_ref());
        let block = on_failed == OnFailed::Block;
        let err = |e| map_sqlx_error("claiming pending messages", e);
        let started = Instant::now();
        let waited_before = tracing::enabled!(tracing::Level::DEBUG)
            .then(runqueue_wait)
            .flatten();
        let (mut tx, acquired) = crate::begin::begin_with(&self.pool, CLAIM_BEGIN)
            .await
            .map_err(err)?;
        let began = started.elapsed();
        let mut ticket = Ticket::default();
        // Parked messages first (retries are older work), then the windows with the bytes
        // left: together they stay within the bound, or are one oversized message.
        let (parked, mut measured, parked_read) = if parked_parts.is_empty() {
            (Vec::new(), Measured::default(), None)
        } else {
            let (p, m, next_due) = self
                .read_parked(
                    &mut tx,
                    &parked_parts,
                    rows,
                    limits.bytes,
                    block,
                    &mut ticket,
                )
                .await?;
            (p, m, Some(next_due))
        };
        let parked_bytes: usize = parked.iter().map(|m| m.payload.len()).sum();
        let parked_done = started.elapsed();
        let (mut messages, window_measured) = self
            .read_windows(
                &mut tx,
                WindowRead {
                    epochs: &epochs,
                    per_partition,
                    partition_limits: &partition_limits,
                    rows,
                    block,
                    bytes: limits.bytes.saturating_sub(parked_bytes),
                    first_alone: parked.is_empty(),
                    follow,
                },
                &mut ticket,
            )
            .await?;
        let windows_done = started.elapsed();
        tx.commit().await.map_err(err)?;
        let took = started.elapsed();
        if took >= SLOW_CLAIM {
            // Where a slow claim's time went, so it can be told from the server's statement
            // time (auto_explain) and from waiting on the pool or on this process's CPU.
            tracing::debug!(
                %member,
                took_ms = took.as_secs_f64() * 1e3,
                acquire_ms = acquired.as_secs_f64() * 1e3,
                begin_ms = (began - acquired).as_secs_f64() * 1e3,
                parked_ms = (parked_done - began).as_secs_f64() * 1e3,
                windows_ms = (windows_done - parked_done).as_secs_f64() * 1e3,
                commit_ms = (took - windows_done).as_secs_f64() * 1e3,
                // Summed over this process's threads: time they were ready to run but had no
                // core. Near `took_ms`, the claim waited for the machine, not for the engine.
                cpu_wait_ms = waited_before
                    .zip(runqueue_wait())
                    .map(|(a, b)| b.saturating_sub(a).as_secs_f64() * 1e3),
                rows = messages.len(),
                ahead = follow.is_some(),
                "slow claim"
            );
        }
        measured.add(
            i64::try_from(window_measured.rows).unwrap_or(0),
            i64::try_from(window_measured.bytes).unwrap_or(0),
        );
        messages.extend(parked);
        messages.sort_by_key(|m| m.seq);
        let keep = limits.fit(messages.iter().map(|m| m.payload.len()));
        if messages.len() > keep {
            // Cut the highest seqs: their window rows count as not tried.
            let cut: std::collections::HashSet<i64> =
                messages.drain(keep..).map(|m| m.seq).collect();
            for r in &mut ticket.rows {
                if cut.contains(&r.seq) {
                    r.handed_out = false;
                }
            }
            ticket.parked.retain(|seq, _| !cut.contains(seq));
        }
        if !ticket.full_partitions.is_empty() {
            let warn_now = self.state(member, |s| {
                let due = s
                    .last_cap_warning
                    .is_none_or(|t| t.elapsed() >= Duration::from_secs(60));
                if due {
                    s.last_cap_warning = Some(Instant::now());
                }
                due
            });
            if warn_now {
                tracing::warn!(
                    %member,
                    partitions = ?ticket.full_partitions,
                    cap = self.parked_cap,
                    "partitions hold the parking cap and stopped advancing: a key is stuck \
                     behind a failing message with a long backlog; see `outbox status`"
                );
            }
        }
        let mean_now = (measured.rows > 0)
            .then(|| usize::try_from(measured.bytes / measured.rows).unwrap_or(usize::MAX));
        let active_now = ticket.windows.values().filter(|w| w.found > 0).count();
        ticket.rows.sort_by_key(|r| r.seq);
        Ok(Some(ClaimRead {
            messages,
            ticket,
            parked_read,
            active_now,
            mean_now,
            idle_due,
        }))
    }

    /// What recording `member`'s pending batch with `outcomes` would write, computed now and
    /// written only by [`land_record`](Self::land_record), whenever the caller likes: a record
    /// abandoned at the store deadline that lands late, for tests of compare-and-append. The
    /// pending batch stays pending.
    #[doc(hidden)]
    pub fn hold_record(&self, member: &MemberId, outcomes: &[Outcome]) -> Option<HeldRecord> {
        let plan = self.state(member, |s| {
            s.ticket.as_ref().map(|t| t.plan(outcomes, false))
        })?;
        Some(HeldRecord {
            member: member.clone(),
            plan,
        })
    }

    /// Writes a [`hold_record`](Self::hold_record) now, as the record statement would have;
    /// returns the partitions whose position it appended, with their ids.
    #[doc(hidden)]
    pub async fn land_record(&self, held: &HeldRecord) -> Result<Vec<(i16, i64)>> {
        self.write_plan(&held.member, &held.plan).await
    }

    /// `sql` (the window claim, or an EXPLAIN of it) bound for `read`.
    fn window_query<'q>(
        &self,
        sql: &'q str,
        read: &WindowRead<'_>,
    ) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
        let (parts, eps): (Vec<i16>, Vec<i64>) = read.epochs.iter().copied().unzip();
        let follow: Vec<Option<&NewPosition>> = parts
            .iter()
            .map(|p| {
                read.follow
                    .and_then(|f| f.get(p))
                    .filter(|n| n.cur.is_some())
            })
            .collect();
        let all = int8(read.rows.saturating_add(parts.len()));
        let span = walk_span(read.per_partition);
        sqlx::query(sql)
            .bind(parts)
            .bind(eps)
            .bind(read.per_partition)
            .bind(all)
            .bind(read.block)
            .bind(self.parked_cap)
            .bind(int8(read.bytes))
            .bind(read.first_alone)
            .bind(column(&follow, |n| Some(n.cursor)))
            .bind(column(&follow, |n| n.cur.clone()))
            .bind(column(&follow, |n| n.cur_floor))
            .bind(column(&follow, |n| n.cur_at))
            .bind(span)
            .bind(read.partition_limits.to_vec())
    }

    /// The plan of `member`'s next window claim of `rows` per partition over `partitions`
    /// (its own, as rebalanced), run for real under EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)
    /// with the very statement, parameters and settings a claim uses; `generic`: the generic
    /// plan, which a relay's prepared claim settles on after a few runs, else one planned for
    /// these values. It writes nothing. For tests and benchmarks that check what a claim costs.
    #[doc(hidden)]
    pub async fn explain_claim(
        &self,
        member: &MemberId,
        partitions: &[i32],
        rows: usize,
        generic: bool,
    ) -> Result<serde_json::Value> {
        let wanted = partitions_param(partitions);
        let epochs: Vec<(i16, i64)> = self.state(member, |s| {
            wanted
                .iter()
                .filter_map(|p| s.epochs.get(p).map(|e| (*p, *e)))
                .collect()
        });
        let err = |e| map_sqlx_error("explaining a claim", e);
        let mut tx = self.pool.begin_with(CLAIM_BEGIN).await.map_err(err)?;
        let mode = if generic {
            include_str!("../queries/explain_generic_plan.sql")
        } else {
            include_str!("../queries/explain_custom_plan.sql")
        };
        sqlx::query(mode).execute(&mut *tx).await.map_err(err)?;
        let sql = format!(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {}",
            self.q.claim_window
        );
        let limits = vec![int8(rows); epochs.len()];
        let read = WindowRead {
            epochs: &epochs,
            per_partition: int8(rows),
            partition_limits: &limits,
            rows: rows.saturating_mul(epochs.len()),
            block: true,
            bytes: usize::MAX >> 1,
            first_alone: true,
            follow: None,
        };
        let plan: serde_json::Value = self
            .window_query(&sql, &read)
            .fetch_one(&mut *tx)
            .await
            .and_then(|r| r.try_get(0))
            .map_err(err)?;
        tx.commit().await.map_err(err)?;
        Ok(plan)
    }

    /// Reads the window claim's rows into a ticket and the messages to hand out, one row at a
    /// time (a row's payload is in memory once, as the message's). Returns the messages and
    /// what was measured.
    async fn read_windows(
        &self,
        tx: &mut sqlx::PgConnection,
        read: WindowRead<'_>,
        ticket: &mut Ticket,
    ) -> Result<(Vec<Message>, Measured)> {
        let err = |e| map_sqlx_error("claiming from the outbox windows", e);
        let mut rows = self
            .window_query(&self.q.claim_window, &read)
            .fetch(&mut *tx);
        let mut messages = Vec::new();
        let mut returned: HashMap<i16, i64> = HashMap::new();
        let mut measured = (0i64, 0i64);
        while let Some(r) = rows.try_next().await.map_err(err)? {
            let partition: i16 = r.try_get("partition").map_err(err)?;
            if let std::collections::hash_map::Entry::Vacant(slot) = ticket.windows.entry(partition)
            {
                let found: i64 = r.try_get("window_rows").map_err(err)?;
                let full: bool = r.try_get("parked_full").map_err(err)?;
                let scan_to: Option<i64> = r.try_get("scan_to").map_err(err)?;
                let limit = read
                    .epochs
                    .iter()
                    .position(|(p, _)| *p == partition)
                    .and_then(|i| read.partition_limits.get(i))
                    .copied()
                    .unwrap_or(read.per_partition);
                let short = found < limit && !full;
                if full {
                    ticket.full_partitions.push(partition);
                }
                slot.insert(Window {
                    partition,
                    epoch: r.try_get("epoch").map_err(err)?,
                    prev_id: r.try_get("prev_id").map_err(err)?,
                    parked: r.try_get("parked").map_err(err)?,
                    done: r.try_get("done").map_err(err)?,
                    done_bound: r.try_get("done_bound").map_err(err)?,
                    done_floor: r.try_get("done_floor").map_err(err)?,
                    done_at: r.try_get("done_at").map_err(err)?,
                    published: r.try_get("published").map_err(err)?,
                    cur: r.try_get("cur").map_err(err)?,
                    cur_bound: r.try_get("cur_bound").map_err(err)?,
                    cur_floor: r.try_get("cur_floor").map_err(err)?,
                    cur_at: r.try_get("cur_at").map_err(err)?,
                    cursor: r.try_get("cursor").map_err(err)?,
                    found,
                    // A partition at the parking cap read nothing: never close its window. A
                    // walk that stopped at the end of its span did not reach the window's end.
                    exhausted_if_all_read: short && scan_to.is_none(),
                    read_to: scan_to.filter(|_| short),
                });
            }
            let Some(seq) = r.try_get::<Option<i64>, _>("seq").map_err(err)? else {
                continue;
            };
            *returned.entry(partition).or_default() += 1;
            let held: bool = r.try_get("held").map_err(err)?;
            if !held {
                // Running totals: the last row's are the claim's.
                measured = (
                    r.try_get("handed_upto").map_err(err)?,
                    r.try_get::<Option<i64>, _>("bytes_upto")
                        .map_err(err)?
                        .unwrap_or(0),
                );
            }
            // No payload: past the byte bound, not handed out (nor is anything after it).
            let payload: Option<String> = r.try_get("payload").map_err(err)?;
            let key: String = r.try_get("aggregate_id").map_err(err)?;
            let txid: String = r.try_get("txid").map_err(err)?;
            ticket.rows.push(WindowRow {
                partition,
                seq,
                txid,
                key: key.clone(),
                held,
                handed_out: !held && payload.is_some(),
            });
            if let (false, Some(payload)) = (held, payload) {
                messages.push(Message {
                    seq,
                    id: r.try_get("id").map_err(err)?,
                    aggregate_type: r.try_get("aggregate_type").map_err(err)?,
                    aggregate_id: key,
                    event_type: r.try_get("event_type").map_err(err)?,
                    payload: payload.into(),
                    headers: r.try_get("headers").map_err(err)?,
                    topic: r.try_get("topic").map_err(err)?,
                    created_at: r.try_get("created_at").map_err(err)?,
                    attempts: 0,
                });
            }
        }
        // A partition whose rows the statement's overall LIMIT cut is not read to its end.
        for w in ticket.windows.values_mut() {
            if returned.get(&w.partition).copied().unwrap_or(0) < w.found {
                w.exhausted_if_all_read = false;
                w.read_to = None;
            }
        }
        let mut m = Measured::default();
        m.add(measured.0, measured.1);
        Ok((messages, m))
    }

    /// Reads the due parked messages within `rows` and `bytes` (the first one alone whatever
    /// its size), one row at a time.
    async fn read_parked(
        &self,
        tx: &mut sqlx::PgConnection,
        parts: &[i16],
        rows: usize,
        bytes: usize,
        block: bool,
        ticket: &mut Ticket,
    ) -> Result<(Vec<Message>, Measured, Option<DateTime<Utc>>)> {
        let err = |e| map_sqlx_error("claiming parked messages", e);
        let mut keyed: std::collections::HashSet<i16> = std::collections::HashSet::new();
        let mut stream = sqlx::query(&self.q.claim_parked)
            .bind(parts)
            .bind(int8(rows))
            .bind(block)
            .bind(int8(rows))
            .bind(int8(bytes))
            .bind(true)
            .fetch(&mut *tx);
        let mut messages = Vec::new();
        let mut measured = (0i64, 0i64);
        let mut next_due = None;
        while let Some(r) = stream.try_next().await.map_err(err)? {
            next_due = r.try_get("next_due").map_err(err)?;
            if let Some(p) = r.try_get::<Option<Vec<i16>>, _>("keyed").map_err(err)? {
                keyed.extend(p);
            }
            let Some(partition) = r.try_get::<Option<i16>, _>("partition").map_err(err)? else {
                continue; // the `next_due` row alone: nothing parked is due
            };
            measured = (
                r.try_get("handed_upto").map_err(err)?,
                r.try_get("bytes_upto").map_err(err)?,
            );
            let m = Message {
                seq: r.try_get("seq").map_err(err)?,
                id: r.try_get("id").map_err(err)?,
                aggregate_type: r.try_get("aggregate_type").map_err(err)?,
                aggregate_id: r.try_get("aggregate_id").map_err(err)?,
                event_type: r.try_get("event_type").map_err(err)?,
                payload: r.try_get::<String, _>("payload").map_err(err)?.into(),
                headers: r.try_get("headers").map_err(err)?,
                topic: r.try_get("topic").map_err(err)?,
                created_at: r.try_get("created_at").map_err(err)?,
                attempts: r.try_get("attempts").map_err(err)?,
            };
            ticket.parked.insert(
                m.seq,
                ParkedRow {
                    partition,
                    key: m.aggregate_id.clone(),
                },
            );
            messages.push(m);
        }
        drop(stream);
        if block {
            ticket.parked_empty = parts
                .iter()
                .copied()
                .filter(|p| !keyed.contains(p))
                .collect();
        }
        let mut m = Measured::default();
        m.add(measured.0, measured.1);
        Ok((messages, m, next_due))
    }

    /// Runs the fenced, compare-and-append record statement for `plan`; returns the partitions
    /// whose position was appended, with the new positions' ids.
    ///
    /// If this call is dropped while the statement runs (the relay's store deadline), the
    /// statement is cancelled on the server and its connection closed, never returned to the
    /// pool: an abandoned record should not keep running beside its retry. Should it commit
    /// anyway, compare-and-append makes it harmless (see `record.sql`).
    async fn write_plan(&self, member: &MemberId, plan: &Plan) -> Result<Vec<(i16, i64)>> {
        let err = |e| map_sqlx_error("recording publish results", e);
        let mut conn = self.pool.acquire().await.map_err(err)?;
        let pid: i32 = sqlx::query_scalar(include_str!("../queries/backend_pid.sql"))
            .fetch_one(&mut *conn)
            .await
            .map_err(err)?;
        let mut running = CancelOnDrop {
            pool: self.pool.clone(),
            pid,
            conn: Some(conn),
        };
        let (fp, fe): (Vec<i16>, Vec<i64>) = plan.fence.iter().copied().unzip();
        let pos = &plan.positions;
        let park = &plan.park;
        let ret = &plan.retried;
        let appended = sqlx::query_as::<_, (i16, i64)>(&self.q.record)
            .bind(member.as_str())
            .bind(&fp)
            .bind(&fe)
            .bind(pos.iter().map(|p| p.partition).collect::<Vec<_>>())
            .bind(pos.iter().map(|p| p.epoch).collect::<Vec<_>>())
            .bind(pos.iter().map(|p| p.done.as_str()).collect::<Vec<_>>())
            .bind(
                pos.iter()
                    .map(|p| p.done_bound.as_deref())
                    .collect::<Vec<_>>(),
            )
            .bind(pos.iter().map(|p| p.done_floor).collect::<Vec<_>>())
            .bind(pos.iter().map(|p| p.done_at).collect::<Vec<_>>())
            .bind(pos.iter().map(|p| p.cur.as_deref()).collect::<Vec<_>>())
            .bind(
                pos.iter()
                    .map(|p| p.cur_bound.as_deref())
                    .collect::<Vec<_>>(),
            )
            .bind(pos.iter().map(|p| p.cur_floor).collect::<Vec<_>>())
            .bind(pos.iter().map(|p| p.cur_at).collect::<Vec<_>>())
            .bind(pos.iter().map(|p| p.cursor).collect::<Vec<_>>())
            .bind(pos.iter().map(|p| p.published).collect::<Vec<_>>())
            .bind(park.iter().map(|k| k.partition).collect::<Vec<_>>())
            .bind(park.iter().map(|k| k.txid.as_str()).collect::<Vec<_>>())
            .bind(park.iter().map(|k| k.seq).collect::<Vec<_>>())
            .bind(park.iter().map(|k| k.state).collect::<Vec<_>>())
            .bind(park.iter().map(|k| k.attempts).collect::<Vec<_>>())
            .bind(park.iter().map(|k| k.delay_secs).collect::<Vec<_>>())
            .bind(park.iter().map(|k| k.error.as_deref()).collect::<Vec<_>>())
            .bind(ret.iter().map(|r| r.partition).collect::<Vec<_>>())
            .bind(ret.iter().map(|r| r.seq).collect::<Vec<_>>())
            .bind(ret.iter().map(|r| r.outcome).collect::<Vec<_>>())
            .bind(ret.iter().map(|r| r.delay_secs).collect::<Vec<_>>())
            .bind(ret.iter().map(|r| r.error.as_deref()).collect::<Vec<_>>())
            .bind(pos.iter().map(|p| p.prev_id).collect::<Vec<_>>())
            .bind(pos.iter().map(|p| p.parked).collect::<Vec<_>>())
            .fetch_all(running.conn())
            .await
            .map_err(err);
        running.finished();
        appended
    }

    fn remember_epochs(&self, member: &MemberId, owned: &[(i16, i64)]) {
        self.state(member, |s| s.epochs = owned.iter().copied().collect());
    }
}

/// Puts a taken ticket back for its member when dropped armed: on an error, or when the call
/// that holds it is abandoned.
struct TicketGuard<'a> {
    store: &'a PgStore,
    member: &'a MemberId,
    ticket: Option<Ticket>,
}

impl TicketGuard<'_> {
    /// The batch is recorded: nothing to put back.
    fn disarm(mut self) {
        self.ticket = None;
    }
}

impl Drop for TicketGuard<'_> {
    fn drop(&mut self) {
        if let Some(ticket) = self.ticket.take() {
            self.store.state(self.member, |s| {
                // A newer claim's ticket wins: this batch is then handed out again.
                if s.ticket.is_none() {
                    s.ticket = Some(ticket);
                }
            });
        }
    }
}

/// A record computed but not written (see [`PgStore::hold_record`]).
#[doc(hidden)]
pub struct HeldRecord {
    member: MemberId,
    plan: Plan,
}

/// A statement's connection that, when dropped before [`finished`](Self::finished) (the call
/// running the statement was abandoned), cancels the statement on the server and closes the
/// connection instead of returning it to the pool. Detached first, so the cancel can never hit
/// another statement run on a reused connection.
struct CancelOnDrop {
    pool: PgPool,
    pid: i32,
    conn: Option<sqlx::pool::PoolConnection<sqlx::Postgres>>,
}

impl CancelOnDrop {
    fn conn(&mut self) -> &mut sqlx::PgConnection {
        // Present until `finished` or drop, which both take `self`'s last use.
        self.conn
            .as_deref_mut()
            .unwrap_or_else(|| unreachable!("the connection is taken only when finished"))
    }

    /// The statement ended (with a result or an error): the connection goes back to the pool.
    fn finished(mut self) {
        self.conn = None;
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        let Some(conn) = self.conn.take() else { return };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (pool, pid) = (self.pool.clone(), self.pid);
        let conn = conn.detach();
        runtime.spawn(async move {
            let cancelled = sqlx::query(include_str!("../queries/cancel_backend.sql"))
                .bind(pid)
                .execute(&pool)
                .await;
            if let Err(error) = cancelled {
                tracing::debug!(pid, %error, "could not cancel an abandoned statement");
            }
            drop(conn);
        });
    }
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

fn partitions_param(p: &[i32]) -> Vec<i16> {
    p.iter().filter_map(|&x| i16::try_from(x).ok()).collect()
}

#[async_trait]
impl Store for PgStore {
    async fn join(&self, member: &MemberId) -> Result<()> {
        // Before a first claim: tables of another version, or a sequence that cannot serve as
        // the claims' floor, must stop the relay with what to do, not lose rows.
        self.checked
            .get_or_try_init(|| crate::migrate::check_schema(&self.pool, &self.schema))
            .await?;
        sqlx::query(&self.q.heartbeat)
            .bind(member.as_str())
            .execute(&self.pool)
            .await
            .map_err(|e| map_sqlx_error("registering a relay member", e))?;
        Ok(())
    }

    async fn rebalance(&self, member: &MemberId, lease: Duration) -> Result<Vec<i32>> {
        let err = |what: &'static str| {
            move |e| map_sqlx_error(&format!("rebalancing partitions: {what}"), e)
        };
        sqlx::query(&self.q.heartbeat)
            .bind(member.as_str())
            .execute(&self.pool)
            .await
            .map_err(err("heartbeat"))?;
        let live: i64 = sqlx::query_scalar(&self.q.reap_members)
            .bind(secs(lease))
            .fetch_one(&self.pool)
            .await
            .map_err(err("counting members"))?;
        let fair = PARTITIONS.div_ceil(live.max(1) as usize);
        let mut owned: Vec<(i16, i64)> = sqlx::query_as(&self.q.renew_due)
            .bind(member.as_str())
            .bind(secs(lease))
            .fetch_all(&self.pool)
            .await
            .map_err(err("renewing leases"))?;
        owned.sort_unstable();
        if owned.len() > fair {
            let extra: Vec<i16> = owned.split_off(fair).into_iter().map(|(p, _)| p).collect();
            sqlx::query(&self.q.give_back)
                .bind(member.as_str())
                .bind(&extra)
                .execute(&self.pool)
                .await
                .map_err(err("giving back partitions"))?;
        } else if owned.len() < fair {
            let got: Vec<(i16, i64)> = sqlx::query_as(&self.q.acquire)
                .bind(member.as_str())
                .bind(secs(lease))
                .bind((fair - owned.len()) as i64)
                .fetch_all(&self.pool)
                .await
                .map_err(err("acquiring partitions"))?;
            owned.extend(got);
            owned.sort_unstable();
        }
        self.remember_epochs(member, &owned);
        Ok(owned.into_iter().map(|(p, _)| i32::from(p)).collect())
    }

    async fn renew(&self, member: &MemberId, lease: Duration) -> Result<usize> {
        let rows: Vec<(i16, i64)> = sqlx::query_as(&self.q.renew)
            .bind(member.as_str())
            .bind(secs(lease))
            .fetch_all(&self.pool)
            .await
            .map_err(|e| map_sqlx_error("renewing partition leases", e))?;
        self.remember_epochs(member, &rows);
        Ok(rows.len())
    }

    async fn claim(
        &self,
        member: &MemberId,
        partitions: &[i32],
        limits: ClaimLimits,
        on_failed: OnFailed,
    ) -> Result<Vec<Message>> {
        // A claim replaces whatever was read ahead.
        self.state(member, |s| s.ahead = None);
        let Some(mut read) = self
            .read_claim(member, partitions, limits, on_failed, None)
            .await?
        else {
            return Ok(Vec::new());
        };
        let messages = std::mem::take(&mut read.messages);
        if messages.is_empty() {
            // Nothing to send, but held rows must be parked and passed windows recorded,
            // else the next claim would read them again.
            let idle = read.idle_due;
            let plan = read.ticket.plan(&[], idle);
            self.state(member, |s| {
                s.remember(&read);
                if let Some(next_due) = read.parked_read {
                    s.parked.read(on_failed == OnFailed::Block, next_due);
                }
                s.ticket = None;
                if idle {
                    s.last_idle_advance = Some(Instant::now());
                }
            });
            if !plan.is_empty() {
                let appended = self.write_plan(member, &plan).await?;
                self.state(member, |s| s.note_recorded(&plan, &appended));
            }
            return Ok(messages);
        }
        self.state(member, |s| {
            s.remember(&read);
            if let Some(next_due) = read.parked_read {
                s.parked.read(on_failed == OnFailed::Block, next_due);
            }
            s.ticket = Some(read.ticket);
        });
        Ok(messages)
    }

    fn more_to_read(&self, member: &MemberId) -> bool {
        self.state(member, |s| s.more_to_read)
    }

    async fn claim_ahead(
        &self,
        member: &MemberId,
        partitions: &[i32],
        limits: ClaimLimits,
        on_failed: OnFailed,
    ) -> Result<Vec<Message>> {
        let pending = self.state(member, |s| {
            s.ahead = None;
            s.ticket.clone()
        });
        // Only a batch that parks nothing and leaves every window it read open can be followed
        // before it is recorded: a closed window's next `done_bound` is the id of the
        // transaction that records it, and parked rows change which keys are held.
        let Some(expected) = pending.as_ref().and_then(Ticket::follow_on) else {
            return Ok(Vec::new());
        };
        // Parked messages that may be due are older work: leave them to a claim of its own.
        let parked_due = self.state(member, |s| {
            let owned: Vec<i16> = s.epochs.keys().copied().collect();
            !s.parked
                .due(&owned, on_failed == OnFailed::Block)
                .is_empty()
        });
        if parked_due {
            return Ok(Vec::new());
        }
        let follow: HashMap<i16, NewPosition> =
            expected.iter().map(|p| (p.partition, p.clone())).collect();
        let Some(mut read) = self
            .read_claim(member, partitions, limits, on_failed, Some(&follow))
            .await?
        else {
            return Ok(Vec::new());
        };
        // An oversized message, which a claim lets through alone, waits for a claim of its own:
        // the batch being published and this one must fit the bytes the relay holds together.
        let bytes: usize = read.messages.iter().map(|m| m.payload.len()).sum();
        if read.messages.is_empty() || !read.ticket.parked.is_empty() || bytes > limits.bytes {
            return Ok(Vec::new());
        }
        for w in read.ticket.windows.values_mut() {
            if let Some(p) = follow.get(&w.partition) {
                // The running total as the pending batch records it (the table may not hold
                // that position yet), and the window's bound when it had one. A window the
                // pending batch opened has none yet (its recording transaction's id becomes
                // it): this batch's record then sets its own id, later but as valid, since
                // any id assigned after `cur` was taken bounds it (the next window's A1 range
                // is a batch longer, nothing more).
                w.published = p.published;
                w.parked = p.parked;
                if p.cur_bound.is_some() {
                    w.cur_bound = p.cur_bound.clone();
                }
            }
        }
        let messages = std::mem::take(&mut read.messages);
        self.state(member, |s| {
            s.remember(&read);
            s.ahead = Some(Ahead {
                ticket: read.ticket,
                expected,
                recorded: false,
            });
        });
        Ok(messages)
    }

    async fn adopt_ahead(&self, member: &MemberId) -> bool {
        self.state(member, |s| {
            match s.ahead.take() {
                // Still owned at the epochs it was read at (a lease lost and taken back
                // meanwhile has a new epoch, and a new owner may have moved on).
                Some(a)
                    if a.recorded
                        && s.ticket.is_none()
                        && a.ticket
                            .windows
                            .values()
                            .all(|w| s.epochs.get(&w.partition) == Some(&w.epoch)) =>
                {
                    s.ticket = Some(a.ticket);
                    true
                }
                _ => false,
            }
        })
    }

    async fn complete(&self, member: &MemberId, outcomes: &[Outcome]) -> Result<u64> {
        let (ticket, idle) = self.state(member, |s| {
            // Quiet partitions' empty windows are recorded as passed with the batch, now and
            // then, so that retention moves on under a steady backlog too; not while a batch
            // read ahead waits on this record being exactly what it assumed.
            let idle = s.ahead.is_none()
                && s.last_idle_advance
                    .is_none_or(|t| t.elapsed() >= IDLE_ADVANCE_EVERY);
            (s.ticket.take(), idle)
        });
        let Some(ticket) = ticket else {
            return Ok(0);
        };
        let plan = ticket.plan(outcomes, idle);
        if plan.is_empty() {
            return Ok(0);
        }
        // Until the record statement succeeds, the ticket goes back on an error *or* when this
        // call is dropped (the relay's store deadline), so the retry can record the batch. The
        // dropped statement is cancelled; if it committed anyway, the retry's positions follow
        // the same predecessors and append nothing, and nothing else is written twice
        // (compare-and-append, `record.sql`).
        let guard = TicketGuard {
            store: self,
            member,
            ticket: Some(ticket),
        };
        let appended = self.write_plan(member, &plan).await?;
        guard.disarm();
        // A batch read ahead may follow this one only if it was recorded exactly as that read
        // assumed: the same positions, all of them written, nothing parked or retried. It then
        // follows the positions just appended.
        let in_full = plan.park.is_empty()
            && plan.retried.is_empty()
            && plan
                .positions
                .iter()
                .all(|p| appended.iter().any(|(a, _)| *a == p.partition));
        self.state(member, |s| {
            s.note_recorded(&plan, &appended);
            if idle {
                s.last_idle_advance = Some(Instant::now());
            }
            if let Some(a) = s.ahead.as_mut() {
                a.recorded = in_full && a.expected == plan.positions;
                for (partition, id) in &appended {
                    if let Some(w) = a.ticket.windows.get_mut(partition) {
                        w.prev_id = *id;
                    }
                }
            }
        });
        Ok(appended
            .iter()
            .map(|(p, _)| plan.applied.get(p).copied().unwrap_or(0))
            .sum())
    }

    async fn release(&self, member: &MemberId) -> Result<()> {
        sqlx::query(&self.q.release)
            .bind(member.as_str())
            .execute(&self.pool)
            .await
            .map_err(|e| map_sqlx_error("releasing partitions", e))?;
        self.forget(member);
        Ok(())
    }

    async fn listen(&self, wake: watch::Sender<u64>) -> Result<()> {
        let mut listener = PgListener::connect_with(&self.pool)
            .await
            .map_err(|e| map_sqlx_error("opening the LISTEN connection", e))?;
        listener
            .listen(&self.schema.channel())
            .await
            .map_err(|e| map_sqlx_error("LISTEN on the outbox channel", e))?;
        // Anything inserted before LISTEN took effect is found by this first wake-up.
        wake.send_modify(|v| *v = v.wrapping_add(1));
        loop {
            // `try_recv` reconnects by itself and answers `None` after a reconnect, when
            // notifications may have been missed: wake the workers then too.
            let _ = listener
                .try_recv()
                .await
                .map_err(|e| map_sqlx_error("waiting for notifications", e))?;
            wake.send_modify(|v| *v = v.wrapping_add(1));
        }
    }

    async fn stats(&self) -> Result<Stats> {
        let r = read_backlog_row(
            &self.pool,
            sqlx::query(&self.q.stats)
                .bind(PENDING_COUNT_CAP)
                .bind(self.parked_cap),
        )
        .await
        .map_err(|e| map_sqlx_error("reading outbox counts", e))?;
        let get = |name: &str| -> Result<i64> {
            r.try_get::<i64, _>(name)
                .map_err(|e| map_sqlx_error("reading outbox counts", e))
        };
        let members = sqlx::query(&self.q.members)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| map_sqlx_error("reading relay members", e))?
            .into_iter()
            .map(|m| -> std::result::Result<MemberStatus, sqlx::Error> {
                Ok(MemberStatus {
                    member: m.try_get("member")?,
                    heartbeat_at: m.try_get::<DateTime<Utc>, _>("heartbeat_at")?,
                    partitions: m.try_get("partitions")?,
                    circuit: m.try_get("circuit")?,
                    sink_error: m.try_get("sink_error")?,
                })
            })
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| map_sqlx_error("reading relay members", e))?;
        let blocked = sqlx::query_as::<_, (String, String, i32, Option<String>)>(&self.q.blocked)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| map_sqlx_error("reading blocked keys", e))?
            .into_iter()
            .map(|(key, state, attempts, last_error)| BlockedKey {
                key,
                state,
                attempts,
                last_error,
            })
            .collect();
        Ok(Stats {
            pending: get("pending")?,
            oldest_pending_age_seconds: r
                .try_get::<Option<f64>, _>("oldest_pending_age_seconds")
                .map_err(|e| map_sqlx_error("reading outbox counts", e))?,
            failed: get("failed")?,
            published: get("published")?,
            retrying: get("retrying")?,
            blocked_keys: get("blocked_keys")?,
            parked: get("parked")?,
            partitions_at_parking_cap: get("partitions_at_parking_cap")?,
            waiting: get("waiting")?,
            oldest_waiting_age_seconds: r
                .try_get::<Option<f64>, _>("oldest_waiting_age_seconds")
                .map_err(|e| map_sqlx_error("reading outbox counts", e))?,
            members,
            blocked,
        })
    }

    async fn pending_by_type(&self, cap: i64) -> Result<Vec<PendingCell>> {
        let err = |e| map_sqlx_error("reading the backlog by type", e);
        read_backlog(
            &self.pool,
            sqlx::query(&self.q.status_pending)
                .bind(cap)
                .bind(STATUS_GROUPS),
        )
        .await
        .map_err(err)?
        .iter()
        .map(|r| {
            Ok(PendingCell {
                partition: r.try_get("partition")?,
                aggregate_type: r.try_get("aggregate_type")?,
                event_type: r.try_get("event_type")?,
                topic: r.try_get("topic")?,
                pending: r.try_get("pending")?,
                oldest_pending_age_seconds: r.try_get("oldest_pending_age_seconds")?,
            })
        })
        .collect::<std::result::Result<Vec<_>, sqlx::Error>>()
        .map_err(err)
    }

    async fn status_detail(&self) -> Result<StatusDetail> {
        let err = |e| map_sqlx_error("reading the status detail", e);
        let pending = self.pending_by_type(PENDING_COUNT_CAP).await?;
        let partitions = sqlx::query(&self.q.status_partitions)
            .fetch_all(&self.pool)
            .await
            .map_err(err)?
            .iter()
            .map(|r| {
                let position = match r.try_get::<Option<DateTime<Utc>>, _>("done_at")? {
                    Some(done_at) => Some(Position {
                        done_xmin: r.try_get("done_xmin")?,
                        done_xmax: r.try_get("done_xmax")?,
                        cursor: r.try_get("cursor")?,
                        done_at,
                        published: r.try_get("published")?,
                    }),
                    None => None,
                };
                Ok(PartitionStatus {
                    partition: r.try_get("partition")?,
                    owner: r.try_get("owner")?,
                    epoch: r.try_get("epoch")?,
                    lease_until: r.try_get("lease_until")?,
                    pending: 0,
                    oldest_pending_age_seconds: None,
                    parked: r.try_get("parked")?,
                    failed: r.try_get("failed")?,
                    position,
                })
            })
            .collect::<std::result::Result<Vec<_>, sqlx::Error>>()
            .map_err(err)?;
        let r = sqlx::query(&self.q.status_retention)
            .fetch_one(&self.pool)
            .await
            .map_err(err)?;
        let retention = retention_status(&r).map_err(err)?;
        Ok(StatusDetail {
            partitions,
            retention: Some(retention),
            pending,
            cdc_slots: crate::cdc::setup::slots(&self.pool, &self.schema).await?,
            binlog_sequencer: None,
        })
    }

    async fn gauges(&self) -> Result<outbox_core::Gauges> {
        crate::gauges::read(&self.pool, &self.schema, self.parked_cap).await
    }

    async fn ping(&self) -> Result<()> {
        crate::gauges::ping(&self.pool).await
    }

    async fn report_health(
        &self,
        member: &MemberId,
        circuit: &str,
        sink_error: Option<&str>,
    ) -> Result<()> {
        sqlx::query(&self.q.report_health)
            .bind(member.as_str())
            .bind(circuit)
            .bind(sink_error)
            .execute(&self.pool)
            .await
            .map_err(|e| map_sqlx_error("recording the circuit state", e))?;
        Ok(())
    }

    async fn maintain(&self, retention: Duration) -> Result<Maintenance> {
        crate::retention::run(&self.pool, &self.schema, retention).await
    }

    async fn failed(&self, limit: usize) -> Result<Vec<FailedMessage>> {
        let err = |e| map_sqlx_error("listing failed messages", e);
        sqlx::query(&self.q.failed)
            .bind(int8(limit))
            .fetch_all(&self.pool)
            .await
            .map_err(err)?
            .iter()
            .map(|r| {
                Ok(FailedMessage {
                    id: r.try_get("id").map_err(err)?,
                    seq: r.try_get("seq").map_err(err)?,
                    aggregate_type: r.try_get("aggregate_type").map_err(err)?,
                    aggregate_id: r.try_get("aggregate_id").map_err(err)?,
                    event_type: r.try_get("event_type").map_err(err)?,
                    attempts: r.try_get("attempts").map_err(err)?,
                    last_error: r.try_get("last_error").map_err(err)?,
                    created_at: r.try_get("created_at").map_err(err)?,
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
        let rows = sqlx::query(&self.q.failed_matching)
            .bind(filter.key.as_deref())
            .bind(filter.kind.as_deref().map(str::to_lowercase))
            .bind(filter.error.as_deref().map(str::to_lowercase))
            .bind(after)
            .bind(int8(limit))
            .fetch_all(&self.pool)
            .await
            .map_err(err)?;
        let mut page = FailedPage::default();
        for r in &rows {
            page.total = r.try_get("total").map_err(err)?;
            let Some(id) = r.try_get::<Option<uuid::Uuid>, _>("id").map_err(err)? else {
                continue;
            };
            page.messages.push(FailedMessage {
                id,
                seq: r.try_get("seq").map_err(err)?,
                aggregate_type: r.try_get("aggregate_type").map_err(err)?,
                aggregate_id: r.try_get("aggregate_id").map_err(err)?,
                event_type: r.try_get("event_type").map_err(err)?,
                attempts: r.try_get("attempts").map_err(err)?,
                last_error: r.try_get("last_error").map_err(err)?,
                created_at: r.try_get("created_at").map_err(err)?,
            });
        }
        Ok(page)
    }

    async fn redrive(&self, scope: &RedriveScope, reason: &str) -> Result<u64> {
        let (all, ids) = match scope {
            RedriveScope::All => (true, Vec::new()),
            RedriveScope::Ids(ids) => (false, ids.clone()),
        };
        let released: Vec<uuid::Uuid> = sqlx::query_scalar(&self.q.redrive)
            .bind(all)
            .bind(&ids)
            .bind(outbox_core::redact::sanitize(reason))
            .fetch_all(&self.pool)
            .await
            .map_err(|e| map_sqlx_error("redriving failed messages", e))?;
        Ok(released.len() as u64)
    }

    async fn journey(
        &self,
        query: &outbox_core::JourneyQuery,
        limit: usize,
    ) -> Result<Vec<outbox_core::Journey>> {
        crate::journey::journey(&self.pool, &self.schema, query, limit).await
    }

    async fn insert(&self, messages: &[NewMessage]) -> Result<()> {
        let (mut tx, _) = crate::begin::begin_with(&self.pool, "BEGIN")
            .await
            .map_err(|e| map_sqlx_error("begin", e))?;
        self.writer.enqueue_many(&mut tx, messages).await?;
        tx.commit().await.map_err(|e| map_sqlx_error("commit", e))
    }
}

/// Groups of pending messages (partition, aggregate type, event type, topic) `status_detail`
/// reads at most, oldest first.
const STATUS_GROUPS: i64 = 10_000;

/// The retention part of `outbox status` from the row of `status_retention.sql`: the oldest
/// segment, why it is kept, and what pins the horizon. A running transaction pins it when its
/// id is at or below the horizon (every position taken while it runs stops there); otherwise
/// the partition with the oldest position does.
fn retention_status(
    r: &sqlx::postgres::PgRow,
) -> std::result::Result<RetentionStatus, sqlx::Error> {
    let next_xid: i64 = r.try_get("next_xid")?;
    let horizon: Option<i64> = r.try_get("horizon")?;
    let oldest_segment = match r.try_get::<Option<String>, _>("oldest_name")? {
        Some(name) => Some(Segment {
            name,
            lo: r.try_get("oldest_lo")?,
            hi: r.try_get("oldest_hi")?,
            closed_at: r.try_get("oldest_closed_at")?,
            bytes: r.try_get("oldest_bytes")?,
        }),
        None => None,
    };
    let kept_because = oldest_segment.as_ref().map(|s| {
        if s.hi > next_xid || s.closed_at.is_none() {
            KeptBecause::Open
        } else if horizon.is_none_or(|h| h < s.hi) {
            KeptBecause::Horizon
        } else {
            KeptBecause::Retention
        }
    });
    let running: Option<i64> = r.try_get("running_xid")?;
    let pinned_by = match (running, horizon) {
        (Some(xid), Some(h)) if xid <= h => Some(RetentionPin::Transaction {
            xid,
            pid: r.try_get("running_pid")?,
            age_seconds: r.try_get("running_age_seconds")?,
            state: r.try_get("running_state")?,
            application_name: r.try_get("running_application")?,
            database: r.try_get("running_database")?,
            user: r.try_get("running_user")?,
            prepared: r.try_get("running_prepared")?,
        }),
        (_, Some(_)) => Some(RetentionPin::Partition {
            partition: r.try_get("pin_partition")?,
            owner: r.try_get("pin_owner")?,
            done_at: r.try_get("pin_done_at")?,
            behind_seconds: r.try_get("pin_behind_seconds")?,
        }),
        (_, None) => None,
    };
    Ok(RetentionStatus {
        segments: r.try_get("segments")?,
        bytes: r.try_get("bytes")?,
        next_xid,
        horizon,
        oldest_segment,
        kept_because,
        pinned_by,
    })
}

impl From<PgStore> for std::sync::Arc<dyn Store> {
    fn from(s: PgStore) -> Self {
        std::sync::Arc::new(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_goes_to_the_partitions_that_had_rows_and_twice_an_even_share_to_the_others() {
        let epochs: Vec<(i16, i64)> = (0..32).map(|p| (p, 1)).collect();
        // Before the first claim: every partition may fill the batch.
        let (per, limits) = share_batch(1000, &epochs, 1, None);
        assert_eq!(per, 1000);
        assert!(limits.iter().all(|l| *l == 1000));
        // One hot key: its partition gets the batch, the 31 others 63 rows each, so a backlog
        // appearing in all of them at once is read as 2,953 rows, not 32,000.
        let hot = HashSet::from([5]);
        let (per, limits) = share_batch(1000, &epochs, 1, Some(&hot));
        assert_eq!((per, limits[5], limits[6]), (1000, 1000, 63));
        assert_eq!(limits.iter().sum::<i64>(), 1000 + 31 * 63);
        // Idle (nothing found last time): an even share, twice over, everywhere.
        let (_, limits) = share_batch(1000, &epochs, 1, Some(&HashSet::new()));
        assert!(limits.iter().all(|l| *l == 63));
        // Sixteen busy partitions: a slice each (rounded up), the rest no more than that.
        let busy: HashSet<i16> = (0..16).collect();
        let (per, limits) = share_batch(1000, &epochs, 16, Some(&busy));
        assert_eq!((per, limits[0], limits[20]), (63, 63, 63));
    }

    #[test]
    fn claims_read_about_what_the_byte_bound_holds() {
        let limits = ClaimLimits {
            rows: 1000,
            bytes: 16 << 20,
        };
        assert_eq!(rows_to_read(limits, None), 1000, "sizes unknown yet");
        assert_eq!(
            rows_to_read(limits, Some(1 << 20)),
            25,
            "16 fit, 8 spare, 1"
        );
        assert_eq!(rows_to_read(limits, Some(100)), 1000, "the row bound wins");
        assert_eq!(rows_to_read(limits, Some(64 << 20)), 1, "one oversized row");
        assert_eq!(rows_to_read(ClaimLimits::rows(7), Some(1 << 20)), 7);
    }
}
