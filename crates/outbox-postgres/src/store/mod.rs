//! [`PgStore`]: the relay's view of a PostgreSQL outbox (partition leases, window claims,
//! fenced positions, parked messages, retention).
//!
//! The message table is insert-only: nothing here updates or deletes a message row. See
//! `migrations/0003_engine_v2.sql` and `docs/engine.md` for the model.
//!
//! Here: the store and its `Store` impl. Beside it: `connect` (sessions, the pool, connection
//! errors), `claim` (a claim's reads and the member state they use), `complete` (the fenced
//! statement that records a batch's outcomes, and its guards), `inspect` (the backlog's
//! figures, the status detail and retention's state).

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

mod claim;
mod complete;
mod connect;
mod inspect;

use claim::*;
pub use complete::HeldCompletion;
use complete::*;
pub use connect::*;
pub(crate) use inspect::*;

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
const CLAIM_BEGIN: &str = include_str!("../../queries/claim_begin.sql");

/// How a read of the backlog's figures begins (the status counts, the backlog by type, a
/// scrape's gauges): read-only, JIT off, bitmap scans and sorts priced out, as a claim's. Each
/// part of pending_rows.sql walks an ordered index range and stops at its limit; on a table
/// without statistics yet (a backlog just written) the planner otherwise chose a bitmap scan of
/// each partition's whole range, and a scrape in the middle of a drain then read every pending
/// row's heap tuple (1.3 s for 400,000 rows, against 0.2 s walking the index).
pub(crate) const READ_BEGIN: &str = include_str!("../../queries/read_begin.sql");

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
        &include_str!("../../queries/pending_rows.sql").replace("{cols}", cols),
    )
}

impl Queries {
    fn new(schema: &Schema) -> Self {
        Self {
            claim_window: schema.render(include_str!("../../queries/claim_window.sql")),
            claim_parked: schema.render(include_str!("../../queries/claim_parked.sql")),
            record: schema.render(include_str!("../../queries/record.sql")),
            heartbeat: schema.render(include_str!("../../queries/heartbeat.sql")),
            reap_members: schema.render(include_str!("../../queries/reap_members.sql")),
            renew: schema.render(include_str!("../../queries/renew.sql")),
            renew_due: schema.render(include_str!("../../queries/renew_due.sql")),
            give_back: schema.render(include_str!("../../queries/give_back.sql")),
            acquire: schema.render(include_str!("../../queries/acquire.sql")),
            release: schema.render(include_str!("../../queries/release.sql")),
            stats: schema.render(&with_pending_rows(
                include_str!("../../queries/stats.sql"),
                ", o.created_at",
            )),
            members: schema.render(include_str!("../../queries/members.sql")),
            blocked: schema.render(include_str!("../../queries/blocked.sql")),
            report_health: schema.render(include_str!("../../queries/report_health.sql")),
            failed: schema.render(include_str!("../../queries/failed.sql")),
            failed_matching: schema.render(include_str!("../../queries/failed_matching.sql")),
            redrive: schema.render(include_str!("../../queries/redrive.sql")),
            status_pending: schema.render(&with_pending_rows(
                include_str!("../../queries/status_pending.sql"),
                ", o.created_at, o.aggregate_type, o.event_type, o.topic",
            )),
            status_partitions: schema.render(include_str!("../../queries/status_partitions.sql")),
            status_retention: schema.render(include_str!("../../queries/status_retention.sql")),
        }
    }
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
                let appended = self.complete_plan(member, &plan).await?;
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
        let appended = self.complete_plan(member, &plan).await?;
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
        self.read_stats().await
    }

    async fn pending_by_type(&self, cap: i64) -> Result<Vec<PendingCell>> {
        self.read_pending_by_type(cap).await
    }

    async fn status_detail(&self) -> Result<StatusDetail> {
        self.read_status_detail().await
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
