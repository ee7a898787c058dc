//! Backlog mode: for each key count, fill a backlog, `ANALYZE` it (production tables have
//! statistics), drain it with the relay, then do the same with the naive relay on its own
//! seed-style table, and compare events/s.
//!
//! With `--sink`, the same backlog is also drained into the bench's discarding sink (see
//! the `discard` module): the engine alone, so the report says whether the sink or the engine
//! sets the pace.
//!
//! Drain time runs from starting the relay to the relay's `published` counter reaching the
//! backlog (every message acknowledged by the broker); the stream is then checked to hold
//! exactly the backlog. Beside it, in parentheses, the steady rate: from 10% to 90% of the
//! backlog published, without the relay's start-up and its last partial batches. Latency is commit→ack at the broker, so it includes the time a row
//! waited in the backlog.

use std::sync::Arc;
use std::time::{Duration, Instant};

use outbox_core::DestinationTemplate;
use outbox_relay::RelayMetrics;
use serde::Serialize;

use crate::cpu::CpuMeter;
use crate::discard::DiscardSink;
use crate::latency::Probe;
use crate::load::fill;
use crate::relay::RelayUnderTest;
use crate::scratch::Scratch;
use crate::{naive, Ctx, Drain, DrainTiming, Report};

/// How long a drain may publish nothing before the run is abandoned: a relay that makes
/// progress is waited for, however slow its sink (SQS with one key publishes a few hundred a
/// second, so 200,000 rows take many minutes).
const DRAIN_STALL: Duration = Duration::from_secs(120);

/// Longest a drain may take in all, progress or not.
const DRAIN_LIMIT: Duration = Duration::from_secs(3600);

/// The figures of one key count.
#[derive(Debug, Serialize)]
struct Run {
    keys: usize,
    relay: Drain,
    /// The relay draining the same backlog into `--sink`, when one other than NATS is given.
    sink: Option<Drain>,
    /// The same backlog into a sink that acknowledges at once (with `--sink`): the engine's
    /// own ceiling beside it.
    engine: Option<Drain>,
    naive: Option<Drain>,
    /// Relay events/s over naive events/s.
    speedup: Option<f64>,
}

/// Runs backlog mode.
pub async fn run(ctx: &Ctx) -> anyhow::Result<Report> {
    let a = &ctx.options;
    let naive_rows = a.naive_rows.unwrap_or(a.rows.min(20_000));
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
    if let Some(url) = &ctx.options.sink_url {
        println!(
            "  and the relay into {} (latency stamped per reader poll)",
            outbox_core::redact::url(url)
        );
    }
    let mut runs = Vec::new();
    for &keys in &a.keys {
        let (sink, engine) = match &ctx.options.sink_url {
            Some(url) => {
                let (d, orders_keys) = sink_drain(ctx, url, keys).await?;
                println!("  keys {keys:>6}  sink:  {}", line(&d));
                let e = engine_drain(ctx, keys, orders_keys).await?;
                println!(
                    "  keys {keys:>6}  engine alone (discarding sink): {}",
                    line(&e)
                );
                (Some(d), Some(e))
            }
            None => (None, None),
        };
        let relay = relay_drain(ctx, keys).await?;
        println!("  keys {keys:>6}  relay: {}", line(&relay));
        let naive = if a.naive {
            let n = naive_drain(ctx, keys, naive_rows).await?;
            println!("  keys {keys:>6}  naive: {}", line(&n));
            Some(n)
        } else {
            None
        };
        let speedup = naive
            .as_ref()
            .map(|n| relay.events_per_second / n.events_per_second);
        runs.push(Run {
            keys,
            relay,
            sink,
            engine,
            naive,
            speedup,
        });
    }
    print_summary(&runs);
    Ok(Report::line(
        serde_json::json!({ "mode": "backlog", "rows": a.rows, "naive_rows": naive_rows,
                            "analyze": a.analyze, "listen": a.listen, "runs": runs }),
    ))
}

pub(crate) fn line(d: &Drain) -> String {
    let steady = d
        .steady_events_per_second
        .map_or(String::new(), |s| format!(" ({s:.0} from 10% to 90%)"));
    let cpu = d.cpu.map_or(String::new(), |c| format!("; {}", c.line()));
    format!(
        "{} events in {:.2} s = {:>7.0} events/s{steady}; commit→ack {} (backlog wait \
         included){cpu}",
        d.events,
        d.seconds,
        d.events_per_second,
        d.latency.line()
    )
}

fn print_summary(runs: &[Run]) {
    println!(
        "  events/s over the whole drain (from 10% to 90% of it); relay/naive compares whole \
         drains, sink/engine the steady rates"
    );
    println!(
        "  keys            relay ev/s  naive ev/s  relay/naive           sink ev/s         engine ev/s  sink/engine"
    );
    for r in runs {
        let naive = r
            .naive
            .as_ref()
            .map_or("-".into(), |n| format!("{:.0}", n.events_per_second));
        let ratio = r.speedup.map_or("-".into(), |s| format!("{s:.1}x"));
        let sink = r.sink.as_ref().map_or("-".into(), Drain::rate);
        let engine = r.engine.as_ref().map_or("-".into(), Drain::rate);
        let share = match (&r.sink, &r.engine) {
            (Some(s), Some(e)) => format!("{:.2}", s.best_rate() / e.best_rate()),
            _ => "-".into(),
        };
        println!(
            "  {:>6}  {:>20}  {naive:>10}  {ratio:>11}  {sink:>18}  {engine:>18}  {share:>11}",
            r.keys,
            r.relay.rate()
        );
    }
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

/// Fills and drains `rows` with the naive relay, in a scratch schema holding only its table.
async fn naive_drain(ctx: &Ctx, keys: usize, rows: usize) -> anyhow::Result<Drain> {
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
    let missing = probe.drain(Duration::from_secs(60)).await;
    let latency = probe.finish().await;
    let in_stream = scratch.stream_messages().await?;
    if in_stream != rows || missing > 0 {
        anyhow::bail!(
            "the stream holds {in_stream} messages and the probe misses {missing}; expected {rows}"
        );
    }
    Ok(Drain::drained(rows, &timing, latency))
}

/// Waits for the relay's `published` counter to reach `target`, noting when it passed 10% and
/// 90% of it (every 5 ms, so a drain of a second or more is timed to within 1%). Gives up when
/// nothing was published for [`DRAIN_STALL`], or after [`DRAIN_LIMIT`] in all.
pub(crate) async fn wait_published(
    metrics: &RelayMetrics,
    target: u64,
    started: Instant,
) -> anyhow::Result<DrainTiming> {
    let mut timing = DrainTiming {
        took: Duration::ZERO,
        tenth: None,
        ninth_tenth: None,
        cpu: None,
    };
    let mut last = (0, started);
    loop {
        let published = RelayMetrics::get(&metrics.published);
        if timing.tenth.is_none() && published * 10 >= target {
            timing.tenth = Some(started.elapsed());
        }
        if timing.ninth_tenth.is_none() && published * 10 >= target * 9 {
            timing.ninth_tenth = Some(started.elapsed());
        }
        if published >= target {
            timing.took = started.elapsed();
            return Ok(timing);
        }
        let now = Instant::now();
        if published > last.0 {
            last = (published, now);
        }
        if let Some(why) = drain_given_up(now - started, now - last.1) {
            anyhow::bail!("gave up {why}: {published} of {target} published");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Why a drain that has run for `elapsed`, the last `stalled` of it without publishing, is
/// abandoned; `None` while it may go on.
fn drain_given_up(elapsed: Duration, stalled: Duration) -> Option<String> {
    if stalled > DRAIN_STALL {
        Some(format!("after {DRAIN_STALL:?} without progress"))
    } else if elapsed > DRAIN_LIMIT {
        Some(format!("after {DRAIN_LIMIT:?} in all"))
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slow_drain_that_keeps_publishing_is_waited_for() {
        // Twenty minutes in, last published a second ago: SQS with one key looks like this.
        assert_eq!(
            drain_given_up(Duration::from_secs(1200), Duration::from_secs(1)),
            None
        );
    }

    #[test]
    fn a_drain_that_stalls_or_runs_past_the_limit_is_abandoned_and_says_which() {
        let stalled = drain_given_up(Duration::from_secs(300), Duration::from_secs(121)).unwrap();
        assert!(stalled.contains("without progress"), "{stalled}");
        let too_long = drain_given_up(Duration::from_secs(3601), Duration::ZERO).unwrap();
        assert!(too_long.contains("in all"), "{too_long}");
    }
}
