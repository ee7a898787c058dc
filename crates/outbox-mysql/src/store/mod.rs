//! The store's work ([`Engine`], held by the relay as [`MysqlStore`]): the relay's view of a
//! MySQL/MariaDB outbox (partition leases, claims by
//! position, fenced compare-and-set records, parking, failed and redrive).
//!
//! Here: the store's work and its `Store` impl. Beside it, with the same names as PostgreSQL's
//! and SQLite's stores: `connect` (URLs, the pool), `claim` (a claim's reads and the member
//! state they use), `complete` (the fenced statements that record a batch), `inspect` (counts,
//! members, failed messages); and `shielded` ([`MysqlStore`], which runs each call to its end
//! on a task of its own).
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
use crate::queries::{Positions, Queries};
use crate::schema::Schema;
use crate::ticket::{assemble, Fence, ParkedKey, PartPlan, Ticket, WindowRead};

mod claim;
mod complete;
mod connect;
mod inspect;
mod shielded;

use claim::*;
pub use connect::*;
pub use shielded::MysqlStore;

/// Parked messages a partition may hold before it stops advancing (its other keys wait too)
/// until they drain: a bound on the parked table, whatever a broker outage lasts.
pub const PARKED_CAP: i64 = 10_000;

/// How long an insert on the binlog route waits for its rows to be sequenced.
const INSERT_SEQUENCED: Duration = Duration::from_secs(30);

/// The store's work on MySQL 8.0.29+ / MariaDB 10.6+; the relay holds it as
/// [`MysqlStore`](crate::MysqlStore), which runs each call on a task of its own.
pub(crate) struct Engine {
    pool: MySqlPool,
    schema: Schema,
    q: Queries,
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

impl Engine {
    /// A store over `pool` (see [`connect_pool`]) for the outbox in database `schema`.
    pub fn new(pool: MySqlPool, schema: Schema) -> Self {
        Self {
            q: Queries::new(&schema, Positions::Trigger),
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
                self.complete_plans(member, &plans).await?;
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
        let settled = self.complete_plans(member, &plans).await?;
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
        self.read_stats().await
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
        sqlx::query(include_str!("../../queries/ping.sql"))
            .execute(&self.pool)
            .await
            .map_err(|e| map_sqlx_error("pinging MySQL", e))?;
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
            .render(include_str!("../../queries/redrive_audit.sql"));
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
        let mut update = QueryBuilder::<MySql>::new(
            self.schema
                .render(include_str!("../../queries/redrive.sql")),
        );
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
            let seq: i64 = sqlx::query_scalar(
                &self
                    .schema
                    .render(include_str!("../../queries/seq_of_id.sql")),
            )
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
