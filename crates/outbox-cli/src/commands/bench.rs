//! `outbox bench`: drain throughput and commit→ack latency against real PostgreSQL and NATS,
//! beside the naive relay of the seed articles, in the same run.
//!
//! Latency is measured in the database as `published_at - created_at`: from the start of the
//! writing transaction (a little before its commit) to the statement that records the
//! acknowledgement (a little after it). It errs on the slow side.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use async_nats::jetstream;
use outbox_core::{DestinationTemplate, NewMessage, Store};
use outbox_postgres::{connect_pool, migrate, PgStore, Schema, Writer};
use outbox_relay::{Relay, RelayConfig, RelayMetrics};
use serde::Serialize;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::cli::{BenchArgs, BenchMode, Format};

const DEFAULT_DB: &str = "postgres://root@127.0.0.1:5432/test";
const DEFAULT_NATS: &str = "nats://127.0.0.1:4222";

/// Figures of one measured drain.
#[derive(Debug, Serialize)]
struct Figures {
    events: u64,
    seconds: f64,
    events_per_second: f64,
    latency_ms_p50: f64,
    latency_ms_p99: f64,
    latency_ms_max: f64,
}

/// A scratch schema and stream, dropped at the end.
struct Scratch {
    pool: PgPool,
    schema: Schema,
    js: jetstream::Context,
    stream: String,
    subject_prefix: String,
}

impl Scratch {
    async fn new(
        pool: PgPool,
        js: jetstream::Context,
        storage: &str,
        tag: &str,
    ) -> anyhow::Result<Self> {
        let sfx = format!("{:012x}", fastrand::u64(..) & 0xffff_ffff_ffff);
        let schema = Schema::new(&format!("outbox_bench_{tag}_{sfx}"))?;
        migrate(&pool, &schema).await?;
        let stream = format!("OUTBOX_BENCH_{}_{sfx}", tag.to_uppercase());
        let subject_prefix = format!("outbox_bench_{tag}_{sfx}");
        js.create_stream(jetstream::stream::Config {
            name: stream.clone(),
            subjects: vec![format!("{subject_prefix}.>")],
            storage: if storage == "memory" {
                jetstream::stream::StorageType::Memory
            } else {
                jetstream::stream::StorageType::File
            },
            duplicate_window: Duration::from_secs(120),
            ..Default::default()
        })
        .await
        .context("creating the bench stream (is NATS running with JetStream?)")?;
        Ok(Self {
            pool,
            schema,
            js,
            stream,
            subject_prefix,
        })
    }

    fn store(&self) -> PgStore {
        PgStore::new(self.pool.clone(), self.schema.clone())
    }

    async fn stream_messages(&self) -> anyhow::Result<u64> {
        Ok(self
            .js
            .get_stream(&self.stream)
            .await?
            .info()
            .await?
            .state
            .messages)
    }

    async fn latency(&self) -> anyhow::Result<(f64, f64, f64)> {
        let sql = self.schema.render(
            "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY ms), percentile_cont(0.99) WITHIN GROUP (ORDER BY ms), max(ms)
             FROM (SELECT extract(epoch FROM published_at - created_at)::float8 * 1000 AS ms
                   FROM {schema}.outbox WHERE state = 'published') AS t",
        );
        let (p50, p99, max): (Option<f64>, Option<f64>, Option<f64>) =
            sqlx::query_as(&sql).fetch_one(&self.pool).await?;
        Ok((p50.unwrap_or(0.0), p99.unwrap_or(0.0), max.unwrap_or(0.0)))
    }

    async fn drop(self) {
        let _ = sqlx::raw_sql(&self.schema.render("DROP SCHEMA {schema} CASCADE"))
            .execute(&self.pool)
            .await;
        let _ = self.js.delete_stream(&self.stream).await;
    }
}

fn message(i: usize, keys: usize, payload: &str) -> NewMessage {
    NewMessage::new(
        "bench",
        format!("key-{}", i % keys.max(1)),
        "created",
        serde_json::json!({ "n": i, "pad": payload }),
    )
}

/// Fills `rows` messages in transactions of 1000, four writers at once.
async fn fill(
    scratch: &Scratch,
    rows: usize,
    keys: usize,
    payload_bytes: usize,
) -> anyhow::Result<Duration> {
    let pad = "x".repeat(payload_bytes.saturating_sub(30));
    let writer = Writer::new(&scratch.schema);
    let started = Instant::now();
    let chunks: Vec<(usize, usize)> = (0..rows)
        .step_by(1000)
        .map(|s| (s, (s + 1000).min(rows)))
        .collect();
    let per = chunks.len().div_ceil(4).max(1);
    let mut tasks = Vec::new();
    for part in chunks.chunks(per) {
        let (pool, writer, pad, part) = (
            scratch.pool.clone(),
            writer.clone(),
            pad.clone(),
            part.to_vec(),
        );
        tasks.push(tokio::spawn(async move {
            for (a, b) in part {
                let msgs: Vec<_> = (a..b).map(|i| message(i, keys, &pad)).collect();
                let mut tx = pool.begin().await?;
                writer.enqueue_many(&mut tx, &msgs).await?;
                tx.commit().await?;
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(started.elapsed())
}

fn relay_config(args: &BenchArgs, scratch: &Scratch) -> anyhow::Result<RelayConfig> {
    Ok(RelayConfig {
        batch_size: args.batch_size,
        workers: args.workers,
        listen: !args.no_listen,
        destination: DestinationTemplate::parse(&format!(
            "{}.{{event_type}}",
            scratch.subject_prefix
        ))?,
        member_prefix: "bench".into(),
        ..RelayConfig::default()
    })
}

/// Starts the relay; returns its stop token, metrics and task.
async fn start_relay(
    args: &BenchArgs,
    scratch: &Scratch,
    nats_url: &str,
) -> anyhow::Result<(
    CancellationToken,
    Arc<RelayMetrics>,
    tokio::task::JoinHandle<()>,
)> {
    let sink = outbox_sinks::connect(nats_url).await?;
    let store: Arc<dyn Store> = Arc::new(scratch.store());
    let relay = Relay::new(store, sink, relay_config(args, scratch)?);
    let metrics = relay.metrics();
    let stop = CancellationToken::new();
    let handle = tokio::spawn(relay.run(stop.clone()));
    Ok((stop, metrics, handle))
}

async fn wait_published(
    metrics: &RelayMetrics,
    target: u64,
    limit: Duration,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + limit;
    while RelayMetrics::get(&metrics.published) < target {
        if Instant::now() > deadline {
            anyhow::bail!(
                "gave up after {limit:?}: {} of {target} published",
                RelayMetrics::get(&metrics.published)
            );
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(())
}

pub async fn run(args: BenchArgs) -> anyhow::Result<ExitCode> {
    let db = args
        .database_url
        .clone()
        .or_else(|| std::env::var("DATABASE_URL").ok())
        .unwrap_or_else(|| DEFAULT_DB.into());
    let nats_url = args
        .sink
        .clone()
        .or_else(|| std::env::var("OUTBOX_SINK").ok())
        .unwrap_or_else(|| DEFAULT_NATS.into());
    let pool = connect_pool(&db, (args.producers as u32).max(8) + 8).await?;
    let client = outbox_sinks::nats::NatsConfig::from_url(&nats_url)?
        .connect_client()
        .await
        .context("connecting to NATS for the bench stream")?;
    let js = jetstream::new(client);
    match args.mode {
        BenchMode::Backlog => backlog(&args, pool, js, &nats_url).await,
        BenchMode::Steady => steady(&args, pool, js, &nats_url).await,
    }
}

async fn backlog(
    args: &BenchArgs,
    pool: PgPool,
    js: jetstream::Context,
    nats_url: &str,
) -> anyhow::Result<ExitCode> {
    println!(
        "outbox bench: backlog of {} events over {} keys, {} B payloads, NATS JetStream ({} storage)",
        args.rows, args.keys, args.payload_bytes, args.storage
    );
    let scratch = Scratch::new(pool.clone(), js.clone(), &args.storage, "relay").await?;
    let fill_time = fill(&scratch, args.rows, args.keys, args.payload_bytes).await?;
    println!(
        "  filled in {:.2} s ({:.0} rows/s)",
        fill_time.as_secs_f64(),
        args.rows as f64 / fill_time.as_secs_f64()
    );
    let started = Instant::now();
    let (stop, metrics, handle) = start_relay(args, &scratch, nats_url).await?;
    wait_published(&metrics, args.rows as u64, Duration::from_secs(600)).await?;
    let took = started.elapsed();
    stop.cancel();
    handle.await?;
    let (p50, p99, max) = scratch.latency().await?;
    let in_stream = scratch.stream_messages().await?;
    let ours = Figures {
        events: args.rows as u64,
        seconds: took.as_secs_f64(),
        events_per_second: args.rows as f64 / took.as_secs_f64(),
        latency_ms_p50: p50,
        latency_ms_p99: p99,
        latency_ms_max: max,
    };
    println!(
        "  relay  ({} workers, batch {}): {} events in {:.2} s = {:.0} events/s; commit→ack p50 {:.0} ms, p99 {:.0} ms \
         (time queued in the backlog included); stream holds {in_stream}",
        args.workers, args.batch_size, ours.events, ours.seconds, ours.events_per_second, p50, p99
    );
    if in_stream != args.rows as u64 {
        anyhow::bail!(
            "the stream holds {in_stream} messages, expected {}",
            args.rows
        );
    }
    scratch.drop().await;

    let naive = if args.skip_naive {
        None
    } else {
        let rows = args.naive_rows.unwrap_or(args.rows.min(20_000));
        let scratch = Scratch::new(pool.clone(), js.clone(), &args.storage, "naive").await?;
        fill(&scratch, rows, args.keys, args.payload_bytes).await?;
        let (took, n) = super::naive::drain(
            &scratch.pool,
            scratch.schema.as_str(),
            &scratch.js,
            &scratch.subject_prefix,
        )
        .await?;
        let (p50, p99, max) = scratch.latency().await?;
        let f = Figures {
            events: n,
            seconds: took.as_secs_f64(),
            events_per_second: n as f64 / took.as_secs_f64(),
            latency_ms_p50: p50,
            latency_ms_p99: p99,
            latency_ms_max: max,
        };
        println!(
            "  naive  (100 rows FOR UPDATE SKIP LOCKED, 1 publish + 1 UPDATE per row): {} events in {:.2} s = {:.0} events/s; \
             commit→ack p50 {:.0} ms, p99 {:.0} ms",
            f.events, f.seconds, f.events_per_second, p50, p99
        );
        println!(
            "  speed-up: {:.1}x",
            ours.events_per_second / f.events_per_second
        );
        scratch.drop().await;
        Some(f)
    };
    if args.format == Format::Json {
        println!(
            "{}",
            serde_json::json!({ "mode": "backlog", "relay": ours, "naive": naive })
        );
    }
    Ok(ExitCode::SUCCESS)
}

async fn steady(
    args: &BenchArgs,
    pool: PgPool,
    js: jetstream::Context,
    nats_url: &str,
) -> anyhow::Result<ExitCode> {
    let duration = args.duration.0;
    println!(
        "outbox bench: steady load of {} events/s for {:?}, one row per transaction over {} connections, {}",
        args.rate,
        duration,
        args.producers,
        if args.no_listen { "polling only" } else { "LISTEN/NOTIFY wake-ups" }
    );
    let scratch = Scratch::new(pool.clone(), js.clone(), &args.storage, "steady").await?;
    let (stop, metrics, handle) = start_relay(args, &scratch, nats_url).await?;
    let writer = Writer::new(&scratch.schema);
    let producers = args.producers.max(1);
    let period = Duration::from_secs_f64(producers as f64 / f64::from(args.rate.max(1)))
        .max(Duration::from_micros(10));
    let pad = "x".repeat(args.payload_bytes.saturating_sub(30));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for p in 0..producers {
        let (pool, writer, pad, keys) =
            (scratch.pool.clone(), writer.clone(), pad.clone(), args.keys);
        tasks.push(tokio::spawn(async move {
            // Stagger producers across one period so commits arrive evenly, not in bursts.
            let start = tokio::time::Instant::now() + period.mul_f64(p as f64 / producers as f64);
            let mut tick = tokio::time::interval_at(start, period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut sent = 0u64;
            let mut i = p;
            while started.elapsed() < duration {
                tick.tick().await;
                let mut tx = pool.begin().await?;
                writer.enqueue(&mut tx, &message(i, keys, &pad)).await?;
                tx.commit().await?;
                sent += 1;
                i += producers;
            }
            anyhow::Ok(sent)
        }));
    }
    let mut committed = 0u64;
    for t in tasks {
        committed += t.await??;
    }
    let produce_secs = started.elapsed().as_secs_f64();
    wait_published(&metrics, committed, Duration::from_secs(120)).await?;
    stop.cancel();
    handle.await?;
    let (p50, p99, max) = scratch.latency().await?;
    let f = Figures {
        events: committed,
        seconds: produce_secs,
        events_per_second: committed as f64 / produce_secs,
        latency_ms_p50: p50,
        latency_ms_p99: p99,
        latency_ms_max: max,
    };
    println!(
        "  committed {} events ({:.0} events/s); commit→ack p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        f.events, f.events_per_second, p50, p99, max
    );
    scratch.drop().await;
    if args.format == Format::Json {
        println!(
            "{}",
            serde_json::json!({ "mode": "steady", "listen": !args.no_listen, "relay": f })
        );
    }
    Ok(ExitCode::SUCCESS)
}
