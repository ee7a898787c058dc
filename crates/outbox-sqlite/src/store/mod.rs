//! [`SqliteStore`]: the relay's view of a SQLite outbox (partition leases, claims, completion of
//! the claimed rows).
//!
//! Here: the store and its `Store` impl. Beside it, with the same names as PostgreSQL's and
//! MySQL's stores: `connect` (URLs, the pool, `BEGIN IMMEDIATE`), `claim` (a claim's read),
//! `complete` (recording a batch's outcomes), `inspect` (counts, the status detail, failed
//! messages).
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

mod claim;
mod complete;
mod connect;
mod inspect;

use claim::*;
pub use connect::*;

/// Number of relay partitions; fixed by the migration that computes `outbox.partition`.
pub const PARTITIONS: usize = 64;

const CLAIM: &str = include_str!("../../queries/claim.sql");
const COMPLETE: &str = include_str!("../../queries/complete.sql");
const HEARTBEAT: &str = include_str!("../../queries/heartbeat.sql");
const BEAT: &str = include_str!("../../queries/beat.sql");
const REAP_MEMBERS: &str = include_str!("../../queries/reap_members.sql");
const COUNT_MEMBERS: &str = include_str!("../../queries/count_members.sql");
const RENEW: &str = include_str!("../../queries/renew.sql");
const GIVE_BACK: &str = include_str!("../../queries/give_back.sql");
const ACQUIRE: &str = include_str!("../../queries/acquire.sql");
const RELEASE_PARTITIONS: &str = include_str!("../../queries/release_partitions.sql");
const RELEASE_MEMBER: &str = include_str!("../../queries/release_member.sql");
const STATS: &str = include_str!("../../queries/stats.sql");
const MEMBERS: &str = include_str!("../../queries/members.sql");
const BLOCKED: &str = include_str!("../../queries/blocked.sql");
const REPORT_HEALTH: &str = include_str!("../../queries/report_health.sql");
const FAILED: &str = include_str!("../../queries/failed.sql");
const FAILED_MATCHING: &str = include_str!("../../queries/failed_matching.sql");
const REDRIVE_AUDIT: &str = include_str!("../../queries/redrive_audit.sql");
const REDRIVE: &str = include_str!("../../queries/redrive.sql");
const STATUS_PENDING: &str = include_str!("../../queries/status_pending.sql");
const STATUS_PARTITIONS: &str = include_str!("../../queries/status_partitions.sql");
const PURGE: &str = include_str!("../../queries/purge.sql");

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
            purge: t.render(PURGE),
            status_pending: t.render(STATUS_PENDING),
            status_partitions: t.render(STATUS_PARTITIONS),
        }
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
        self.read_claim(member, partitions, limits, on_failed).await
    }

    async fn complete(&self, member: &MemberId, outcomes: &[Outcome]) -> Result<u64> {
        self.complete_batch(member, outcomes).await
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
        self.read_stats().await
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
        self.read_status_detail().await
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
        self.read_failed(limit).await
    }

    async fn failed_matching(
        &self,
        filter: &FailedFilter,
        after: Option<i64>,
        limit: usize,
    ) -> Result<FailedPage> {
        self.read_failed_matching(filter, after, limit).await
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
    fn partitions_encode_as_a_json_array() {
        assert_eq!(partitions_json(&[]), "[]");
        assert_eq!(partitions_json(&[0, 7, 63]), "[0,7,63]");
    }
}
