//! [`PgStore`]: the relay's view of a PostgreSQL outbox (partition leases, claims, marks).

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use outbox_core::store::MemberStatus;
use outbox_core::{
    BlockedKey, MemberId, Message, NewMessage, OnFailed, Outcome, Result, Stats, Store,
};
use sqlx::postgres::{PgListener, PgPoolOptions};
use sqlx::{PgPool, Row};
use tokio::sync::watch;

use crate::error::map_sqlx_error;
use crate::schema::Schema;
use crate::writer::Writer;

/// Number of relay partitions; fixed by the migration that computes `outbox.partition`.
pub const PARTITIONS: usize = 64;

struct Queries {
    claim: String,
    complete: String,
    heartbeat: String,
    reap_members: String,
    renew: String,
    give_back: String,
    acquire: String,
    release: String,
    stats: String,
    members: String,
    blocked: String,
    report_health: String,
}

impl Queries {
    fn new(schema: &Schema) -> Self {
        Self {
            claim: schema.render(include_str!("../queries/claim.sql")),
            complete: schema.render(include_str!("../queries/complete.sql")),
            heartbeat: schema.render(include_str!("../queries/heartbeat.sql")),
            reap_members: schema.render(include_str!("../queries/reap_members.sql")),
            renew: schema.render(include_str!("../queries/renew.sql")),
            give_back: schema.render(include_str!("../queries/give_back.sql")),
            acquire: schema.render(include_str!("../queries/acquire.sql")),
            release: schema.render(include_str!("../queries/release.sql")),
            stats: schema.render(include_str!("../queries/stats.sql")),
            members: schema.render(include_str!("../queries/members.sql")),
            blocked: schema.render(include_str!("../queries/blocked.sql")),
            report_health: schema.render(include_str!("../queries/report_health.sql")),
        }
    }
}

/// Opens a pool to `url` with at most `max_connections`. Errors never echo the password.
pub async fn connect_pool(url: &str, max_connections: u32) -> Result<PgPool> {
    PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(Duration::from_secs(10))
        .connect(url)
        .await
        .map_err(|e| {
            map_sqlx_error(
                &format!("connecting to {}", outbox_core::redact::url(url)),
                e,
            )
        })
}

/// A PostgreSQL outbox in one schema.
pub struct PgStore {
    pool: PgPool,
    schema: Schema,
    writer: Writer,
    q: Queries,
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
        }
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
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

fn partitions_param(p: &[i32]) -> Vec<i16> {
    p.iter().filter_map(|&x| i16::try_from(x).ok()).collect()
}

#[async_trait]
impl Store for PgStore {
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
        let mut owned: Vec<i32> = sqlx::query_scalar::<_, i16>(&self.q.renew)
            .bind(member.as_str())
            .bind(secs(lease))
            .fetch_all(&self.pool)
            .await
            .map_err(err("renewing leases"))?
            .into_iter()
            .map(i32::from)
            .collect();
        owned.sort_unstable();
        if owned.len() > fair {
            let extra = owned.split_off(fair);
            sqlx::query(&self.q.give_back)
                .bind(member.as_str())
                .bind(partitions_param(&extra))
                .execute(&self.pool)
                .await
                .map_err(err("giving back partitions"))?;
        } else if owned.len() < fair {
            let got: Vec<i16> = sqlx::query_scalar(&self.q.acquire)
                .bind(member.as_str())
                .bind(secs(lease))
                .bind((fair - owned.len()) as i64)
                .fetch_all(&self.pool)
                .await
                .map_err(err("acquiring partitions"))?;
            owned.extend(got.into_iter().map(i32::from));
            owned.sort_unstable();
        }
        Ok(owned)
    }

    async fn renew(&self, member: &MemberId, lease: Duration) -> Result<usize> {
        let rows: Vec<i16> = sqlx::query_scalar(&self.q.renew)
            .bind(member.as_str())
            .bind(secs(lease))
            .fetch_all(&self.pool)
            .await
            .map_err(|e| map_sqlx_error("renewing partition leases", e))?;
        Ok(rows.len())
    }

    async fn claim(
        &self,
        member: &MemberId,
        partitions: &[i32],
        limit: usize,
        on_failed: OnFailed,
    ) -> Result<Vec<Message>> {
        if partitions.is_empty() || limit == 0 {
            return Ok(Vec::new());
        }
        // Each partition gives at most twice its fair share, so one busy partition cannot
        // starve the others and no claim reads far beyond the batch it returns.
        let per_partition = (limit.div_ceil(partitions.len()) * 2).max(32).min(limit);
        let err = |e| map_sqlx_error("claiming pending messages", e);
        // Planner statistics lag behind a fast-growing backlog (a fresh or just-filled table
        // looks nearly empty) and then a bitmap scan plus sort of every pending row looks
        // cheap; it costs the whole backlog on every claim. Forbid it for this statement: the
        // ordered index scan is always right here.
        let mut tx = self
            .pool
            .begin_with("BEGIN; SET LOCAL enable_bitmapscan = off; SET LOCAL enable_seqscan = off")
            .await
            .map_err(err)?;
        let rows = sqlx::query(&self.q.claim)
            .bind(member.as_str())
            .bind(partitions_param(partitions))
            .bind(limit as i64)
            .bind(per_partition as i64)
            .bind(on_failed == OnFailed::Block)
            .fetch_all(&mut *tx)
            .await
            .map_err(err)?;
        tx.commit().await.map_err(err)?;
        rows.into_iter()
            .map(|r| {
                Ok(Message {
                    seq: r.try_get("seq")?,
                    id: r.try_get("id")?,
                    aggregate_type: r.try_get("aggregate_type")?,
                    aggregate_id: r.try_get("aggregate_id")?,
                    event_type: r.try_get("event_type")?,
                    payload: r.try_get("payload")?,
                    headers: r.try_get("headers")?,
                    topic: r.try_get("topic")?,
                    created_at: r.try_get("created_at")?,
                    attempts: r.try_get("attempts")?,
                })
            })
            .collect::<std::result::Result<_, sqlx::Error>>()
            .map_err(|e| map_sqlx_error("reading claimed messages", e))
    }

    async fn complete(&self, member: &MemberId, outcomes: &[Outcome]) -> Result<u64> {
        if outcomes.is_empty() {
            return Ok(0);
        }
        let n = outcomes.len();
        let (mut seqs, mut states, mut errors, mut delays) = (
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
        );
        for o in outcomes {
            seqs.push(o.seq());
            let (state, error, delay) = match o {
                Outcome::Published { .. } => ("published", None, 0.0),
                Outcome::Retry { error, delay, .. } => {
                    ("pending", Some(error.as_str()), delay.as_secs_f64())
                }
                Outcome::Failed { error, .. } => ("failed", Some(error.as_str()), 0.0),
            };
            states.push(state);
            errors.push(error);
            delays.push(delay);
        }
        let done = sqlx::query(&self.q.complete)
            .bind(member.as_str())
            .bind(&seqs)
            .bind(&states)
            .bind(&errors)
            .bind(&delays)
            .execute(&self.pool)
            .await
            .map_err(|e| map_sqlx_error("recording publish results", e))?;
        Ok(done.rows_affected())
    }

    async fn release(&self, member: &MemberId) -> Result<()> {
        sqlx::query(&self.q.release)
            .bind(member.as_str())
            .execute(&self.pool)
            .await
            .map_err(|e| map_sqlx_error("releasing partitions", e))?;
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
        let r = sqlx::query(&self.q.stats)
            .fetch_one(&self.pool)
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
            members,
            blocked,
        })
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

    async fn insert(&self, messages: &[NewMessage]) -> Result<()> {
        let mut tx = self
            .pool
            .begin()
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
