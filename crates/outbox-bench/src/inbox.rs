//! Inbox mode: the receiving side's throughput, each side by side with a naive consumer that
//! does one transaction per message, in the same run and on the same stream.
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

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use async_nats::jetstream::consumer;
use futures::StreamExt;
use outbox_inbox::daemon::{DaemonConfig, IngestMetrics};
use outbox_inbox::source::{NatsSource, NatsSourceConfig};
use outbox_inbox::{Handlers, InboxProcessor, InboxSchema, ProcessorConfig};
use outbox_relay::RelayMetrics;
use serde::Serialize;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::scratch::Scratch;
use crate::{sql, Ctx, Report};

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
struct Figures {
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

/// Publishes `rows` messages like `outbox relay` does; returns them (id, key) in order.
async fn publish(s: &Scratch, rows: usize, keys: usize, pad: &str) -> anyhow::Result<()> {
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
async fn durable(s: &Scratch, name: &str) -> anyhow::Result<consumer::PullConsumer> {
    Ok(s.js
        .get_stream(&s.stream)
        .await?
        .create_consumer(consumer::pull::Config {
            durable_name: Some(name.into()),
            ack_policy: consumer::AckPolicy::Explicit,
            max_ack_pending: 1000,
            ..Default::default()
        })
        .await?)
}

/// The naive consumer: one transaction and one ack per message, `rows` messages; `handle`
/// runs inside the transaction. Returns the time from the first fetch to the last ack.
async fn naive<F>(
    s: &Scratch,
    name: &str,
    rows: usize,
    sql: &[String],
    mut bind_key: F,
) -> anyhow::Result<Duration>
where
    F: FnMut(&async_nats::jetstream::Message) -> (Uuid, String),
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
            let (id, key) = bind_key(&m);
            let mut tx = s.pool.begin().await?;
            let mut fresh = true;
            for (i, stmt) in sql.iter().enumerate() {
                if i > 0 && !fresh {
                    break;
                }
                let r = sqlx::query(stmt)
                    .bind(id)
                    .bind(&key)
                    .execute(&mut *tx)
                    .await?;
                fresh = r.rows_affected() == 1;
            }
            tx.commit().await?;
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

/// Runs inbox mode.
pub async fn run(ctx: &Ctx) -> anyhow::Result<Report> {
    let a = &ctx.options;
    let keys = ctx.single_keys()?;
    let rows = a.rows;
    let naive_rows = a.naive_rows.unwrap_or(rows.min(5_000)).min(rows);
    let batch = a.batch_size.clamp(1, 10_000);
    println!(
        "outbox bench: inbox, {rows} messages ({naive_rows} for the naive consumers) on {keys} keys, \
         {} B payloads, NATS JetStream ({} storage) into PostgreSQL; inbox batch {batch}, \
         processor 2 workers × 8 handlers",
        a.payload_bytes, a.storage
    );
    let s = Scratch::new(&ctx.pool, &ctx.js, a.storage, "inbox").await?;
    let result = measure(ctx, &s, rows, naive_rows, keys, batch).await;
    // The inbox's processing queue lives in a schema of its own beside the scratch one.
    if let Ok(inbox) = InboxSchema::new(s.schema.as_str()) {
        let _ = sqlx::raw_sql(&inbox.queue().render(sql::DROP_SCHEMA_IF_EXISTS))
            .execute(&s.pool)
            .await;
    }
    s.drop().await;
    let report = result?;
    // In JSON the report stands in for the text summary.
    if !ctx.json() {
        println!(
            "  ingest   NATS -> PostgreSQL   outbox inbox {:>9.0} msg/s ({} in {:.2} s)   naive, one transaction per message {:>7.0} msg/s ({} in {:.2} s)   {:.1}x",
            report.ingest_inbox.messages_per_second,
            report.ingest_inbox.messages,
            report.ingest_inbox.seconds,
            report.ingest_naive.messages_per_second,
            report.ingest_naive.messages,
            report.ingest_naive.seconds,
            report.ingest_speedup
        );
        println!(
            "  handlers                      processor    {:>9.0} msg/s ({} in {:.2} s)   naive, one transaction per message {:>7.0} msg/s ({} in {:.2} s)   {:.1}x",
            report.handlers_processor.messages_per_second,
            report.handlers_processor.messages,
            report.handlers_processor.seconds,
            report.handlers_naive.messages_per_second,
            report.handlers_naive.messages,
            report.handlers_naive.seconds,
            report.handlers_speedup
        );
    }
    Report::pretty(&report)
}

async fn measure(
    ctx: &Ctx,
    s: &Scratch,
    rows: usize,
    naive_rows: usize,
    keys: usize,
    batch: usize,
) -> anyhow::Result<Figures> {
    let schema = InboxSchema::new(s.schema.as_str())?;
    outbox_inbox::migrate_postgres(&s.pool, &schema).await?;
    sqlx::raw_sql(&s.schema.render(sql::INBOX_TABLES))
        .execute(&s.pool)
        .await?;
    publish(s, rows, keys, &ctx.pad()).await?;

    // Ingest: the daemon.
    let source = NatsSource::connect(
        NatsSourceConfig::from_url(&format!(
            "{}?stream={}&durable=bench-inbox",
            ctx.options.nats_url, s.stream
        ))?,
        batch,
    )
    .await?;
    let metrics = Arc::new(IngestMetrics::default());
    let stop = CancellationToken::new();
    let db =
        outbox_inbox::InboxDatabase::open(&ctx.options.database_url, schema.tables().as_str(), 2)
            .await?
            .daemon()?;
    let started = Instant::now();
    let daemon = tokio::spawn(outbox_inbox::daemon::run(
        db,
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
    let took = naive(
        s,
        "bench-naive-ingest",
        naive_rows,
        &[s.schema.render(sql::NAIVE_INBOX_INSERT)],
        id_and_key,
    )
    .await?;
    let ingest_naive = Rate::new(naive_rows as u64, took);

    // Handlers: the processor over the inbox's queue.
    let insert = s.schema.render(sql::EFFECT_INSERT);
    let handlers = Handlers::new().on_fn("created", move |tx, m| {
        let insert = insert.clone();
        Box::pin(async move {
            sqlx::query(&insert)
                .bind(m.id)
                .bind(&m.key)
                .execute(&mut **tx)
                .await?;
            Ok(())
        })
    });
    let pool = outbox_postgres::connect_pool(&ctx.options.database_url, 24).await?;
    let processor = InboxProcessor::postgres(
        pool.clone(),
        schema,
        handlers,
        ProcessorConfig {
            workers: 2,
            batch_size: batch.min(1000),
            concurrency: 8,
            poll_interval: Duration::from_millis(10),
            member_prefix: "bench-inbox".into(),
            ..ProcessorConfig::default()
        },
    )?;
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
    pool.close().await;
    let effects: i64 = sqlx::query_scalar(&s.schema.render(sql::EFFECTS_COUNT))
        .fetch_one(&s.pool)
        .await?;
    anyhow::ensure!(
        effects == rows as i64,
        "{effects} effects for {rows} messages"
    );

    // Handlers: naive, straight from the broker, one transaction per message (claim, effect).
    let took = naive(
        s,
        "bench-naive-handler",
        naive_rows,
        &[
            s.schema.render(sql::NAIVE_HANDLER_CLAIM),
            s.schema.render(sql::EFFECT_INSERT),
        ],
        id_and_key,
    )
    .await?;
    let handlers_naive = Rate::new(naive_rows as u64, took);

    Ok(Figures {
        rows,
        naive_rows,
        keys,
        payload_bytes: ctx.options.payload_bytes,
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
