//! Inbox mode: the receiving side's throughput, each side by side with a naive consumer that
//! does one transaction per message, in the same run and on the same stream, on PostgreSQL or
//! MySQL/MariaDB: the steps here, each database's half (`postgres`, `mysql`: its scratch
//! tables and the naive consumers' raw baseline SQL, excepted by issue 47) through
//! [`InboxBench`].
//!
//! 1. `--rows` messages are published to a scratch JetStream stream, as `outbox relay` would
//!    (message id, type and key headers, `--payload-bytes`, `--keys` keys).
//! 2. **Ingest**: the `outbox inbox` daemon (in process, one durable consumer) records them in
//!    the inbox, batches of `--batch-size`; then a naive consumer (a durable of its own) takes
//!    `--naive-rows` of them one at a time: `BEGIN; INSERT … ON CONFLICT DO NOTHING; COMMIT;`
//!    and an ack per message. Messages/s from the first fetch to the last commit.
//! 3. **Handlers**: the inbox processor (2 workers, 8 handlers at once each) drains the inbox's
//!    queue with a handler that writes one row per message; then a naive consumer (another
//!    durable) processes `--naive-rows` messages from the broker one transaction per message:
//!    the dedupe claim, the same row, commit, ack.

mod mysql;
mod postgres;

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use async_nats::jetstream::{self, consumer};
use futures::StreamExt;
use outbox_inbox::daemon::{DaemonConfig, IngestMetrics};
use outbox_inbox::source::{NatsSource, NatsSourceConfig};
use outbox_inbox::{InboxProcessor, ProcessorConfig};
use outbox_relay::RelayMetrics;
use serde::Serialize;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::bed::Bed;
use crate::{Options, Report};

/// Longest one measured phase may take.
const PHASE_LIMIT: Duration = Duration::from_secs(600);

/// One measured side.
#[derive(Debug, Serialize)]
struct Rate {
    messages: u64,
    seconds: f64,
    messages_per_second: f64,
}

impl Rate {
    fn new(messages: u64, took: Duration) -> Self {
        let seconds = took.as_secs_f64();
        Self {
            messages,
            seconds,
            messages_per_second: messages as f64 / seconds.max(1e-9),
        }
    }
}

/// The figures of a run.
#[derive(Debug, Serialize)]
pub(crate) struct Figures {
    rows: usize,
    naive_rows: usize,
    keys: usize,
    payload_bytes: usize,
    batch_size: usize,
    ingest_inbox: Rate,
    ingest_naive: Rate,
    ingest_speedup: f64,
    handlers_processor: Rate,
    handlers_naive: Rate,
    handlers_speedup: f64,
}

/// The run's messages on the broker: the scratch stream and its subjects.
pub(crate) struct Stream<'a> {
    pub js: &'a jetstream::Context,
    pub name: &'a str,
    pub subject_prefix: &'a str,
}

/// What one run measures: messages, keys, batch, payload.
pub(crate) struct Plan {
    pub rows: usize,
    pub naive_rows: usize,
    pub keys: usize,
    pub batch: usize,
    pub payload_bytes: usize,
    pub nats_url: String,
}

impl Plan {
    /// The plan `options` ask for (`--keys` one value).
    pub(crate) fn of(options: &Options, keys: usize) -> Self {
        Self {
            rows: options.rows,
            naive_rows: options
                .naive_rows
                .unwrap_or(options.rows.min(5_000))
                .min(options.rows),
            keys,
            batch: options.batch_size.clamp(1, 10_000),
            payload_bytes: options.payload_bytes,
            nats_url: options.nats_url.clone(),
        }
    }

    /// The run's first line.
    pub(crate) fn announce(&self, options: &Options, database: &str) {
        println!(
            "outbox bench: inbox, {} messages ({} for the naive consumers) on {} keys, {} B \
             payloads, NATS JetStream ({} storage) into {database}; inbox batch {}, processor 2 \
             workers × 8 handlers",
            self.rows, self.naive_rows, self.keys, self.payload_bytes, options.storage, self.batch
        );
    }
}

/// The database half of inbox mode, on one backend: the scratch inbox (migrated, with the
/// bench's `bench_effects` and `naive_inbox` tables), the naive consumers' one transaction per
/// message, and the processor with the effect handler.
pub(crate) trait InboxBench: Sync {
    /// The database URL `outbox inbox` opens.
    fn database_url(&self) -> &str;
    /// The inbox's schema (PostgreSQL) or database (MySQL).
    fn schema(&self) -> &str;
    /// The naive ingest of one message: its own transaction, a redelivery absorbed by the key.
    fn naive_ingest(&self, id: Uuid, key: &str) -> impl Future<Output = anyhow::Result<()>> + Send;
    /// The naive handler of one message: its own transaction, the claim, then the effect if
    /// the claim was new.
    fn naive_handle(&self, id: Uuid, key: &str) -> impl Future<Output = anyhow::Result<()>> + Send;
    /// The processor over the inbox's queue with the effect handler.
    fn processor(
        &self,
        config: ProcessorConfig,
    ) -> impl Future<Output = anyhow::Result<InboxProcessor>> + Send;
    /// Effects written.
    fn effects(&self) -> impl Future<Output = anyhow::Result<i64>> + Send;
}

/// Publishes `rows` messages like `outbox relay` does.
async fn publish(s: &Stream<'_>, rows: usize, keys: usize, pad: &str) -> anyhow::Result<()> {
    let subject = format!("{}.created", s.subject_prefix);
    for chunk in (0..rows).collect::<Vec<_>>().chunks(5000) {
        let mut acks = Vec::with_capacity(chunk.len());
        for &i in chunk {
            let id = Uuid::now_v7().to_string();
            let mut h = async_nats::HeaderMap::new();
            h.insert("outbox-message-id", id.as_str());
            h.insert("Nats-Msg-Id", id.as_str());
            h.insert("outbox-event-type", "created");
            h.insert(
                "outbox-aggregate-id",
                format!("key-{}", i % keys.max(1)).as_str(),
            );
            let body = serde_json::json!({ "n": i, "pad": pad }).to_string();
            acks.push(
                s.js.publish_with_headers(subject.clone(), h, body.into())
                    .await
                    .context("publishing the bench messages")?,
            );
        }
        for a in acks {
            a.await.context("publishing the bench messages")?;
        }
    }
    Ok(())
}

/// A durable pull consumer of its own on the stream.
async fn durable(s: &Stream<'_>, name: &str) -> anyhow::Result<consumer::PullConsumer> {
    Ok(s.js
        .get_stream(s.name)
        .await?
        .create_consumer(consumer::pull::Config {
            durable_name: Some(name.into()),
            ack_policy: consumer::AckPolicy::Explicit,
            max_ack_pending: 1000,
            ..Default::default()
        })
        .await?)
}

/// The naive consumer: one transaction (`each`) and one ack per message, `rows` messages.
/// Returns the time from the first fetch to the last ack.
async fn naive<F, Fut>(
    s: &Stream<'_>,
    name: &str,
    rows: usize,
    mut each: F,
) -> anyhow::Result<Duration>
where
    F: FnMut(Uuid, String) -> Fut,
    Fut: Future<Output = anyhow::Result<()>>,
{
    let c = durable(s, name).await?;
    let started = Instant::now();
    let mut done = 0usize;
    while done < rows {
        anyhow::ensure!(started.elapsed() < PHASE_LIMIT, "naive consumer too slow");
        let mut batch = c
            .fetch()
            .max_messages((rows - done).min(100))
            .messages()
            .await?;
        while let Some(m) = batch.next().await {
            let m = m.map_err(|e| anyhow::anyhow!("fetch: {e}"))?;
            let (id, key) = id_and_key(&m);
            each(id, key).await?;
            m.ack().await.map_err(|e| anyhow::anyhow!("ack: {e}"))?;
            done += 1;
        }
    }
    Ok(started.elapsed())
}

fn id_and_key(m: &async_nats::jetstream::Message) -> (Uuid, String) {
    let h = |name: &str| {
        m.headers
            .as_ref()
            .and_then(|h| h.get(name))
            .map(|v| v.as_str().to_string())
            .unwrap_or_default()
    };
    (
        h("outbox-message-id")
            .parse()
            .unwrap_or_else(|_| Uuid::now_v7()),
        h("outbox-aggregate-id"),
    )
}

/// Runs inbox mode on the database of `bed`.
pub async fn run(bed: Bed<'_>) -> anyhow::Result<Report> {
    let o = bed.options();
    let plan = Plan::of(o, crate::single_keys(o)?);
    let database = match bed {
        Bed::Postgres(_) => "PostgreSQL",
        Bed::Mysql(_) => "MariaDB",
    };
    plan.announce(o, database);
    let figures = match bed {
        Bed::Postgres(ctx) => postgres::run(ctx, &plan).await,
        Bed::Mysql(ctx) => mysql::run(ctx, &plan).await,
    };
    report(figures?, o.json, database)
}

/// The figures as the report, with the text summary unless JSON was asked for (the report
/// stands in for it then).
fn report(figures: Figures, json: bool, database: &str) -> anyhow::Result<Report> {
    if !json {
        println!(
            "  ingest   NATS -> {database:<10}   outbox inbox {:>9.0} msg/s ({} in {:.2} s)   naive, one transaction per message {:>7.0} msg/s ({} in {:.2} s)   {:.1}x",
            figures.ingest_inbox.messages_per_second,
            figures.ingest_inbox.messages,
            figures.ingest_inbox.seconds,
            figures.ingest_naive.messages_per_second,
            figures.ingest_naive.messages,
            figures.ingest_naive.seconds,
            figures.ingest_speedup
        );
        println!(
            "  handlers                      processor    {:>9.0} msg/s ({} in {:.2} s)   naive, one transaction per message {:>7.0} msg/s ({} in {:.2} s)   {:.1}x",
            figures.handlers_processor.messages_per_second,
            figures.handlers_processor.messages,
            figures.handlers_processor.seconds,
            figures.handlers_naive.messages_per_second,
            figures.handlers_naive.messages,
            figures.handlers_naive.seconds,
            figures.handlers_speedup
        );
    }
    Report::pretty(&figures)
}

/// Measures ingest and handlers on `db`, each beside its naive consumer.
async fn measure(db: &impl InboxBench, s: &Stream<'_>, plan: &Plan) -> anyhow::Result<Figures> {
    let (rows, naive_rows, batch) = (plan.rows, plan.naive_rows, plan.batch);
    publish(s, rows, plan.keys, &crate::load::pad(plan.payload_bytes)).await?;

    // Ingest: the daemon.
    let source = NatsSource::connect(
        NatsSourceConfig::from_url(&format!(
            "{}?stream={}&durable=bench-inbox",
            plan.nats_url, s.name
        ))?,
        batch,
    )
    .await?;
    let metrics = Arc::new(IngestMetrics::default());
    let stop = CancellationToken::new();
    let inbox = outbox_inbox::InboxDatabase::open(db.database_url(), db.schema(), 2)
        .await?
        .daemon()?;
    let started = Instant::now();
    let daemon = tokio::spawn(outbox_inbox::daemon::run(
        inbox,
        Box::new(source),
        DaemonConfig {
            batch,
            poll_interval: Duration::from_millis(10),
            ..DaemonConfig::default()
        },
        metrics.clone(),
        stop.clone(),
    ));
    while IngestMetrics::get(&metrics.recorded) < rows as u64 {
        anyhow::ensure!(
            started.elapsed() < PHASE_LIMIT,
            "the inbox daemon did not finish"
        );
        anyhow::ensure!(!daemon.is_finished(), "the inbox daemon stopped");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let ingest_inbox = Rate::new(rows as u64, started.elapsed());
    stop.cancel();
    daemon.await??;

    // Ingest: naive.
    let took = naive(s, "bench-naive-ingest", naive_rows, |id, key| async move {
        db.naive_ingest(id, &key).await
    })
    .await?;
    let ingest_naive = Rate::new(naive_rows as u64, took);

    // Handlers: the processor over the inbox's queue.
    let processor = db
        .processor(ProcessorConfig {
            workers: 2,
            batch_size: batch.min(1000),
            concurrency: 8,
            poll_interval: Duration::from_millis(10),
            member_prefix: "bench-inbox".into(),
            ..ProcessorConfig::default()
        })
        .await?;
    let handled = processor.metrics();
    let stop = CancellationToken::new();
    let started = Instant::now();
    let task = tokio::spawn(processor.run(stop.clone()));
    while RelayMetrics::get(&handled.published) < rows as u64 {
        anyhow::ensure!(
            started.elapsed() < PHASE_LIMIT,
            "the processor did not finish"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let handlers_processor = Rate::new(rows as u64, started.elapsed());
    stop.cancel();
    task.await?;
    let effects = db.effects().await?;
    anyhow::ensure!(
        effects == rows as i64,
        "{effects} effects for {rows} messages"
    );

    // Handlers: naive, straight from the broker, one transaction per message (claim, effect).
    let took = naive(s, "bench-naive-handler", naive_rows, |id, key| async move {
        db.naive_handle(id, &key).await
    })
    .await?;
    let handlers_naive = Rate::new(naive_rows as u64, took);

    Ok(Figures {
        rows,
        naive_rows,
        keys: plan.keys,
        payload_bytes: plan.payload_bytes,
        batch_size: batch,
        ingest_speedup: ingest_inbox.messages_per_second
            / ingest_naive.messages_per_second.max(1e-9),
        handlers_speedup: handlers_processor.messages_per_second
            / handlers_naive.messages_per_second.max(1e-9),
        ingest_inbox,
        ingest_naive,
        handlers_processor,
        handlers_naive,
    })
}
