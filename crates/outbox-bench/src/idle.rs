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

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::relay::RelayUnderTest;
use crate::scratch::Scratch;
use crate::{sql, verdict, Ctx, Report};

/// Default measuring time.
const DEFAULT_DURATION: Duration = Duration::from_secs(30);
/// Target: relay plus PostgreSQL, in % of one core.
const TARGET_PERCENT: f64 = 5.0;
/// Clock ticks per second in `/proc/<pid>/stat` (`USER_HZ`, 100 on every Linux target).
const USER_HZ: f64 = 100.0;

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
    let (own_before, pg_before, started) = (own_ticks()?, postgres_ticks(), Instant::now());
    tokio::time::sleep(duration).await;
    let (own_after, pg_after, seconds) = (
        own_ticks()?,
        postgres_ticks(),
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

/// utime + stime of this process, in clock ticks.
fn own_ticks() -> anyhow::Result<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    parse_stat(&stat)
        .map(|(_, ticks)| ticks)
        .ok_or_else(|| anyhow::anyhow!("/proc/self/stat has an unexpected format"))
}

/// utime + stime of every process named `postgres`, by pid, in clock ticks.
fn postgres_ticks() -> HashMap<u32, u64> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return HashMap::new();
    };
    dir.filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            // A process may exit between listing and reading: skip it.
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let (comm, ticks) = parse_stat(&stat)?;
            (comm == "postgres").then_some((pid, ticks))
        })
        .collect()
}

/// `(comm, utime + stime)` from the text of `/proc/<pid>/stat`. `comm` is in parentheses and
/// may hold spaces, so fields are counted from the last `)`: utime and stime are fields 14
/// and 15 of the line, the 12th and 13th after it.
fn parse_stat(stat: &str) -> Option<(&str, u64)> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let comm = stat.get(open + 1..close)?;
    let mut rest = stat.get(close + 1..)?.split_whitespace().skip(11);
    let utime: u64 = rest.next()?.parse().ok()?;
    let stime: u64 = rest.next()?.parse().ok()?;
    Some((comm, utime + stime))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_after_the_command_name() {
        let line = "2212 (postgres) S 2211 2211 2211 0 -1 4194368 3010 0 0 0 17 42 0 0 20 0 1 0 \
                    1234 226881536 5000 18446744073709551615 0 0 0 0 0 0 0 4096 16385 0 0 0 17 1 0 0";
        assert_eq!(parse_stat(line), Some(("postgres", 59)));
        let odd = "7 (a b) c) R 1 1 1 0 -1 0 0 0 0 0 3 4 0 0 20 0 1 0 1 1 1";
        assert_eq!(parse_stat(odd), Some(("a b) c", 7)));
    }

    #[test]
    fn this_process_has_a_readable_stat() {
        assert!(own_ticks().is_ok());
    }
}
