//! Idle-tx mode on MySQL/MariaDB: the steady load run twice, each in a fresh scratch database
//! with the relay draining to NATS: first with nothing else open, then with a session that
//! started `REPEATABLE READ` and took its consistent snapshot (`START TRANSACTION WITH CONSISTENT
//! SNAPSHOT` and one read) held open for the whole run: a forgotten console session, a long
//! report. On InnoDB such a snapshot stops purge: the undo history grows, and an engine that
//! updated or deleted messages would make its claims step over delete-marked records.
//!
//! Per run: commit→ack at the broker (p50/p99/max), the achieved write rate, the relay's mean
//! claim cost over the first and the last 10% of the load and their ratio, and InnoDB's history
//! list length (`trx_rseg_history_len`, server-wide) at the start and the end.

use std::time::Duration;

use anyhow::Context as _;
use serde::Serialize;
use sqlx::{Connection as _, MySqlConnection, MySqlPool};

use super::{MyCtx, RelayOnMysql, Scratch, HISTORY_LENGTH};
use crate::bed::SETTLE;
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
    history_length_start: Option<i64>,
    history_length_end: Option<i64>,
}

/// Runs idle-tx mode on MySQL.
pub async fn run(ctx: &MyCtx) -> anyhow::Result<Report> {
    let o = &ctx.options;
    let spec = Paced {
        rate: o.rate,
        producers: o.producers,
        duration: o.duration.unwrap_or(DEFAULT_DURATION),
        keys: match o.keys.as_slice() {
            [k] => *k,
            _ => anyhow::bail!("--keys takes one value in idle-tx mode"),
        },
        pad: load::pad(o.payload_bytes),
    };
    println!(
        "outbox bench on MySQL/MariaDB: idle-tx, {} events/s for {:?} per run over {} \
         connections, relay polling; run 1 without, run 2 with a REPEATABLE READ snapshot held open",
        spec.rate, spec.duration, spec.producers
    );
    let without = one_run(ctx, &spec, false).await?;
    print_run("without", &without);
    let with = one_run(ctx, &spec, true).await?;
    print_run("with held snapshot", &with);
    Ok(report(ctx, &without, &with))
}

async fn one_run(ctx: &MyCtx, spec: &Paced, hold: bool) -> anyhow::Result<Run> {
    let scratch = Scratch::new(&ctx.pool, &ctx.js, &ctx.options, "idletx").await?;
    let result = measure(ctx, &scratch, spec, hold).await;
    scratch.drop().await;
    result
}

async fn measure(ctx: &MyCtx, scratch: &Scratch, spec: &Paced, hold: bool) -> anyhow::Result<Run> {
    scratch.migrate(&ctx.options).await?;
    let holder = match hold {
        true => Some(Holder::open(ctx, scratch).await?),
        false => None,
    };
    let history_length_start = history_length(&scratch.pool).await;
    let probe = Probe::start(&scratch.js, &scratch.stream).await?;
    let relay = RelayOnMysql::start(&ctx.options, scratch).await?;
    tokio::time::sleep(SETTLE).await;
    let load = {
        let (pool, schema, spec, latency) = (
            scratch.pool.clone(),
            scratch.schema.clone(),
            spec.clone(),
            probe.latency(),
        );
        let target = super::MysqlTarget::new(&pool, &schema);
        tokio::spawn(async move { load::paced_into(&target, &spec, &latency).await })
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
    let history_length_end = history_length(&scratch.pool).await;
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
        claim_end_over_start: first.mean_ms.zip(last.mean_ms).map(|(a, b)| b / a),
        claim_first_10pct: first,
        claim_last_10pct: last,
        history_length_start,
        history_length_end,
    })
}

/// InnoDB's history list length, or `None` where the server does not expose the metric.
async fn history_length(pool: &MySqlPool) -> Option<i64> {
    match sqlx::query_scalar::<_, i64>(HISTORY_LENGTH)
        .fetch_optional(pool)
        .await
    {
        Ok(v) => v,
        Err(error) => {
            tracing::debug!(%error, "no history list length");
            None
        }
    }
}

/// A session holding a REPEATABLE READ transaction whose consistent snapshot is taken.
struct Holder {
    conn: MySqlConnection,
}

impl Holder {
    async fn open(ctx: &MyCtx, scratch: &Scratch) -> anyhow::Result<Self> {
        let mut conn = MySqlConnection::connect_with(&outbox_mysql::connect_options(
            &ctx.options.database_url,
        )?)
        .await
        .context("opening the session that holds the snapshot")?;
        sqlx::raw_sql(
            "SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ; \
             START TRANSACTION WITH CONSISTENT SNAPSHOT",
        )
        .execute(&mut conn)
        .await?;
        // A read of the outbox, as a report would make; the snapshot was taken at the start.
        sqlx::raw_sql(
            &scratch
                .schema
                .render("SELECT COUNT(*) FROM {schema}.outbox"),
        )
        .execute(&mut conn)
        .await?;
        Ok(Self { conn })
    }

    async fn close(mut self) {
        let _ = sqlx::raw_sql("ROLLBACK").execute(&mut self.conn).await;
        let _ = self.conn.close().await;
    }
}

fn print_run(name: &str, r: &Run) {
    let history = |v: Option<i64>| v.map_or("-".into(), |v| v.to_string());
    println!(
        "  {name}: {} committed ({:.0} events/s), commit→ack {}{}; history list length {} → {}",
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
        },
        history(r.history_length_start),
        history(r.history_length_end),
    );
}

fn report(ctx: &MyCtx, without: &Run, with: &Run) -> Report {
    let opt = |v: Option<f64>, unit: &str| v.map_or("-".into(), |x| format!("{x:.2}{unit}"));
    let rows: [(&str, [String; 2]); 7] = [
        (
            "commit→ack p50 (ms)",
            [without, with].map(|r| format!("{:.1}", r.latency.p50_ms)),
        ),
        (
            "commit→ack p99 (ms)",
            [without, with].map(|r| format!("{:.1}", r.latency.p99_ms)),
        ),
        (
            "commit→ack max (ms)",
            [without, with].map(|r| format!("{:.1}", r.latency.max_ms)),
        ),
        (
            "undelivered",
            [without, with].map(|r| r.undelivered.to_string()),
        ),
        (
            "claim, first 10% (ms)",
            [without, with].map(|r| opt(r.claim_first_10pct.mean_ms, "")),
        ),
        (
            "claim, last 10% (ms)",
            [without, with].map(|r| opt(r.claim_last_10pct.mean_ms, "")),
        ),
        (
            "claim end/start",
            [without, with].map(|r| opt(r.claim_end_over_start, "x")),
        ),
    ];
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
    Report::line(serde_json::json!({
        "mode": "idle-tx", "database": "mysql", "rate": ctx.options.rate,
        "without": without, "with": with,
        "p99_with_over_without": p99_ratio, "p99_target": P99_TARGET,
        "claim_end_over_start_with": with.claim_end_over_start, "claim_target": CLAIM_TARGET,
    }))
}
