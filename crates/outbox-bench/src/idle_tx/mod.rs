//! Idle-tx mode, on PostgreSQL or MySQL/MariaDB: the steady load run twice back to back, each
//! in a fresh scratch outbox with a relay draining to NATS: first with nothing else open, then
//! with a `REPEATABLE READ` transaction that took its snapshot held open on a separate
//! connection for the whole run (a forgotten `BEGIN` in a console, a long report). A held
//! snapshot pins PostgreSQL's xmin horizon and stops InnoDB's purge: an engine that UPDATEs or
//! DELETEs messages would make its claims read ever more dead versions.
//!
//! Per run: commit→ack at the broker (p50/p99/max), the achieved write rate, the relay's mean
//! claim cost (`claim_micros / claims` from its metrics) over the first and the last 10% of the
//! load and their ratio, and what the database shows of the snapshot's cost (the `postgres`
//! and `mysql` submodules: dead tuples and the floor audit; InnoDB's history list length).

mod mysql;
mod postgres;

use std::time::Duration;

use serde::Serialize;

use crate::bed::{Bed, BedScratch};
use crate::latency::{LatencyFigures, Probe};
use crate::load::{self, Paced, Produced};
use crate::relay::ClaimCost;
use crate::{verdict, Report};

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
    claim_first_10pct: ClaimCost,
    claim_last_10pct: ClaimCost,
    claim_end_over_start: Option<f64>,
    /// What the database showed of the run.
    #[serde(flatten)]
    seen: Seen,
}

/// What one database shows of a run, beside the common figures.
#[derive(Debug, Serialize)]
#[serde(untagged)]
enum Seen {
    Postgres(postgres::Seen),
    Mysql(mysql::Seen),
}

/// The database's own watch over one run: the snapshot's holder and what is read around it.
enum Watch<'s> {
    Postgres(postgres::Watch<'s>),
    Mysql(mysql::Watch),
}

/// Runs idle-tx mode on the database of `bed`.
pub async fn run(bed: Bed<'_>) -> anyhow::Result<Report> {
    let o = bed.options();
    let spec = Paced {
        rate: o.rate,
        producers: o.producers,
        duration: o.duration.unwrap_or(DEFAULT_DURATION),
        keys: crate::single_keys(o)?,
        pad: load::pad(o.payload_bytes),
    };
    match bed {
        Bed::Postgres(ctx) => postgres::header(ctx, &spec).await?,
        Bed::Mysql(_) => mysql::header(&spec),
    }
    let without = one_run(bed, &spec, false).await?;
    print_run("without", &without);
    let with = one_run(bed, &spec, true).await?;
    print_run("with held snapshot", &with);
    Ok(report(bed, &without, &with))
}

async fn one_run(bed: Bed<'_>, spec: &Paced, hold: bool) -> anyhow::Result<Run> {
    let scratch = bed.scratch("idletx").await?;
    let result = measure(bed, &scratch, spec, hold).await;
    scratch.drop().await;
    result
}

async fn measure(
    bed: Bed<'_>,
    scratch: &BedScratch,
    spec: &Paced,
    hold: bool,
) -> anyhow::Result<Run> {
    let mut watch = match (bed, scratch) {
        (Bed::Postgres(ctx), BedScratch::Postgres(s)) => {
            Watch::Postgres(postgres::Watch::begin(ctx, s, hold).await?)
        }
        (Bed::Mysql(ctx), BedScratch::Mysql(s)) => {
            Watch::Mysql(mysql::Watch::begin(ctx, s, hold).await?)
        }
        _ => anyhow::bail!("bench: a scratch outbox of one database given to the other"),
    };
    let probe = Probe::start(scratch.js(), scratch.stream()).await?;
    let relay = bed.start_relay(scratch).await?;
    relay.settle().await;
    let load = {
        let (target, spec, latency) = (scratch.target(), spec.clone(), probe.latency());
        tokio::spawn(async move { load::paced_into(&target, &spec, &latency).await })
    };
    if let Watch::Postgres(w) = &mut watch {
        w.load_started();
    }
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
    let seen = match &mut watch {
        Watch::Postgres(w) => Seen::Postgres(w.drained().await?),
        Watch::Mysql(w) => Seen::Mysql(w.drained().await),
    };
    relay.stop().await;
    match watch {
        Watch::Postgres(w) => w.close().await,
        Watch::Mysql(w) => w.close().await,
    }
    let produced = produced?;
    let latency = probe.finish().await;
    let (first, last) = (c0.until(c1), c2.until(c3));
    Ok(Run {
        held_snapshot: hold,
        produced,
        latency,
        undelivered,
        claim_end_over_start: first.mean_ms.zip(last.mean_ms).map(|(a, b)| b / a),
        claim_first_10pct: first,
        claim_last_10pct: last,
        seen,
    })
}

fn print_run(name: &str, r: &Run) {
    let line = format!(
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
    match &r.seen {
        Seen::Postgres(seen) => {
            println!("{line}");
            seen.print();
        }
        Seen::Mysql(seen) => println!("{line}; {}", seen.line()),
    }
}

/// The side-by-side table's rows both databases report, in order.
fn common_rows(without: &Run, with: &Run) -> Vec<(&'static str, [String; 2])> {
    let opt = |v: Option<f64>, unit: &str| v.map_or("-".into(), |x| format!("{x:.2}{unit}"));
    let both = |f: &dyn Fn(&Run) -> String| [f(without), f(with)];
    vec![
        (
            "commit→ack p50 (ms)",
            both(&|r| format!("{:.1}", r.latency.p50_ms)),
        ),
        (
            "commit→ack p99 (ms)",
            both(&|r| format!("{:.1}", r.latency.p99_ms)),
        ),
        (
            "commit→ack max (ms)",
            both(&|r| format!("{:.1}", r.latency.max_ms)),
        ),
        ("undelivered", both(&|r| r.undelivered.to_string())),
        (
            "claim, first 10% (ms)",
            both(&|r| opt(r.claim_first_10pct.mean_ms, "")),
        ),
        (
            "claim, last 10% (ms)",
            both(&|r| opt(r.claim_last_10pct.mean_ms, "")),
        ),
        (
            "claim end/start",
            both(&|r| opt(r.claim_end_over_start, "x")),
        ),
    ]
}

fn report(bed: Bed<'_>, without: &Run, with: &Run) -> Report {
    let mut rows = common_rows(without, with);
    if let (Seen::Postgres(a), Seen::Postgres(b)) = (&without.seen, &with.seen) {
        // PostgreSQL's table opens with the write rate and ends with the dead tuples.
        rows.insert(
            0,
            (
                "achieved write rate (events/s)",
                [without, with].map(|r| format!("{:.0}", r.produced.events_per_second)),
            ),
        );
        rows.extend(postgres::rows(a, b));
    }
    println!(
        "  {:<32} {:>14} {:>20}",
        "", "without", "with held snapshot"
    );
    for (label, [a, b]) in &rows {
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
    let o = bed.options();
    let mut figures = serde_json::json!({
        "mode": "idle-tx", "rate": o.rate,
        "without": without, "with": with,
        "p99_with_over_without": p99_ratio, "p99_target": P99_TARGET,
        "claim_end_over_start_with": with.claim_end_over_start, "claim_target": CLAIM_TARGET,
    });
    let (key, value) = match bed {
        Bed::Postgres(_) => ("listen", serde_json::json!(o.listen)),
        Bed::Mysql(_) => ("database", serde_json::json!("mysql")),
    };
    figures[key] = value;
    Report::line(figures)
}
