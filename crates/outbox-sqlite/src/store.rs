//! [`SqliteStore`]: the relay's view of a SQLite outbox (partition leases, claims, marks).
//!
//! Times the relay compares are unix milliseconds taken from this process's clock
//! ([`chrono::Utc::now`]) and bound into each statement, so no SQL does clock arithmetic.
//! Members sharing one database file share one machine, hence one clock.

use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, SecondsFormat, Utc};
use futures::TryStreamExt;
use outbox_core::status::{PartitionStatus, PendingCell, StatusDetail};
use outbox_core::store::MemberStatus;
use outbox_core::{
    BlockedKey, ClaimLimits, Error, ErrorKind, FailedFilter, FailedMessage, FailedPage,
    Maintenance, MemberId, Message, NewMessage, OnFailed, Outcome, RedriveScope, Result, Stats,
    Store,
};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteRow, SqliteSynchronous,
};
use sqlx::{Row, SqlitePool};
use tokio::sync::watch;

use crate::error::map_sqlx_error;
use crate::tables::Tables;
use crate::writer::Writer;

/// Number of relay partitions; fixed by the migration that computes `outbox.partition`.
pub const PARTITIONS: usize = 64;

/// The database file a URL without a path (`sqlite://`, `sqlite:`) names, relative to the
/// working directory.
pub const DEFAULT_PATH: &str = "./outbox.db";

/// How long a statement waits for another connection's write lock before failing with
/// `SQLITE_BUSY` (mapped to [`ErrorKind::Timeout`]).
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Connections per pool. WAL lets readers (claims, stats) run beside the one writer; writers
/// queue on the file lock whatever the pool size.
const MAX_CONNECTIONS: u32 = 8;

const CLAIM: &str = include_str!("../queries/claim.sql");
const COMPLETE: &str = include_str!("../queries/complete.sql");
const HEARTBEAT: &str = include_str!("../queries/heartbeat.sql");
const BEAT: &str = include_str!("../queries/beat.sql");
const REAP_MEMBERS: &str = include_str!("../queries/reap_members.sql");
const COUNT_MEMBERS: &str = include_str!("../queries/count_members.sql");
const RENEW: &str = include_str!("../queries/renew.sql");
const GIVE_BACK: &str = include_str!("../queries/give_back.sql");
const ACQUIRE: &str = include_str!("../queries/acquire.sql");
const RELEASE_PARTITIONS: &str = include_str!("../queries/release_partitions.sql");
const RELEASE_MEMBER: &str = include_str!("../queries/release_member.sql");
const STATS: &str = include_str!("../queries/stats.sql");
const MEMBERS: &str = include_str!("../queries/members.sql");
const BLOCKED: &str = include_str!("../queries/blocked.sql");
const REPORT_HEALTH: &str = include_str!("../queries/report_health.sql");
const FAILED: &str = include_str!("../queries/failed.sql");
const FAILED_MATCHING: &str = include_str!("../queries/failed_matching.sql");
const REDRIVE_AUDIT: &str = include_str!("../queries/redrive_audit.sql");
const REDRIVE: &str = include_str!("../queries/redrive.sql");
const STATUS_PENDING: &str = include_str!("../queries/status_pending.sql");
const STATUS_PARTITIONS: &str = include_str!("../queries/status_partitions.sql");

/// Groups of pending messages (partition, aggregate type, event type, topic) `status_detail`
/// reads at most, oldest first.
const STATUS_GROUPS: i64 = 10_000;

/// Every statement, rendered for one table set.
#[derive(Debug)]
struct Queries {
    claim: String,
    complete: String,
    heartbeat: String,
    beat: String,
    reap_members: String,
    count_members: String,
    renew: String,
    give_back: String,
    acquire: String,
    release_partitions: String,
    release_member: String,
    stats: String,
    members: String,
    blocked: String,
    report_health: String,
    failed: String,
    failed_matching: String,
    redrive_audit: String,
    redrive: String,
    purge: String,
    status_pending: String,
    status_partitions: String,
}

impl Queries {
    fn new(t: &Tables) -> Self {
        Self {
            claim: t.render(CLAIM),
            complete: t.render(COMPLETE),
            heartbeat: t.render(HEARTBEAT),
            beat: t.render(BEAT),
            reap_members: t.render(REAP_MEMBERS),
            count_members: t.render(COUNT_MEMBERS),
            renew: t.render(RENEW),
            give_back: t.render(GIVE_BACK),
            acquire: t.render(ACQUIRE),
            release_partitions: t.render(RELEASE_PARTITIONS),
            release_member: t.render(RELEASE_MEMBER),
            stats: t.render(STATS),
            members: t.render(MEMBERS),
            blocked: t.render(BLOCKED),
            report_health: t.render(REPORT_HEALTH),
            failed: t.render(FAILED),
            failed_matching: t.render(FAILED_MATCHING),
            redrive_audit: t.render(REDRIVE_AUDIT),
            redrive: t.render(REDRIVE),
            purge: t.render("DELETE FROM outbox WHERE state = 'published' AND published_at < ?1"),
            status_pending: t.render(STATUS_PENDING),
            status_partitions: t.render(STATUS_PARTITIONS),
        }
    }
}

/// Connection options for `url`: `sqlite://path`, `sqlite:path`, or `sqlite://` with no path
/// meaning [`DEFAULT_PATH`]; a query string (`?mode=ro`, …) is kept. The file is created if
/// missing; connections use WAL, `synchronous = FULL` (a committed row survives a power
/// loss), a [`BUSY_TIMEOUT`] and foreign keys.
pub fn connect_options(url: &str) -> Result<SqliteConnectOptions> {
    let rest = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))
        .ok_or_else(|| {
            Error::config(format!(
                "database URL `{}` is not a SQLite URL; use sqlite://path",
                outbox_core::redact::url(url)
            ))
        })?;
    let (path, query) = match rest.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (rest, None),
    };
    let path = if path.is_empty() { DEFAULT_PATH } else { path };
    let normalised = match query {
        Some(query) => format!("sqlite://{path}?{query}"),
        None => format!("sqlite://{path}"),
    };
    let options = SqliteConnectOptions::from_str(&normalised).map_err(|e| {
        map_sqlx_error(
            &format!("database URL `{}`", outbox_core::redact::url(url)),
            e,
        )
    })?;
    Ok(options
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Full)
        .busy_timeout(BUSY_TIMEOUT)
        .foreign_keys(true))
}

/// The database file a SQLite URL names (see [`connect_options`]; `sqlite://` alone is
/// [`DEFAULT_PATH`]).
pub fn database_path(url: &str) -> Result<std::path::PathBuf> {
    Ok(connect_options(url)?.get_filename().to_path_buf())
}

/// Deletes the database file at `path` with its `-wal` and `-shm` companions (for scratch
/// databases: demos, checks). Missing files are not an error.
pub fn remove_database(path: &std::path::Path) {
    for ext in ["", "-wal", "-shm"] {
        let mut p = path.as_os_str().to_owned();
        p.push(ext);
        let _ = std::fs::remove_file(p);
    }
}

/// Opens a pool to the SQLite file `url` names (see [`connect_options`]), creating the file if
/// missing, with [`MAX_CONNECTIONS`] connections. Fails at once if the file cannot be opened.
pub async fn connect_pool(url: &str) -> Result<SqlitePool> {
    connect_pool_sized(url, MAX_CONNECTIONS).await
}

/// [`connect_pool`] with at most `max_connections` connections: the one place a SQLite pool is
/// set up (WAL, `synchronous = FULL`, the busy timeout, a 10 s acquire timeout), whoever opens
/// the file (the outbox, the inbox, the demo's ledger).
pub async fn connect_pool_sized(url: &str, max_connections: u32) -> Result<SqlitePool> {
    let options = connect_options(url)?;
    SqlitePoolOptions::new()
        .max_connections(max_connections.max(1))
        .acquire_timeout(Duration::from_secs(10))
        .connect_with(options)
        .await
        .map_err(|e| {
            map_sqlx_error(
                &format!("opening SQLite database {}", outbox_core::redact::url(url)),
                e,
            )
        })
}

/// Begins a `BEGIN IMMEDIATE` transaction (the file's write lock, taken at once) on `pool`,
/// whether or not the caller is still waiting when it has begun.
///
/// sqlx runs a SQLite connection's BEGIN on the connection's worker thread. A caller dropped
/// after the worker began but before it took the answer (a publish or store deadline, a
/// shutdown) left no `Transaction` to end it: the connection went back to the pool inside a
/// transaction nobody could commit or roll back, holding the write lock, and every writer of
/// the file failed with "database is locked" from then on (an inbox processor on a loaded
/// machine stopped for good that way). Begun in a task of its own, the BEGIN always ends as a
/// `Transaction`, which rolls back when dropped.
pub async fn begin_immediate(
    pool: &SqlitePool,
) -> std::result::Result<sqlx::Transaction<'static, sqlx::Sqlite>, sqlx::Error> {
    let pool = pool.clone();
    match tokio::spawn(async move { pool.begin_with("BEGIN IMMEDIATE").await }).await {
        Ok(begun) => begun,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        // The runtime is shutting down.
        Err(_) => Err(sqlx::Error::PoolClosed),
    }
}

/// Per member: claimed row seq -> its partition's epoch at claim time.
type ClaimedEpochs = std::collections::HashMap<String, std::collections::HashMap<i64, i64>>;

/// A SQLite outbox: the tables `migrate` created in one database file.
///
/// Several relay processes may share the file: partition ownership changes only inside
/// `BEGIN IMMEDIATE` transactions, which SQLite runs one at a time, so a partition never has
/// two owners with unexpired leases.
#[derive(Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
    writer: Writer,
    tables: Tables,
    q: std::sync::Arc<Queries>,
    /// Per member, the epoch each claimed row's partition had at claim time (the fencing token
    /// its outcome is recorded under).
    claimed: std::sync::Arc<std::sync::Mutex<ClaimedEpochs>>,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore").finish_non_exhaustive()
    }
}

impl SqliteStore {
    /// A store over `pool` (whose database `migrate` has prepared), serving the `outbox`
    /// tables.
    pub fn new(pool: SqlitePool) -> Self {
        Self::with_tables(pool, Tables::default())
    }

    /// A store over `pool` serving the table set `tables` (which [`crate::migrate_tables`]
    /// has prepared), e.g. a queue of its own beside the application's outbox in one file.
    pub fn with_tables(pool: SqlitePool, tables: Tables) -> Self {
        Self {
            pool,
            writer: Writer::for_tables(&tables),
            q: std::sync::Arc::new(Queries::new(&tables)),
            tables,
            claimed: std::sync::Arc::default(),
        }
    }

    /// The table set this store serves.
    pub fn tables(&self) -> &Tables {
        &self.tables
    }

    /// The pool, for callers that also write business rows.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// The writer.
    pub fn writer(&self) -> &Writer {
        &self.writer
    }
}

fn now_ms() -> i64 {
    Utc::now().timestamp_millis()
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn partitions_json(p: &[i32]) -> String {
    let list: Vec<String> = p.iter().map(i32::to_string).collect();
    format!("[{}]", list.join(","))
}

fn malformed(what: String) -> Error {
    Error::new(ErrorKind::Malformed, what)
}

fn message_from_row(r: &SqliteRow) -> Result<Message> {
    let get = |e| map_sqlx_error("reading claimed messages", e);
    let seq: i64 = r.try_get("seq").map_err(get)?;
    let id: String = r.try_get("id").map_err(get)?;
    let id = uuid::Uuid::parse_str(&id)
        .map_err(|e| malformed(format!("outbox row {seq}: id `{id}` is not a UUID: {e}")))?;
    let created_ms: Option<i64> = r.try_get("created_ms").map_err(get)?;
    let created_at = created_ms
        .and_then(DateTime::from_timestamp_millis)
        .ok_or_else(|| malformed(format!("outbox row {seq}: created_at is not a time")))?;
    Ok(Message {
        seq,
        id,
        aggregate_type: r.try_get("aggregate_type").map_err(get)?,
        aggregate_id: r.try_get("aggregate_id").map_err(get)?,
        event_type: r.try_get("event_type").map_err(get)?,
        payload: r.try_get::<String, _>("payload").map_err(get)?.into(),
        headers: r.try_get("headers").map_err(get)?,
        topic: r.try_get("topic").map_err(get)?,
        created_at,
        attempts: r.try_get("attempts").map_err(get)?,
    })
}

#[async_trait]
impl Store for SqliteStore {
    async fn join(&self, member: &MemberId) -> Result<()> {
        sqlx::query(&self.q.heartbeat)
            .bind(member.as_str())
            .bind(now_ms())
            .execute(&self.pool)
            .await
            .map_err(|e| map_sqlx_error("registering a relay member", e))?;
        Ok(())
    }

    async fn rebalance(&self, member: &MemberId, lease: Duration) -> Result<Vec<i32>> {
        let err = |what: &'static str| {
            move |e| map_sqlx_error(&format!("rebalancing partitions: {what}"), e)
        };
        // One writer at a time: everything below reads and changes ownership atomically, so two
        // members (or processes) cannot both take a partition.
        let mut tx = begin_immediate(&self.pool).await.map_err(err("begin"))?;
        // Taken after the lock: waiting for it must not shorten the lease we grant.
        let now = now_ms();
        let lease = millis(lease);
        let until = now.saturating_add(lease);
        let cutoff = now.saturating_sub(lease);
        sqlx::query(&self.q.heartbeat)
            .bind(member.as_str())
            .bind(now)
            .execute(&mut *tx)
            .await
            .map_err(err("heartbeat"))?;
        sqlx::query(&self.q.reap_members)
            .bind(cutoff)
            .execute(&mut *tx)
            .await
            .map_err(err("forgetting silent members"))?;
        let live: i64 = sqlx::query_scalar(&self.q.count_members)
            .bind(cutoff)
            .fetch_one(&mut *tx)
            .await
            .map_err(err("counting members"))?;
        let fair = PARTITIONS.div_ceil(usize::try_from(live).unwrap_or(1).max(1));
        let mut owned: Vec<i32> = sqlx::query_scalar(&self.q.renew)
            .bind(member.as_str())
            .bind(until)
            .fetch_all(&mut *tx)
            .await
            .map_err(err("renewing leases"))?;
        owned.sort_unstable();
        if owned.len() > fair {
            let extra = owned.split_off(fair);
            sqlx::query(&self.q.give_back)
                .bind(member.as_str())
                .bind(partitions_json(&extra))
                .execute(&mut *tx)
                .await
                .map_err(err("giving back partitions"))?;
        } else if owned.len() < fair {
            let want = i64::try_from(fair - owned.len()).unwrap_or(i64::MAX);
            let got: Vec<i32> = sqlx::query_scalar(&self.q.acquire)
                .bind(member.as_str())
                .bind(until)
                .bind(now)
                .bind(want)
                .fetch_all(&mut *tx)
                .await
                .map_err(err("acquiring partitions"))?;
            owned.extend(got);
            owned.sort_unstable();
        }
        tx.commit().await.map_err(err("commit"))?;
        Ok(owned)
    }

    async fn renew(&self, member: &MemberId, lease: Duration) -> Result<usize> {
        let err = |e| map_sqlx_error("renewing partition leases", e);
        let mut tx = begin_immediate(&self.pool).await.map_err(err)?;
        let now = now_ms();
        sqlx::query(&self.q.beat)
            .bind(member.as_str())
            .bind(now)
            .execute(&mut *tx)
            .await
            .map_err(err)?;
        let rows: Vec<i32> = sqlx::query_scalar(&self.q.renew)
            .bind(member.as_str())
            .bind(now.saturating_add(millis(lease)))
            .fetch_all(&mut *tx)
            .await
            .map_err(err)?;
        tx.commit().await.map_err(err)?;
        Ok(rows.len())
    }

    async fn claim(
        &self,
        member: &MemberId,
        partitions: &[i32],
        limits: ClaimLimits,
        on_failed: OnFailed,
    ) -> Result<Vec<Message>> {
        if partitions.is_empty() || limits.rows == 0 {
            return Ok(Vec::new());
        }
        // Row by row: each payload is in memory once, as its message's.
        let mut rows = sqlx::query(&self.q.claim)
            .bind(member.as_str())
            .bind(partitions_json(partitions))
            .bind(now_ms())
            .bind(i64::try_from(limits.rows).unwrap_or(i64::MAX))
            .bind(on_failed == OnFailed::Block)
            .bind(i64::try_from(limits.bytes).unwrap_or(i64::MAX))
            .fetch(&self.pool);
        let mut epochs = std::collections::HashMap::new();
        let mut messages = Vec::new();
        while let Some(r) = rows
            .try_next()
            .await
            .map_err(|e| map_sqlx_error("claiming pending messages", e))?
        {
            let m = message_from_row(&r)?;
            let epoch: i64 = r
                .try_get("epoch")
                .map_err(|e| map_sqlx_error("reading claimed messages", e))?;
            epochs.insert(m.seq, epoch);
            messages.push(m);
        }
        self.claimed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(member.0.clone(), epochs);
        Ok(messages)
    }

    async fn complete(&self, member: &MemberId, outcomes: &[Outcome]) -> Result<u64> {
        if outcomes.is_empty() {
            return Ok(0);
        }
        let epochs = self
            .claimed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(member.as_str())
            .cloned()
            .unwrap_or_default();
        // An outcome for a row this member did not claim has no epoch: it is not recorded.
        let rows: Vec<(i64, &str, Option<&str>, i64, i64)> = outcomes
            .iter()
            .map(|o| {
                let epoch = epochs.get(&o.seq()).copied().unwrap_or(-1);
                match o {
                    Outcome::Published { seq } => (*seq, "published", None, 0, epoch),
                    Outcome::Retry { seq, error, delay } => {
                        (*seq, "pending", Some(error.as_str()), millis(*delay), epoch)
                    }
                    Outcome::Deferred { seq, error, delay } => (
                        *seq,
                        "deferred",
                        Some(error.as_str()),
                        millis(*delay),
                        epoch,
                    ),
                    Outcome::Failed { seq, error } => {
                        (*seq, "failed", Some(error.as_str()), 0, epoch)
                    }
                }
            })
            .collect();
        let rows = serde_json::to_string(&rows).map_err(|e| {
            Error::with_source(ErrorKind::Other, "encoding publish results as JSON", e)
        })?;
        let now = Utc::now();
        let done = sqlx::query(&self.q.complete)
            .bind(member.as_str())
            .bind(rows)
            .bind(now.timestamp_millis())
            .bind(now.to_rfc3339_opts(SecondsFormat::Millis, true))
            .execute(&self.pool)
            .await
            .map_err(|e| map_sqlx_error("recording publish results", e))?;
        Ok(done.rows_affected())
    }

    async fn release(&self, member: &MemberId) -> Result<()> {
        let err = |e| map_sqlx_error("releasing partitions", e);
        self.claimed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(member.as_str());
        let mut tx = begin_immediate(&self.pool).await.map_err(err)?;
        sqlx::query(&self.q.release_member)
            .bind(member.as_str())
            .execute(&mut *tx)
            .await
            .map_err(err)?;
        sqlx::query(&self.q.release_partitions)
            .bind(member.as_str())
            .execute(&mut *tx)
            .await
            .map_err(err)?;
        tx.commit().await.map_err(err)
    }

    /// SQLite has no notifications: returns `Ok(())` at once and the relay polls.
    async fn listen(&self, _wake: watch::Sender<u64>) -> Result<()> {
        Ok(())
    }

    async fn stats(&self) -> Result<Stats> {
        let err = |e| map_sqlx_error("reading outbox counts", e);
        let now = now_ms();
        let r = sqlx::query(&self.q.stats)
            .bind(now)
            .fetch_one(&self.pool)
            .await
            .map_err(err)?;
        let members = sqlx::query(&self.q.members)
            .bind(now)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| map_sqlx_error("reading relay members", e))?
            .iter()
            .map(|m| {
                let get = |e| map_sqlx_error("reading relay members", e);
                let member: String = m.try_get("member").map_err(get)?;
                let beat: i64 = m.try_get("heartbeat_at").map_err(get)?;
                let heartbeat_at = DateTime::from_timestamp_millis(beat).ok_or_else(|| {
                    malformed(format!(
                        "member {member}: heartbeat_at {beat} is not a time"
                    ))
                })?;
                Ok(MemberStatus {
                    partitions: m.try_get("partitions").map_err(get)?,
                    circuit: m.try_get("circuit").map_err(get)?,
                    sink_error: m.try_get("sink_error").map_err(get)?,
                    member,
                    heartbeat_at,
                })
            })
            .collect::<Result<Vec<_>>>()?;
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
            pending: r.try_get("pending").map_err(err)?,
            oldest_pending_age_seconds: r.try_get("oldest_pending_age_seconds").map_err(err)?,
            failed: r.try_get("failed").map_err(err)?,
            published: r.try_get("published").map_err(err)?,
            retrying: r.try_get("retrying").map_err(err)?,
            blocked_keys: r.try_get("blocked_keys").map_err(err)?,
            parked: r.try_get::<i64, _>("retrying").map_err(err)?
                + r.try_get::<i64, _>("failed").map_err(err)?,
            partitions_at_parking_cap: 0,
            waiting: r.try_get("waiting").map_err(err)?,
            oldest_waiting_age_seconds: r.try_get("oldest_waiting_age_seconds").map_err(err)?,
            members,
            blocked,
        })
    }

    /// Deletes published rows older than `retention` (SQLite reuses the freed pages; there is
    /// no horizon to bloat). Pending and failed rows are never touched.
    async fn maintain(&self, retention: Duration) -> Result<Maintenance> {
        let cutoff = now_ms() - i64::try_from(retention.as_millis()).unwrap_or(i64::MAX / 2);
        let cutoff = DateTime::from_timestamp_millis(cutoff)
            .unwrap_or(DateTime::<Utc>::MIN_UTC)
            .to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
        let done = sqlx::query(&self.q.purge)
            .bind(cutoff)
            .execute(&self.pool)
            .await
            .map_err(|e| map_sqlx_error("deleting published rows past retention", e))?;
        Ok(Maintenance {
            rows_deleted: done.rows_affected(),
            ..Maintenance::default()
        })
    }

    /// Partitions with their owners and the backlog by type; no retention figures (SQLite
    /// deletes published rows by age, and has no horizon to hold) and no positions (rows are
    /// marked).
    async fn status_detail(&self) -> Result<StatusDetail> {
        let err = |e| map_sqlx_error("reading the status detail", e);
        let now = now_ms();
        let pending = sqlx::query(&self.q.status_pending)
            .bind(now)
            .bind(STATUS_GROUPS)
            .fetch_all(&self.pool)
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
            .map_err(err)?;
        let partitions = sqlx::query(&self.q.status_partitions)
            .bind(now)
            .fetch_all(&self.pool)
            .await
            .map_err(err)?
            .iter()
            .map(|r| {
                let lease: Option<i64> = r.try_get("lease_until")?;
                Ok(PartitionStatus {
                    partition: r.try_get("partition")?,
                    owner: r.try_get("owner")?,
                    epoch: r.try_get("epoch")?,
                    lease_until: lease.and_then(DateTime::from_timestamp_millis),
                    pending: 0,
                    oldest_pending_age_seconds: None,
                    parked: r.try_get("parked")?,
                    failed: r.try_get("failed")?,
                    position: None,
                })
            })
            .collect::<std::result::Result<Vec<_>, sqlx::Error>>()
            .map_err(err)?;
        Ok(StatusDetail {
            partitions,
            retention: None,
            pending,
            cdc_slots: Vec::new(),
            binlog_sequencer: None,
        })
    }

    async fn gauges(&self) -> Result<outbox_core::Gauges> {
        crate::gauges::read(&self.pool, &self.tables, now_ms()).await
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

    async fn failed(&self, limit: usize) -> Result<Vec<FailedMessage>> {
        let err = |e| map_sqlx_error("listing failed messages", e);
        let rows = sqlx::query(&self.q.failed)
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .fetch_all(&self.pool)
            .await
            .map_err(err)?;
        rows.iter()
            .map(|r| {
                let m = message_from_row(r)?;
                Ok(FailedMessage {
                    id: m.id,
                    seq: m.seq,
                    aggregate_type: m.aggregate_type,
                    aggregate_id: m.aggregate_id,
                    event_type: m.event_type,
                    attempts: m.attempts,
                    last_error: r.try_get("last_error").map_err(err)?,
                    created_at: m.created_at,
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
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .fetch_all(&self.pool)
            .await
            .map_err(err)?;
        let mut page = FailedPage::default();
        for r in &rows {
            page.total = r.try_get("total").map_err(err)?;
            if r.try_get::<Option<i64>, _>("seq").map_err(err)?.is_none() {
                continue;
            }
            let m = message_from_row(r)?;
            page.messages.push(FailedMessage {
                id: m.id,
                seq: m.seq,
                aggregate_type: m.aggregate_type,
                aggregate_id: m.aggregate_id,
                event_type: m.event_type,
                attempts: m.attempts,
                last_error: r.try_get("last_error").map_err(err)?,
                created_at: m.created_at,
            });
        }
        Ok(page)
    }

    async fn redrive(&self, scope: &RedriveScope, reason: &str) -> Result<u64> {
        let err = |e| map_sqlx_error("redriving failed messages", e);
        let (all, ids) = match scope {
            RedriveScope::All => (true, Vec::new()),
            RedriveScope::Ids(ids) => (false, ids.iter().map(uuid::Uuid::to_string).collect()),
        };
        let ids = serde_json::Value::from(ids).to_string();
        let mut tx = begin_immediate(&self.pool).await.map_err(err)?;
        sqlx::query(&self.q.redrive_audit)
            .bind(all)
            .bind(&ids)
            .bind(outbox_core::redact::sanitize(reason))
            .execute(&mut *tx)
            .await
            .map_err(err)?;
        let n = sqlx::query(&self.q.redrive)
            .bind(all)
            .bind(&ids)
            .execute(&mut *tx)
            .await
            .map_err(err)?
            .rows_affected();
        tx.commit().await.map_err(err)?;
        Ok(n)
    }

    async fn insert(&self, messages: &[NewMessage]) -> Result<()> {
        let mut tx = begin_immediate(&self.pool)
            .await
            .map_err(|e| map_sqlx_error("begin", e))?;
        self.writer.enqueue_many(&mut tx, messages).await?;
        tx.commit().await.map_err(|e| map_sqlx_error("commit", e))
    }
}

impl From<SqliteStore> for std::sync::Arc<dyn Store> {
    fn from(s: SqliteStore) -> Self {
        std::sync::Arc::new(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn database_path_follows_the_url_and_remove_database_takes_the_companions() {
        assert_eq!(
            database_path("sqlite://").unwrap(),
            std::path::Path::new(DEFAULT_PATH)
        );
        assert_eq!(
            database_path("sqlite:/tmp/x.db?mode=rwc").unwrap(),
            std::path::Path::new("/tmp/x.db")
        );
        let dir = std::env::temp_dir().join(format!("outbox-remove-db-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let db = dir.join("a.db");
        for ext in ["", "-wal", "-shm"] {
            std::fs::write(format!("{}{ext}", db.display()), b"x").unwrap();
        }
        remove_database(&db);
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
        std::fs::remove_dir_all(&dir).ok();
    }

    fn filename(url: &str) -> String {
        connect_options(url)
            .unwrap()
            .get_filename()
            .to_string_lossy()
            .into_owned()
    }

    #[test]
    fn urls_name_files() {
        assert_eq!(
            filename("sqlite:///var/lib/app/outbox.db"),
            "/var/lib/app/outbox.db"
        );
        assert_eq!(filename("sqlite://data/app.db"), "data/app.db");
        assert_eq!(filename("sqlite:app.db"), "app.db");
        assert_eq!(filename("sqlite://"), DEFAULT_PATH);
        assert_eq!(filename("sqlite:"), DEFAULT_PATH);
        assert_eq!(filename("sqlite://?mode=rwc"), DEFAULT_PATH);
    }

    #[test]
    fn other_schemes_are_config_errors() {
        let e = connect_options("postgres://u:hunter2@db/x").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Config);
        assert!(!e.to_string().contains("hunter2"));
    }

    #[test]
    fn partitions_encode_as_a_json_array() {
        assert_eq!(partitions_json(&[]), "[]");
        assert_eq!(partitions_json(&[0, 7, 63]), "[0,7,63]");
    }
}
