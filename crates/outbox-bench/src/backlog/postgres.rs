//! Backlog mode's steps on PostgreSQL: the relay's drain into NATS, into `--sink` and into the
//! discarding sink (the engine alone), and the naive relay's drain of its seed-style table (the
//! `naive` module: raw baseline, excepted by issue 47). CDC mode drains through these too.

use std::sync::Arc;
use std::time::{Duration, Instant};

use outbox_core::DestinationTemplate;

use super::{finish_with, line, wait_published};
use crate::cpu::CpuMeter;
use crate::discard::DiscardSink;
use crate::latency::Probe;
use crate::load::fill;
use crate::relay::RelayUnderTest;
use crate::scratch::Scratch;
use crate::{naive, Ctx, Drain, DrainTiming};

/// Prints the mode's header on PostgreSQL.
pub(super) fn header(ctx: &Ctx, naive_rows: usize) {
    let a = &ctx.options;
    println!(
        "outbox bench: backlog of {} events (naive relay: {naive_rows}), {} B payloads, keys {:?}, \
         NATS JetStream ({} storage), {}; relay {} workers, batch {}, {}",
        a.rows,
        a.payload_bytes,
        a.keys,
        a.storage,
        if a.analyze { "ANALYZE after filling" } else { "no ANALYZE" },
        a.workers,
        a.batch_size,
        ctx.wake_up()
    );
    if let Some(url) = &a.sink_url {
        println!(
            "  and the relay into {} (latency stamped per reader poll)",
            outbox_core::redact::url(url)
        );
    }
}

/// The backlog of `keys` keys drained into the sink `url`, then into the discarding sink (the
/// engine alone), each printed.
pub(super) async fn sink_and_engine(
    ctx: &Ctx,
    url: &str,
    keys: usize,
) -> anyhow::Result<(Option<Drain>, Option<Drain>)> {
    let (d, orders_keys) = sink_drain(ctx, url, keys).await?;
    println!("  keys {keys:>6}  sink:  {}", line(&d));
    let e = engine_drain(ctx, keys, orders_keys).await?;
    println!(
        "  keys {keys:>6}  engine alone (discarding sink): {}",
        line(&e)
    );
    Ok((Some(d), Some(e)))
}

/// Fills, analyses and drains a backlog of `--rows` with the relay in a scratch schema.
pub(crate) async fn relay_drain(ctx: &Ctx, keys: usize) -> anyhow::Result<Drain> {
    let scratch = Scratch::with_outbox(&ctx.pool, &ctx.js, ctx.options.storage, "relay").await?;
    let result = relay_drain_in(ctx, &scratch, keys).await;
    scratch.drop().await;
    result
}

async fn relay_drain_in(ctx: &Ctx, scratch: &Scratch, keys: usize) -> anyhow::Result<Drain> {
    let rows = ctx.options.rows;
    let probe = Probe::start(&scratch.js, &scratch.stream).await?;
    fill_analysed(ctx, scratch, keys, &probe, true).await?;
    let sink = outbox_sinks::connect(&ctx.options.nats_url).await?;
    let destination =
        DestinationTemplate::parse(&format!("{}.{{event_type}}", scratch.subject_prefix))?;
    let timing = timed_drain(ctx, scratch, sink, destination).await?;
    finish(scratch, probe, rows as u64, timing).await
}

/// Fills, analyses and drains a backlog of `--rows` with the relay into the sink `url`, in a
/// scratch schema and a scratch destination of that sink; the sink's own reader checks that
/// every message arrived. Also says whether the sink orders keys itself.
async fn sink_drain(ctx: &Ctx, url: &str, keys: usize) -> anyhow::Result<(Drain, bool)> {
    let scratch = Scratch::with_outbox(&ctx.pool, &ctx.js, ctx.options.storage, "sink").await?;
    let result = sink_drain_in(ctx, url, &scratch, keys).await;
    scratch.drop().await;
    result
}

async fn sink_drain_in(
    ctx: &Ctx,
    url: &str,
    scratch: &Scratch,
    keys: usize,
) -> anyhow::Result<(Drain, bool)> {
    let rows = ctx.options.rows;
    let mut options = outbox_sinks::read::ScratchOptions::new("bench");
    options.durable = ctx.options.storage.durable();
    let place = outbox_sinks::read::scratch(url, &options).await?;
    let probe = Probe::from_reader(place.reader);
    fill_analysed(ctx, scratch, keys, &probe, true).await?;
    let sink = outbox_sinks::connect(&place.sink_url).await?;
    let orders_keys = sink.orders_keys();
    let destination = DestinationTemplate::parse(&place.destination)?;
    let timing = timed_drain(ctx, scratch, sink, destination).await?;
    let missing = probe.drain(Duration::from_secs(120)).await;
    let latency = probe.finish().await;
    if missing > 0 {
        anyhow::bail!(
            "the sink's reader misses {missing} of {rows} messages (none arrived for 120 s)"
        );
    }
    Ok((Drain::drained(rows as u64, &timing, latency), orders_keys))
}

/// Fills, analyses and drains a backlog of `--rows` into the discarding sink, which
/// acknowledges each message as it is handed over: the engine's own ceiling.
async fn engine_drain(ctx: &Ctx, keys: usize, orders_keys: bool) -> anyhow::Result<Drain> {
    let scratch = Scratch::with_outbox(&ctx.pool, &ctx.js, ctx.options.storage, "engine").await?;
    let result = engine_drain_in(ctx, &scratch, keys, orders_keys).await;
    scratch.drop().await;
    result
}

async fn engine_drain_in(
    ctx: &Ctx,
    scratch: &Scratch,
    keys: usize,
    orders_keys: bool,
) -> anyhow::Result<Drain> {
    let rows = ctx.options.rows;
    let probe = Probe::recorded_elsewhere();
    fill_analysed(ctx, scratch, keys, &probe, false).await?;
    let sink = Arc::new(DiscardSink::new(probe.latency(), orders_keys));
    let destination = DestinationTemplate::parse("bench.discarded")?;
    let timing = timed_drain(ctx, scratch, sink, destination).await?;
    let missing = probe.latency().outstanding();
    let latency = probe.finish().await;
    if missing > 0 {
        anyhow::bail!("the discarding sink was never handed {missing} of {rows} messages");
    }
    Ok(Drain::drained(rows as u64, &timing, latency))
}

/// Fills the scratch outbox with `--rows` over `keys` keys, recording commits in `probe`'s
/// ledger, and analyses it unless `--no-analyze`; prints the fill rate when `report`.
pub(crate) async fn fill_analysed(
    ctx: &Ctx,
    scratch: &Scratch,
    keys: usize,
    probe: &Probe,
    report: bool,
) -> anyhow::Result<()> {
    let rows = ctx.options.rows;
    let took = fill(
        &scratch.pool,
        &scratch.schema,
        rows,
        keys,
        &ctx.pad(),
        &probe.latency(),
    )
    .await?;
    if report {
        println!(
            "  keys {keys:>6}  filled {rows} rows in {:.2} s ({:.0} rows/s)",
            took.as_secs_f64(),
            rows as f64 / took.as_secs_f64()
        );
    }
    if ctx.options.analyze {
        scratch.analyze().await?;
    }
    Ok(())
}

/// Runs the relay into `sink` until it has published the whole backlog; returns how long that
/// took from the relay's start, and when 10% and 90% of it were published.
async fn timed_drain(
    ctx: &Ctx,
    scratch: &Scratch,
    sink: Arc<dyn outbox_core::Sink>,
    destination: DestinationTemplate,
) -> anyhow::Result<DrainTiming> {
    let relay = RelayUnderTest::start_with(ctx, scratch, sink, destination);
    measured_drain(ctx.options.rows as u64, relay).await
}

/// Starts the relay `start` makes and waits until it published `rows`; times it from before
/// the start and reads CPU per message before the relay stops: its server processes (pool
/// backends, a WAL sender) end with it, and their CPU would be lost.
pub(crate) async fn measured_drain(
    rows: u64,
    start: impl std::future::Future<Output = anyhow::Result<RelayUnderTest>>,
) -> anyhow::Result<DrainTiming> {
    let started = Instant::now();
    let meter = CpuMeter::start();
    let relay = start.await?;
    let drained = wait_published(relay.metrics(), rows, started).await;
    let cpu = meter.per_message(rows);
    relay.stop().await;
    drained.map(|mut t| {
        t.cpu = cpu;
        t
    })
}

/// Fills and drains `rows` with the naive relay, in a scratch schema holding only its table
/// (raw baseline, excepted by issue 47: the `naive` module's SQL).
pub(super) async fn naive_drain(ctx: &Ctx, keys: usize, rows: usize) -> anyhow::Result<Drain> {
    let scratch = Scratch::new(&ctx.pool, &ctx.js, ctx.options.storage, "naive").await?;
    let result = naive_drain_in(ctx, &scratch, keys, rows).await;
    scratch.drop().await;
    result
}

async fn naive_drain_in(
    ctx: &Ctx,
    scratch: &Scratch,
    keys: usize,
    rows: usize,
) -> anyhow::Result<Drain> {
    naive::create(&scratch.pool, &scratch.schema).await?;
    let probe = Probe::start(&scratch.js, &scratch.stream).await?;
    naive::fill(
        &scratch.pool,
        &scratch.schema,
        rows,
        keys,
        &ctx.pad(),
        &probe.latency(),
    )
    .await?;
    if ctx.options.analyze {
        scratch.analyze().await?;
    }
    let meter = CpuMeter::start();
    let (took, published) = naive::drain(
        &scratch.pool,
        &scratch.schema,
        &scratch.js,
        &scratch.subject_prefix,
    )
    .await?;
    if published != rows as u64 {
        anyhow::bail!("the naive relay published {published} of {rows} rows");
    }
    let timing = DrainTiming {
        took,
        tenth: None,
        ninth_tenth: None,
        cpu: meter.per_message(published),
    };
    finish(scratch, probe, rows as u64, timing).await
}

/// Waits for the probe to see every message, checks the stream, and assembles the figures.
pub(crate) async fn finish(
    scratch: &Scratch,
    probe: Probe,
    rows: u64,
    timing: DrainTiming,
) -> anyhow::Result<Drain> {
    finish_with(probe, rows, timing, scratch.stream_messages()).await
}
