//! Idle mode: with no traffic at all, what the relay costs to keep watching.
//!
//! A relay runs over an empty scratch schema. Once it settled (partitions split, connections
//! open), CPU time is read from `/proc` before and after `--duration`:
//! - this process (`/proc/self/stat`, utime + stime of every thread): the relay, and an idle
//!   NATS connection the bench keeps for its stream;
//! - PostgreSQL: utime + stime summed over every process whose `comm` is `postgres` (a process
//!   that started in between counts from zero; one that exited in between is lost), and the
//!   share of it spent by the relay's own backends (found by `application_name`).
//!
//! Each is reported as a percentage of one core over the wall time. PostgreSQL's total includes
//! every other session on the server, so on a shared machine the relay-backends figure is the
//! one that isolates the relay.

use std::time::{Duration, Instant};

use serde::Serialize;

use crate::cpu::{own_ticks, ticks_of, USER_HZ};
use crate::relay::RelayUnderTest;
use crate::scratch::Scratch;
use crate::{sql, verdict, Ctx, Report};

/// Default measuring time.
const DEFAULT_DURATION: Duration = Duration::from_secs(30);
/// Target: relay plus PostgreSQL, in % of one core.
const TARGET_PERCENT: f64 = 5.0;

/// CPU used during the window, in % of one core.
#[derive(Debug, Serialize)]
struct Idle {
    seconds: f64,
    relay_process_percent: f64,
    postgres_percent: f64,
    postgres_processes: usize,
    relay_backends_percent: f64,
    relay_backends: usize,
    /// Relay process plus every PostgreSQL process.
    together_percent: f64,
    /// Claim statements the relay ran during the window (its idle polls).
    claims: u64,
}

/// Runs idle mode.
pub async fn run(ctx: &Ctx) -> anyhow::Result<Report> {
    let duration = ctx.duration(DEFAULT_DURATION);
    println!(
        "outbox bench: idle, no traffic for {duration:?}, relay {} workers, {}",
        ctx.options.workers,
        ctx.wake_up()
    );
    let scratch = Scratch::with_outbox(&ctx.pool, &ctx.js, ctx.options.storage, "idle").await?;
    let result = measure(ctx, &scratch, duration).await;
    scratch.drop().await;
    let idle = result?;
    println!(
        "  relay process: {:.2}% of one core; PostgreSQL ({} processes): {:.2}%, of which the relay's {} backends: {:.2}%",
        idle.relay_process_percent,
        idle.postgres_processes,
        idle.postgres_percent,
        idle.relay_backends,
        idle.relay_backends_percent
    );
    println!(
        "  together: {:.2}% ({}; target ≤ {TARGET_PERCENT}%); relay + its own backends: {:.2}%; {} claims ({:.1}/s)",
        idle.together_percent,
        verdict(idle.together_percent <= TARGET_PERCENT),
        idle.relay_process_percent + idle.relay_backends_percent,
        idle.claims,
        idle.claims as f64 / idle.seconds
    );
    Ok(Report::line(
        serde_json::json!({ "mode": "idle", "listen": ctx.options.listen, "idle": idle,
                            "target_percent": TARGET_PERCENT }),
    ))
}

async fn measure(ctx: &Ctx, scratch: &Scratch, duration: Duration) -> anyhow::Result<Idle> {
    let relay = RelayUnderTest::start(ctx, scratch).await?;
    relay.settle().await;
    let backends: Vec<u32> = sqlx::query_scalar::<_, i32>(sql::RELAY_BACKENDS)
        .bind(&relay.application_name)
        .fetch_all(&scratch.pool)
        .await?
        .into_iter()
        .filter_map(|p| u32::try_from(p).ok())
        .collect();
    let claims_before = relay.claims();
    let (own_before, pg_before, started) = (own_ticks()?, ticks_of(&["postgres"]), Instant::now());
    tokio::time::sleep(duration).await;
    let (own_after, pg_after, seconds) = (
        own_ticks()?,
        ticks_of(&["postgres"]),
        started.elapsed().as_secs_f64(),
    );
    let claims = claims_before.until(relay.claims()).claims;
    relay.stop().await;
    let percent = |ticks: u64| ticks as f64 / USER_HZ / seconds * 100.0;
    let pg_used = |pid: &u32| {
        let after = pg_after.get(pid).copied().unwrap_or(0);
        after.saturating_sub(pg_before.get(pid).copied().unwrap_or(0))
    };
    let relay_process_percent = percent(own_after.saturating_sub(own_before));
    let postgres_percent = percent(pg_after.keys().map(pg_used).sum());
    Ok(Idle {
        seconds,
        relay_process_percent,
        postgres_percent,
        postgres_processes: pg_after.len(),
        relay_backends_percent: percent(backends.iter().map(pg_used).sum()),
        relay_backends: backends.len(),
        together_percent: relay_process_percent + postgres_percent,
        claims,
    })
}
