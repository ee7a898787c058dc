//! Producers through the writer API: a backlog filled in large transactions, and a paced load
//! of one row per transaction. Both record each commit in the run's [`Latency`] ledger.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use outbox_core::NewMessage;
use outbox_db::tools::postgres::Writer;
use outbox_db::Schema;
use serde::Serialize;
use sqlx::PgPool;

use crate::latency::Latency;

/// Rows per transaction when filling a backlog.
const FILL_TX_ROWS: usize = 1000;
/// Connections filling a backlog at once.
const FILL_WRITERS: usize = 4;

/// Padding that brings a bench payload to about `payload_bytes`.
pub fn pad(payload_bytes: usize) -> String {
    "x".repeat(payload_bytes.saturating_sub(30))
}

/// The `i`-th bench message, over `keys` ordering keys.
pub fn message(i: usize, keys: usize, pad: &str) -> NewMessage {
    NewMessage::new(
        "bench",
        format!("key-{}", i % keys.max(1)),
        "created",
        serde_json::json!({ "n": i, "pad": pad }),
    )
}

/// Where a producer commits: one transaction through a database's writer API.
pub trait Target: Clone + Send + Sync + 'static {
    /// Commits `msgs` in one transaction (one message through the writer's single-row call),
    /// stamping the moment before `COMMIT` and recording the commit in `latency`.
    fn commit(
        &self,
        msgs: Vec<NewMessage>,
        latency: Arc<Latency>,
    ) -> impl Future<Output = anyhow::Result<()>> + Send;
}

/// PostgreSQL, through [`Writer`].
#[derive(Clone)]
pub struct PgTarget {
    pool: PgPool,
    writer: Writer,
}

impl PgTarget {
    pub fn new(pool: &PgPool, schema: &Schema) -> Self {
        Self {
            pool: pool.clone(),
            writer: Writer::new(schema),
        }
    }
}

impl Target for PgTarget {
    fn commit(
        &self,
        msgs: Vec<NewMessage>,
        latency: Arc<Latency>,
    ) -> impl Future<Output = anyhow::Result<()>> + Send {
        let t = self.clone();
        async move {
            let mut tx = t.pool.begin().await?;
            match msgs.as_slice() {
                [one] => {
                    t.writer.enqueue(&mut tx, one).await?;
                }
                many => t.writer.enqueue_many(&mut tx, many).await?,
            }
            let sent = latency.stamp();
            tx.commit().await?;
            latency.committed(msgs.iter().map(|m| m.id), sent);
            Ok(())
        }
    }
}

/// Fills `rows` messages in transactions of 1000, four writers at once; returns the time taken.
pub async fn fill(
    pool: &PgPool,
    schema: &Schema,
    rows: usize,
    keys: usize,
    pad: &str,
    latency: &Arc<Latency>,
) -> anyhow::Result<Duration> {
    fill_into(&PgTarget::new(pool, schema), rows, keys, pad, latency).await
}

/// [`fill`] into any [`Target`].
pub async fn fill_into<T: Target>(
    target: &T,
    rows: usize,
    keys: usize,
    pad: &str,
    latency: &Arc<Latency>,
) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let chunks: Vec<(usize, usize)> = (0..rows)
        .step_by(FILL_TX_ROWS)
        .map(|s| (s, (s + FILL_TX_ROWS).min(rows)))
        .collect();
    let per = chunks.len().div_ceil(FILL_WRITERS).max(1);
    let mut tasks = Vec::new();
    for part in chunks.chunks(per) {
        let (target, pad, part, latency) = (
            target.clone(),
            pad.to_string(),
            part.to_vec(),
            latency.clone(),
        );
        tasks.push(tokio::spawn(async move {
            for (a, b) in part {
                let msgs: Vec<_> = (a..b).map(|i| message(i, keys, &pad)).collect();
                target.commit(msgs, latency.clone()).await?;
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(started.elapsed())
}

/// A paced load: `producers` connections share `rate` transactions per second, each writing
/// one message, for `duration`.
#[derive(Debug, Clone)]
pub struct Paced {
    pub rate: u32,
    pub producers: usize,
    pub duration: Duration,
    pub keys: usize,
    pub pad: String,
}

/// What a paced load achieved.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Produced {
    /// Transactions (= messages) committed.
    pub committed: u64,
    /// From the first producer's start to the last one's end.
    pub seconds: f64,
    /// `committed / seconds`: below the target rate when commits could not keep up.
    pub events_per_second: f64,
}

/// Runs a paced load through the writer API into `schema`, recording every commit. A producer
/// whose commits fall behind its schedule does not catch up in bursts: the achieved rate then
/// shows the shortfall.
pub async fn paced(
    pool: &PgPool,
    schema: &Schema,
    spec: &Paced,
    latency: &Arc<Latency>,
) -> anyhow::Result<Produced> {
    paced_into(&PgTarget::new(pool, schema), spec, latency).await
}

/// [`paced`] into any [`Target`].
pub async fn paced_into<T: Target>(
    target: &T,
    spec: &Paced,
    latency: &Arc<Latency>,
) -> anyhow::Result<Produced> {
    let producers = spec.producers.max(1);
    let period = Duration::from_secs_f64(producers as f64 / f64::from(spec.rate.max(1)))
        .max(Duration::from_micros(10));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for p in 0..producers {
        let (target, spec, latency) = (target.clone(), spec.clone(), latency.clone());
        // Aborted when this load is dropped (a mode that stops it early), so no producer
        // writes on into a scratch schema already dropped.
        tasks.push(tokio_util::task::AbortOnDropHandle::new(tokio::spawn(
            async move {
                // Stagger producers across one period so commits arrive evenly, not in bursts.
                let start =
                    tokio::time::Instant::now() + period.mul_f64(p as f64 / producers as f64);
                let mut tick = tokio::time::interval_at(start, period);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                let mut done = 0u64;
                let mut i = p;
                while started.elapsed() < spec.duration {
                    tick.tick().await;
                    target
                        .commit(vec![message(i, spec.keys, &spec.pad)], latency.clone())
                        .await?;
                    done += 1;
                    i += producers;
                }
                anyhow::Ok(done)
            },
        )));
    }
    let mut committed = 0u64;
    for t in tasks {
        committed += t.await??;
    }
    let seconds = started.elapsed().as_secs_f64();
    Ok(Produced {
        committed,
        seconds,
        events_per_second: committed as f64 / seconds,
    })
}
