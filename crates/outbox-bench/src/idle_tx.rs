//! Idle-tx mode: the steady load run twice back to back, each in a fresh scratch schema with a
//! relay draining to NATS: first with nothing else open, then with a `REPEATABLE READ`
//! transaction that took its snapshot held open on a separate connection for the whole run
//! (a forgotten `BEGIN` in a console, a long report). A held snapshot pins the xmin horizon:
//! no row version that died after it can be removed, so an engine that UPDATEs or DELETEs
//! messages makes its claims read ever more dead versions.
//!
//! Per run: commit→ack at the broker (p50/p99/max), the achieved write rate, the relay's mean
//! claim cost (`claim_micros / claims` from its metrics) over the first and the last 10% of the
//! load and their ratio, and the dead tuples of the message table and its partitions as
//! `pg_stat_user_tables` reports them about a second after the drain (the snapshot still held),
//! and the floor audit's count of rows below their window's seq floor (0 unless the engine's
//! floor is read wrong), every 5 s.

use std::time::Duration;

use anyhow::Context as _;
use serde::Serialize;
use sqlx::{Connection as _, PgConnection};

use crate::latency::{LatencyFigures, Probe};
use crate::load::{paced, Paced, Produced};
use crate::relay::{ClaimCost, RelayUnderTest};
use crate::scratch::{DeadTuples, Scratch};
use crate::{sql, verdict, Ctx, Report};

/// Default length of each of the two runs.
const DEFAULT_DURATION: Duration = Duration::from_secs(600);
/// Target: p99 with the snapshot held over p99 without.
const P99_TARGET: f64 = 3.0;
/// Target: mean claim cost over the last 10% of the held run over its first 10%.
const CLAIM_TARGET: f64 = 1.5;

/// Figures of one run.
#[derive(Debug, Serialize)]
struct Run {
    held_snapshot: bool,
    produced: Produced,
    latency: LatencyFigures,
    /// Committed messages that had not reached the stream when the drain gave up.
    undelivered: u64,
    /// The most rows the floor audit found below their window's seq floor (where claims pass
    /// over them) in any of its passes, one every 5 s during the load and one after the drain.
    rows_below_floor: u64,
    floor_audits: u64,
    claim_first_10pct: ClaimCost,
    claim_last_10pct: ClaimCost,
    claim_end_over_start: Option<f64>,
    dead_tuples: DeadTuples,
    /// Transaction ids consumed since the held snapshot was taken (`age(backend_xmin)`).
    held_xmin_age: Option<i32>,
    /// Other sessions of this database holding a snapshot older than 5 s when the run began:
    /// they hold the horizon too, for both runs.
    other_snapshots_at_start: i64,
}

/// Runs idle-tx mode.
pub async fn run(ctx: &Ctx) -> anyhow::Result<Report> {
    let spec = Paced {
        rate: ctx.options.rate,
        producers: ctx.options.producers,
        duration: ctx.duration(DEFAULT_DURATION),
        keys: ctx.single_keys()?,
        pad: ctx.pad(),
    };
    println!(
        "outbox bench: idle-tx, {} events/s for {:?} per run over {} connections, {}; \
         run 1 without, run 2 with a REPEATABLE READ snapshot held open",
        spec.rate,
        spec.duration,
        spec.producers,
        ctx.wake_up()
    );
    let autovacuum: String = sqlx::query_scalar(sql::SHOW_AUTOVACUUM)
        .fetch_one(&ctx.pool)
        .await?;
    if autovacuum != "on" {
        println!("  note: autovacuum is {autovacuum} on this server: only page pruning and index hints reclaim dead tuples, in both runs");
    }
    let without = one_run(ctx, &spec, false).await?;
    print_run("without", &without);
    let with = one_run(ctx, &spec, true).await?;
    print_run("with held snapshot", &with);
    Ok(report(ctx, &without, &with))
}

async fn one_run(ctx: &Ctx, spec: &Paced, hold: bool) -> anyhow::Result<Run> {
    let scratch = Scratch::with_outbox(&ctx.pool, &ctx.js, ctx.options.storage, "idletx").await?;
    let result = measure(ctx, &scratch, spec, hold).await;
    scratch.drop().await;
    result
}

async fn measure(ctx: &Ctx, scratch: &Scratch, spec: &Paced, hold: bool) -> anyhow::Result<Run> {
    let others = other_snapshots(scratch).await?;
    let holder = match hold {
        true => Some(Holder::open(ctx, scratch).await?),
        false => None,
    };
    let probe = Probe::start(&scratch.js, &scratch.stream).await?;
    let relay = RelayUnderTest::start(ctx, scratch).await?;
    relay.settle().await;
    let load_stop = tokio_util::sync::CancellationToken::new();
    let load = {
        let (pool, schema, spec, latency) = (
            scratch.pool.clone(),
            scratch.schema.clone(),
            spec.clone(),
            probe.latency(),
        );
        tokio::spawn(async move { paced(&pool, &schema, &spec, &latency).await })
    };
    let audits = {
        let store = outbox_postgres::PgStore::new(scratch.pool.clone(), scratch.schema.clone());
        let stop = load_stop.clone();
        tokio::spawn(async move {
            let (mut worst, mut passes) = (0u64, 0u64);
            loop {
                let found = store.floor_audit().await?;
                worst = worst.max(found);
                passes += 1;
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_secs(5)) => {}
                    () = stop.cancelled() => break,
                }
            }
            worst = worst.max(store.floor_audit().await?);
            anyhow::Ok((worst, passes + 1))
        })
    };
    let start = tokio::time::Instant::now();
    let c0 = relay.claims();
    tokio::time::sleep_until(start + spec.duration.mul_f64(0.1)).await;
    let c1 = relay.claims();
    tokio::time::sleep_until(start + spec.duration.mul_f64(0.9)).await;
    let c2 = relay.claims();
    let produced = load.await?;
    let c3 = relay.claims();
    let undelivered = probe
        .drain(spec.duration.max(Duration::from_secs(120)))
        .await;
    load_stop.cancel();
    let (rows_below_floor, floor_audits) = audits.await??;
    // Statistics reach pg_stat_user_tables about a second after the transactions.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let dead_tuples = scratch.dead_tuples("outbox").await?;
    let held_xmin_age = match &holder {
        Some(h) => h.xmin_age(scratch).await?,
        None => None,
    };
    relay.stop().await;
    if let Some(h) = holder {
        h.close().await;
    }
    let produced = produced?;
    let latency = probe.finish().await;
    let (first, last) = (c0.until(c1), c2.until(c3));
    Ok(Run {
        held_snapshot: hold,
        produced,
        latency,
        undelivered,
        rows_below_floor,
        floor_audits,
        claim_end_over_start: first.mean_ms.zip(last.mean_ms).map(|(a, b)| b / a),
        claim_first_10pct: first,
        claim_last_10pct: last,
        dead_tuples,
        held_xmin_age,
        other_snapshots_at_start: others,
    })
}

/// Sessions of this database, other than ours, holding a snapshot taken more than 5 s ago.
async fn other_snapshots(scratch: &Scratch) -> anyhow::Result<i64> {
    Ok(sqlx::query_scalar(sql::OTHER_SNAPSHOTS)
        .fetch_one(&scratch.pool)
        .await?)
}

/// A connection holding a REPEATABLE READ transaction whose snapshot is taken.
struct Holder {
    conn: PgConnection,
    pid: i32,
}

impl Holder {
    async fn open(ctx: &Ctx, scratch: &Scratch) -> anyhow::Result<Self> {
        sqlx::raw_sql(&scratch.schema.render(sql::HELD_REPORT))
            .execute(&scratch.pool)
            .await?;
        let mut conn = PgConnection::connect(&ctx.options.database_url)
            .await
            .context("opening the connection that holds the snapshot")?;
        let pid: i32 = sqlx::query_scalar(sql::BACKEND_PID)
            .fetch_one(&mut conn)
            .await?;
        sqlx::raw_sql(sql::BEGIN_REPEATABLE_READ)
            .execute(&mut conn)
            .await?;
        // The first query takes the snapshot, which the transaction keeps to its end.
        sqlx::raw_sql(&scratch.schema.render(sql::HELD_READ))
            .execute(&mut conn)
            .await?;
        let holder = Self { conn, pid };
        if holder.xmin_age(scratch).await?.is_none() {
            anyhow::bail!("the held transaction shows no snapshot (backend_xmin is null)");
        }
        Ok(holder)
    }

    /// Transaction ids consumed since the snapshot was taken.
    async fn xmin_age(&self, scratch: &Scratch) -> anyhow::Result<Option<i32>> {
        Ok(sqlx::query_scalar(sql::XMIN_AGE)
            .bind(self.pid)
            .fetch_optional(&scratch.pool)
            .await?
            .flatten())
    }

    async fn close(mut self) {
        let _ = sqlx::raw_sql(sql::ROLLBACK).execute(&mut self.conn).await;
        let _ = self.conn.close().await;
    }
}

fn print_run(name: &str, r: &Run) {
    println!(
        "  {name}: {} committed ({:.0} events/s), commit→ack {}{}",
        r.produced.committed,
        r.produced.events_per_second,
        r.latency.line(),
        if r.undelivered > 0 {
            format!(
                ", {} NEVER DELIVERED before the drain gave up",
                r.undelivered
            )
        } else {
            String::new()
        }
    );
    println!(
        "    rows below their window's seq floor: {} (most found by any of {} floor audits)",
        r.rows_below_floor, r.floor_audits
    );
    if let Some(age) = r.held_xmin_age {
        println!("    the held snapshot is {age} transaction ids old at the end of the run");
    }
    if r.other_snapshots_at_start > 0 {
        println!(
            "    note: {} other session(s) held a snapshot when this run began; they pin the horizon too",
            r.other_snapshots_at_start
        );
    }
}

/// Row labels of the side-by-side table, in the order of [`cells`].
const LABELS: [&str; 10] = [
    "achieved write rate (events/s)",
    "commit→ack p50 (ms)",
    "commit→ack p99 (ms)",
    "commit→ack max (ms)",
    "undelivered",
    "claim, first 10% (ms)",
    "claim, last 10% (ms)",
    "claim end/start",
    "dead tuples, message table",
    "dead tuples, whole schema",
];

/// One column of the side-by-side table.
fn cells(r: &Run) -> [String; 10] {
    let opt = |v: Option<f64>, unit: &str| v.map_or("-".into(), |x| format!("{x:.2}{unit}"));
    [
        format!("{:.0}", r.produced.events_per_second),
        format!("{:.1}", r.latency.p50_ms),
        format!("{:.1}", r.latency.p99_ms),
        format!("{:.1}", r.latency.max_ms),
        r.undelivered.to_string(),
        opt(r.claim_first_10pct.mean_ms, ""),
        opt(r.claim_last_10pct.mean_ms, ""),
        opt(r.claim_end_over_start, "x"),
        r.dead_tuples.table.to_string(),
        r.dead_tuples.schema.to_string(),
    ]
}

fn report(ctx: &Ctx, without: &Run, with: &Run) -> Report {
    println!(
        "  {:<32} {:>14} {:>20}",
        "", "without", "with held snapshot"
    );
    for (label, (a, b)) in LABELS
        .iter()
        .zip(cells(without).iter().zip(cells(with).iter()))
    {
        println!("  {label:<32} {a:>14} {b:>20}");
    }
    let p99_ratio =
        (without.latency.p99_ms > 0.0).then(|| with.latency.p99_ms / without.latency.p99_ms);
    let p99_line = p99_ratio.map_or("-".into(), |r| {
        format!("{r:.2} ({})", verdict(r <= P99_TARGET))
    });
    let claim_line = with.claim_end_over_start.map_or("-".into(), |r| {
        format!("{r:.2} ({})", verdict(r <= CLAIM_TARGET))
    });
    println!("  p99 with / without: {p99_line}; target ≤ {P99_TARGET}");
    println!("  claim end / start with the snapshot held: {claim_line}; target ≤ {CLAIM_TARGET}");
    Report::line(serde_json::json!({
        "mode": "idle-tx", "rate": ctx.options.rate, "listen": ctx.options.listen,
        "without": without, "with": with,
        "p99_with_over_without": p99_ratio, "p99_target": P99_TARGET,
        "claim_end_over_start_with": with.claim_end_over_start, "claim_target": CLAIM_TARGET,
    }))
}
