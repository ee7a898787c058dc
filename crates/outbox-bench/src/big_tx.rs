//! Big-tx mode: one transaction of `--rows` rows (1,000,000 for the figures in the docs), open
//! while the relay drains other keys and then committed, against the same rows written as 1,000
//! transactions, side by side in one run, each in a fresh scratch schema with a relay draining
//! to NATS and a paced load of other keys (`--rate`, default 1,000 events/s) flowing throughout.
//!
//! Per run: the steady drain rate of those rows once all of them are committed (from 10% of them
//! at the broker, or from the last commit when more were out by then, to 90%), the time from
//! the first commit to the last row at the broker, and the relay's claim times over the drain
//! (p50, p99 from its buckets, and the longest of the run). The thousand transactions' first
//! rows go out while later ones are still written: a rate from their first commit would count
//! rows drained before the watch began, or a drain slowed by its own writing. Targets: the big transaction drains at 80% or more of the
//! small ones' rate, and no claim takes more than 100 ms.
//!
//! Beside the claims, the machine's own floor in the same run, on a connection of its own: a
//! `SELECT 1` round trip every 20 ms (what any statement waits for the cores at that moment),
//! and every twelfth time instead (every 240 ms) a read of a batch's worth of rows (`--batch-size`, with the bench's
//! payloads) from a small table nothing writes to: a claim's reading and decoding without the
//! engine's logic. A claim that takes as long as that read did at the same moment lost its
//! time to the machine, not to the engine.

use std::time::Duration;

use outbox_db::tools::postgres::Writer;
use outbox_relay::{ClaimTimes, ClaimTimesSnapshot};
use serde::Serialize;
use sqlx::Connection;

use crate::cpu::{CpuMeter, CpuPerMessage};
use crate::latency::Probe;
use crate::load::{message, paced, Paced};
use crate::relay::RelayUnderTest;
use crate::scratch::Scratch;
use crate::{verdict, Ctx, Report};

/// Target: the big transaction's rate over the small ones'.
const RATE_TARGET: f64 = 0.8;
/// Target: the longest claim.
const CLAIM_TARGET_MS: f64 = 100.0;
/// Rows per statement while the big transaction is written.
const CHUNK: usize = 1000;
/// Transactions the same rows are written as in the baseline.
const SMALL_TRANSACTIONS: usize = 1000;
/// Connections writing the baseline's transactions at once.
const WRITERS: usize = 4;

/// The `i`-th measured row: keys of their own, apart from the other keys' load.
fn bulk(i: usize, keys: usize, pad: &str) -> outbox_core::NewMessage {
    let mut m = message(i, keys, pad);
    m.aggregate_id = format!("bulk-{}", i % keys.max(1));
    m
}

/// Figures of one run.
#[derive(Debug, Serialize)]
struct Run {
    /// "one transaction" or "1000 transactions".
    written_as: String,
    rows: usize,
    /// Seconds the rows took to write (the big transaction: until its commit returned).
    write_seconds: f64,
    /// Rows/s at the broker once every row was committed, from 10% of them (or from the last
    /// commit, when more were out by then) to 90%.
    steady_events_per_second: Option<f64>,
    /// 90% of the rows were at the broker before the last of them committed: the relay kept
    /// pace with the writing, and there is no drain of committed rows to time.
    kept_pace: bool,
    /// Seconds from the first of them committed to the last one at the broker.
    drain_seconds: f64,
    claims: u64,
    claim_p50_ms: Option<f64>,
    claim_p99_ms: Option<f64>,
    claim_max_ms: f64,
    /// The machine's floor over the same drain: a `SELECT 1` round trip every 20 ms on a
    /// connection of its own (p50, p99 from the same buckets as the claims, the longest).
    floor: Floor,
    /// A batch's worth of rows read from a static table every 240 ms on that connection.
    batch_read: Floor,
    /// Rows that never reached the broker.
    undelivered: u64,
    /// CPU each row cost the relay, PostgreSQL and the broker until the last row reached the
    /// broker, the other keys' load included: from the commit for the one transaction; from
    /// the first write for the thousand, whose writing overlaps their drain and is counted
    /// with it (this process writes them: the relay's share is the higher for it).
    cpu: Option<CpuPerMessage>,
}

/// Runs big-tx mode.
pub async fn run(ctx: &Ctx) -> anyhow::Result<Report> {
    let rows = ctx.options.rows;
    let keys = ctx.single_keys()?;
    println!(
        "outbox bench: big-tx, {rows} rows over {keys} keys written as one transaction and as \
         {SMALL_TRANSACTIONS} transactions, other keys flowing at {} events/s; relay {} workers, \
         batch {}, {}",
        ctx.options.rate,
        ctx.options.workers,
        ctx.options.batch_size,
        ctx.wake_up()
    );
    let small = one_run(ctx, rows, keys, false).await?;
    print_run(&small);
    let big = one_run(ctx, rows, keys, true).await?;
    print_run(&big);
    let ratio = match (big.steady_events_per_second, small.steady_events_per_second) {
        (Some(b), Some(s)) if s > 0.0 => Some(b / s),
        _ => None,
    };
    let worst = big.claim_max_ms.max(small.claim_max_ms);
    println!(
        "  big over small: {} (target >= {RATE_TARGET}: {}); longest claim {worst:.1} ms \
         (target <= {CLAIM_TARGET_MS} ms: {}); undelivered {}",
        ratio.map_or("n/a".into(), |r| format!("{r:.2}")),
        verdict(ratio.is_some_and(|r| r >= RATE_TARGET)),
        verdict(worst <= CLAIM_TARGET_MS),
        big.undelivered + small.undelivered
    );
    let floor = big.batch_read.max_ms.max(small.batch_read.max_ms);
    println!(
        "  the machine's floor in the same runs: reading a batch of rows from a table nothing \
         writes to took up to {floor:.1} ms{}",
        if worst > CLAIM_TARGET_MS && floor > CLAIM_TARGET_MS {
            format!(
                ": the machine itself took longer than the {CLAIM_TARGET_MS} ms claim target to \
                 read a batch"
            )
        } else {
            String::new()
        }
    );
    Ok(Report::line(
        serde_json::json!({ "mode": "big-tx", "rows": rows, "keys": keys,
                            "small": small, "big": big, "big_over_small": ratio }),
    ))
}

/// How many measured rows had reached the broker, sampled every 20 ms until 90% of `total`
/// had or `stop` is cancelled.
async fn delivered_over_time(
    ledger: std::sync::Arc<crate::latency::Latency>,
    total: u64,
    stop: tokio_util::sync::CancellationToken,
) -> Vec<(tokio::time::Instant, u64)> {
    let mut samples = Vec::new();
    while !stop.is_cancelled() {
        let done = ledger.delivered();
        samples.push((tokio::time::Instant::now(), done));
        if done * 10 >= total * 9 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    samples
}

/// The drain rate from the later of `committed` (every row committed) and 10% of `total`
/// delivered, to 90% delivered: the relay's rate over rows that are all there to claim, for the
/// one transaction and the thousand alike (the thousand's first rows go out while later ones
/// are still written, and compete with their writing for the same cores).
fn steady_rate(
    samples: &[(tokio::time::Instant, u64)],
    committed: tokio::time::Instant,
    total: u64,
) -> Option<f64> {
    let from = samples
        .iter()
        .find(|(t, d)| *t >= committed && d * 10 >= total)?;
    let to = samples.iter().find(|(_, d)| d * 10 >= total * 9)?;
    let secs = (to.0 - from.0).as_secs_f64();
    (secs > 0.0 && to.1 > from.1).then(|| (to.1 - from.1) as f64 / secs)
}

fn print_run(r: &Run) {
    println!(
        "  {:<18} written in {:.1} s; drained at {} events/s (all committed, up to 90% out), all \
         in {:.1} s after the first commit; claims: {} (p50 {} ms, p99 {} ms, longest {:.1} ms); undelivered {}",
        r.written_as,
        r.write_seconds,
        r.steady_events_per_second.map_or_else(
            || if r.kept_pace { "n/a (kept pace with the writing)".into() } else { "n/a".into() },
            |v| format!("{v:.0}")
        ),
        r.drain_seconds,
        r.claims,
        r.claim_p50_ms.map_or("n/a".into(), |v| format!("{v:.2}")),
        r.claim_p99_ms.map_or("n/a".into(), |v| format!("{v:.2}")),
        r.claim_max_ms,
        r.undelivered
    );
    println!(
        "    the machine's floor over the same drain: {} `SELECT 1` round trips {}; {} reads of a \
         batch of rows from a static table {}",
        r.floor.round_trips,
        r.floor.line(),
        r.batch_read.round_trips,
        r.batch_read.line()
    );
    if let Some(c) = r.cpu {
        println!("    {}", c.line());
    }
}

/// Times of one kind of statement on the floor's connection, taken while a drain runs.
#[derive(Debug, Default, Serialize)]
struct Floor {
    round_trips: u64,
    p50_ms: Option<f64>,
    p99_ms: Option<f64>,
    max_ms: f64,
    /// Statements that took longer than the claim target.
    over_target: u64,
}

impl Floor {
    fn line(&self) -> String {
        format!(
            "(p50 {} ms, p99 {} ms, longest {:.1} ms, {} over {CLAIM_TARGET_MS} ms)",
            self.p50_ms.map_or("n/a".into(), |v| format!("{v:.2}")),
            self.p99_ms.map_or("n/a".into(), |v| format!("{v:.2}")),
            self.max_ms,
            self.over_target
        )
    }

    fn of(times: &ClaimTimesSnapshot, over_target: u64) -> Self {
        Self {
            round_trips: times.count(),
            p50_ms: times.quantile_ms(0.5),
            p99_ms: times.quantile_ms(0.99),
            max_ms: times.max_micros as f64 / 1e3,
            over_target,
        }
    }
}

/// Times, on a connection of its own until `stop`, a `SELECT 1` every 20 ms and a read of
/// `batch` rows like the outbox's (`pad` as payload) from a temporary table every 240 ms: what
/// a statement, and a claim's reading and decoding, cost at that moment on this machine.
async fn machine_floor(
    url: String,
    batch: usize,
    pad: String,
    stop: tokio_util::sync::CancellationToken,
) -> anyhow::Result<(Floor, Floor)> {
    let options =
        outbox_db::tools::postgres::connect_options(&url)?.application_name("outbox_bench_floor");
    let mut conn = sqlx::PgConnection::connect_with(&options).await?;
    sqlx::query(
        "CREATE TEMPORARY TABLE floor_rows AS SELECT gen_random_uuid() AS id, \
         'bulk-' || (i % 1000) AS aggregate_id, 'order.placed' AS event_type, \
         jsonb_build_object('i', i, 'pad', $2::text) AS payload, '{}'::jsonb AS headers, \
         i::bigint AS seq FROM generate_series(1, $1::int) AS i",
    )
    .bind(i32::try_from(batch).unwrap_or(i32::MAX))
    .bind(&pad)
    .execute(&mut conn)
    .await?;
    sqlx::query("ANALYZE floor_rows").execute(&mut conn).await?;
    let (trips, reads) = (ClaimTimes::default(), ClaimTimes::default());
    let (mut trips_over, mut reads_over) = (0, 0);
    let target = Duration::from_secs_f64(CLAIM_TARGET_MS / 1e3);
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut n: u64 = 0;
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            _ = tick.tick() => {}
        }
        n += 1;
        let started = std::time::Instant::now();
        // Every twelfth tick reads the batch instead: often enough to meet the slow moments of
        // a drain, rarely enough to add little load (a batch every 240 ms).
        let (times, over) = if n.is_multiple_of(12) {
            let rows: Vec<(uuid::Uuid, String, String, String, String, i64)> = sqlx::query_as(
                "SELECT id, aggregate_id, event_type, payload::text, headers::text, seq \
                 FROM floor_rows ORDER BY seq",
            )
            .fetch_all(&mut conn)
            .await?;
            debug_assert_eq!(rows.len(), batch);
            (&reads, &mut reads_over)
        } else {
            sqlx::query("SELECT 1").execute(&mut conn).await?;
            (&trips, &mut trips_over)
        };
        let took = started.elapsed();
        if took > target {
            *over += 1;
        }
        times.record(u64::try_from(took.as_micros()).unwrap_or(u64::MAX));
    }
    conn.close().await.ok();
    Ok((
        Floor::of(&trips.snapshot(), trips_over),
        Floor::of(&reads.snapshot(), reads_over),
    ))
}

async fn one_run(ctx: &Ctx, rows: usize, keys: usize, one: bool) -> anyhow::Result<Run> {
    let scratch = Scratch::with_outbox(&ctx.pool, &ctx.js, ctx.options.storage, "bigtx").await?;
    let result = measure(ctx, &scratch, rows, keys, one).await;
    scratch.drop().await;
    result
}

async fn measure(
    ctx: &Ctx,
    scratch: &Scratch,
    rows: usize,
    keys: usize,
    one: bool,
) -> anyhow::Result<Run> {
    // Long because: its steps share the relay, three background tasks and their stop tokens.
    // The probe's ledger holds the measured rows only; the other keys' load records its
    // commits in a ledger of its own (their receipts reach the probe as unknown ids).
    let probe = Probe::start(&scratch.js, &scratch.stream).await?;
    let ledger = probe.latency();
    let others_ledger = Probe::recorded_elsewhere().latency();
    let relay = RelayUnderTest::start(ctx, scratch).await?;
    relay.settle().await;
    let stop_others = tokio_util::sync::CancellationToken::new();
    let others = {
        let spec = Paced {
            rate: ctx.options.rate,
            producers: 4,
            duration: Duration::from_secs(24 * 3600),
            keys: 1000,
            pad: ctx.pad(),
        };
        let (pool, schema, stop) = (
            scratch.pool.clone(),
            scratch.schema.clone(),
            stop_others.clone(),
        );
        tokio::spawn(async move {
            tokio::select! {
                r = paced(&pool, &schema, &spec, &others_ledger) => r.map(|_| ()),
                () = stop.cancelled() => Ok(()),
            }
        })
    };
    let writer = Writer::new(&scratch.schema);
    let pad = ctx.pad();
    // Watched from before the first write: the small transactions' rows reach the broker while
    // later ones are still being written, so 10% of them can be out before the writing ends.
    let stop_watch = tokio_util::sync::CancellationToken::new();
    let watch = tokio::spawn(delivered_over_time(
        ledger.clone(),
        rows as u64,
        stop_watch.clone(),
    ));
    let stop_floor = tokio_util::sync::CancellationToken::new();
    let floor = tokio::spawn(machine_floor(
        ctx.options.database_url.clone(),
        ctx.options.batch_size,
        ctx.pad(),
        stop_floor.clone(),
    ));
    let written = tokio::time::Instant::now();
    let mut meter = CpuMeter::start();
    let claims_before = relay.metrics().claim_times.snapshot();
    let first_commit;
    if one {
        let mut tx = scratch.pool.begin().await?;
        // The ids are registered as they are written, a chunk at a time: recording a million
        // after the commit held the ledger's lock while it inserted every one, with the reader
        // blocked on it, and so stalled the runtime the relay under test shares, right when
        // the drain began.
        let expected = ledger.expect();
        for start in (0..rows).step_by(CHUNK) {
            let msgs: Vec<_> = (start..(start + CHUNK).min(rows))
                .map(|i| bulk(i, keys, &pad))
                .collect();
            writer.enqueue_many(&mut tx, &msgs).await?;
            ledger.expect_more(expected, msgs.iter().map(|m| m.id));
        }
        let sent = ledger.stamp();
        first_commit = tokio::time::Instant::now();
        // Writing the rows is not the drain's cost: count from the commit.
        meter = CpuMeter::start();
        tx.commit().await?;
        ledger.committed_expected(expected, sent);
    } else {
        // Four writers at once, as `fill` writes a backlog: the rows commit faster than the
        // relay drains them, so the rate measured is the relay's, not the writers'.
        let per = rows.div_ceil(SMALL_TRANSACTIONS).max(1);
        let starts: Vec<usize> = (0..rows).step_by(per).collect();
        let first = std::sync::Arc::new(std::sync::OnceLock::new());
        let mut tasks = Vec::new();
        for part in starts.chunks(starts.len().div_ceil(WRITERS).max(1)) {
            let (pool, writer, ledger, first, part) = (
                scratch.pool.clone(),
                writer.clone(),
                ledger.clone(),
                first.clone(),
                part.to_vec(),
            );
            let (pad, keys) = (pad.clone(), keys);
            tasks.push(tokio::spawn(async move {
                for start in part {
                    let msgs: Vec<_> = (start..(start + per).min(rows))
                        .map(|i| bulk(i, keys, &pad))
                        .collect();
                    let mut tx = pool.begin().await?;
                    writer.enqueue_many(&mut tx, &msgs).await?;
                    let sent = ledger.stamp();
                    first.get_or_init(tokio::time::Instant::now);
                    tx.commit().await?;
                    ledger.committed(msgs.iter().map(|m| m.id), sent);
                }
                anyhow::Ok(())
            }));
        }
        for t in tasks {
            t.await??;
        }
        first_commit = first
            .get()
            .copied()
            .unwrap_or_else(tokio::time::Instant::now);
    }
    let write_seconds = written.elapsed().as_secs_f64();
    let all_committed = tokio::time::Instant::now();
    // Follow the drain to its end (every row is committed now), or until it stalls.
    let total = rows as u64;
    let mut last_left = ledger.outstanding();
    let mut progress_at = tokio::time::Instant::now();
    loop {
        let left = ledger.outstanding();
        let now = tokio::time::Instant::now();
        if left < last_left {
            last_left = left;
            progress_at = now;
        }
        if left == 0 || now - progress_at > Duration::from_secs(120) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let drained = tokio::time::Instant::now();
    stop_watch.cancel();
    let delivered = watch.await?;
    let cpu = meter.per_message(rows as u64);
    let claims = relay.metrics().claim_times.snapshot().since(&claims_before);
    stop_floor.cancel();
    let (floor, batch_read) = floor.await??;
    stop_others.cancel();
    others.await??;
    relay.stop().await;
    let undelivered = ledger.outstanding();
    drop(probe);
    let steady = steady_rate(&delivered, all_committed, total);
    let kept_pace = delivered
        .iter()
        .any(|(t, d)| *t < all_committed && d * 10 >= total * 9);
    Ok(Run {
        written_as: if one {
            "one transaction".into()
        } else {
            format!("{SMALL_TRANSACTIONS} transactions")
        },
        rows,
        write_seconds,
        steady_events_per_second: steady,
        kept_pace,
        drain_seconds: (drained - first_commit).as_secs_f64(),
        claims: claims.count(),
        claim_p50_ms: claims.quantile_ms(0.5),
        claim_p99_ms: claims.quantile_ms(0.99),
        claim_max_ms: claims.max_micros as f64 / 1e3,
        floor,
        batch_read,
        undelivered,
        cpu,
    })
}
