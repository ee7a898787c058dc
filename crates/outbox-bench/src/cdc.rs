//! CDC mode: the relay reading PostgreSQL's WAL (`outbox relay --mode cdc`) beside the polling
//! relay, in one run, each in scratch schemas of its own:
//!
//! 1. **Backlog**: `--rows` over `--keys` keys, written before either relay starts (the CDC
//!    scratch has its slot first, so the rows are in its stream), `ANALYZE`d, drained to NATS;
//!    events/s and CPU per message of the relay, PostgreSQL and NATS.
//! 2. **Steady**: `--rate` events/s for `--duration`, one row per transaction: commit→ack at the
//!    broker, and CPU of the relay (the threads of its own runtime, which drive its sink and
//!    database connections; not the producers nor the read-back consumer, which share this
//!    process) plus its server processes (its pool's backends and, in CDC mode, its WAL
//!    sender), as a share of one core.
//!    Beside them, the **floor**: PostgreSQL's own `pg_recvlogical` reading a slot of the same
//!    publication at the same rate into `/dev/null` (no publishing, no acknowledgements): its
//!    CPU and its WAL sender's are what any CDC client costs here before it does any work, the
//!    bound under the CPU target.
//! 3. **Idle**: the CDC relay over an idle schema for `--idle` (default 10 s): how many of its
//!    sessions ran a statement (read from `pg_stat_activity.query_start`), and CPU.
//!
//! The writer side (emit against the table and the naive table) is `--mode writers`, whose
//! variant (e) is `emit`; this mode runs it too unless `--skip-writers`.

use std::time::Duration;

use outbox_db::SqlxBackend as _;
use serde::Serialize;

use crate::backlog::{fill_analysed, finish, line, measured_drain, relay_drain};
use crate::cpu::CpuWindow;
use crate::latency::Probe;
use crate::load::{paced, Paced};
use crate::relay::RelayUnderTest;
use crate::scratch::Scratch;
use crate::{verdict, Ctx, Drain, Report};

/// Steady load length when `--duration` is not given.
const DEFAULT_STEADY: Duration = Duration::from_secs(20);
/// Target p99 commit→ack of the CDC relay at the steady rate, in milliseconds.
const TARGET_P99_MS: f64 = 10.0;
/// Target CPU of the relay and PostgreSQL at the steady rate, in % of one core.
const TARGET_STEADY_CPU: f64 = 10.0;

/// One relay at a steady rate.
#[derive(Debug, Serialize)]
struct Steady {
    drain: Drain,
    /// The relay's own threads, % of one core.
    relay_percent: f64,
    /// This whole process: the relay, the producers and the read-back consumer.
    process_percent: f64,
    /// The relay's server processes (pool backends; the WAL sender in CDC mode).
    relay_backends_percent: f64,
    /// Every PostgreSQL process, the producers' backends included.
    postgres_percent: f64,
}

/// PostgreSQL's own logical replication client at the steady rate: the least a CDC relay costs.
#[derive(Debug, Serialize)]
struct Floor {
    /// `pg_recvlogical`, % of one core.
    client_percent: f64,
    /// Its WAL sender, % of one core.
    walsender_percent: f64,
}

impl Floor {
    fn total(&self) -> f64 {
        self.client_percent + self.walsender_percent
    }
}

/// The CDC relay with no traffic.
#[derive(Debug, Serialize)]
struct Idle {
    seconds: f64,
    /// Sessions of the relay (pool and WAL sender) whose `query_start` moved: 0 means no
    /// statement at all.
    sessions_that_ran_a_statement: usize,
    sessions: usize,
    relay_percent: f64,
    relay_backends_percent: f64,
}

/// Runs CDC mode.
pub async fn run(ctx: &Ctx) -> anyhow::Result<Report> {
    let a = &ctx.options;
    let keys = ctx.single_keys()?;
    println!(
        "outbox bench: CDC relay beside the polling relay; backlog of {} events over {keys} keys, \
         {} B payloads, NATS JetStream ({} storage); steady {} events/s",
        a.rows, a.payload_bytes, a.storage, a.rate
    );
    let polling = relay_drain(ctx, keys).await?;
    println!("  backlog  polling: {}", line(&polling));
    let cdc = cdc_drain(ctx, keys).await?;
    println!("  backlog  cdc:     {}", line(&cdc));
    let ratio = cdc.best_rate() / polling.best_rate();
    println!(
        "  backlog  cdc / polling: {ratio:.2} (target ≥ 1: {})",
        verdict(ratio >= 1.0)
    );
    let spec = Paced {
        rate: a.rate,
        producers: a.producers,
        duration: ctx.duration(DEFAULT_STEADY),
        keys,
        pad: ctx.pad(),
    };
    let steady_polling = steady(ctx, &spec, false).await?;
    println!("  steady   polling: {}", steady_line(&steady_polling));
    let steady_cdc = steady(ctx, &spec, true).await?;
    println!("  steady   cdc:     {}", steady_line(&steady_cdc));
    let floor = match steady_floor(ctx, &spec).await {
        Ok(floor) => floor,
        Err(e) => {
            println!("  steady   floor: not measured ({e:#})");
            None
        }
    };
    if let Some(f) = &floor {
        println!(
            "  steady   floor: pg_recvlogical into /dev/null at the same rate: client {:.1}%, its \
             WAL sender {:.1}%, together {:.1}% of a core (what any CDC client costs here before \
             it publishes anything)",
            f.client_percent,
            f.walsender_percent,
            f.total()
        );
    }
    let p99 = steady_cdc.drain.latency.p99_ms;
    let cpu = steady_cdc.relay_percent + steady_cdc.relay_backends_percent;
    // Past what this machine can do when the relay's own server processes plus a client as
    // cheap as PostgreSQL's own, which publishes nothing, are over the target already.
    let bound = floor
        .as_ref()
        .map(|f| steady_cdc.relay_backends_percent + f.client_percent);
    let cpu_verdict = match bound {
        _ if cpu <= TARGET_STEADY_CPU => "met".to_string(),
        Some(bound) if bound > TARGET_STEADY_CPU => format!(
            "blocked: its server processes plus a client as cheap as pg_recvlogical, which \
             publishes nothing, are {bound:.1}% already"
        ),
        _ => "missed".to_string(),
    };
    println!(
        "  steady   cdc p99 commit→ack {p99:.1} ms (target ≤ {TARGET_P99_MS} ms: {}); relay + its \
         server processes {cpu:.1}% of a core (target ≤ {TARGET_STEADY_CPU}%: {cpu_verdict})",
        verdict(p99 <= TARGET_P99_MS),
    );
    let idle = idle(ctx, a.idle).await?;
    println!(
        "  idle     cdc: {} of {} relay sessions ran a statement in {:.0} s (target 0: {}); \
         relay {:.2}%, relay server processes {:.2}% of a core",
        idle.sessions_that_ran_a_statement,
        idle.sessions,
        idle.seconds,
        verdict(idle.sessions_that_ran_a_statement == 0),
        idle.relay_percent,
        idle.relay_backends_percent
    );
    let writers = if a.writers {
        Some(crate::writers::run(crate::bed::Bed::Postgres(ctx)).await?)
    } else {
        None
    };
    let writers: Option<serde_json::Value> = writers
        .map(|r| serde_json::from_str(r.json()))
        .transpose()?;
    Ok(Report::line(serde_json::json!({
        "mode": "cdc", "rows": a.rows, "keys": keys,
        "backlog": { "polling": polling, "cdc": cdc, "cdc_vs_polling": ratio },
        "steady": {
            "rate": a.rate, "polling": steady_polling, "cdc": steady_cdc, "floor": floor,
            "cpu_bound": bound, "cpu_verdict": cpu_verdict,
        },
        "idle": idle, "writers": writers,
    })))
}

fn steady_line(s: &Steady) -> String {
    format!(
        "{} events ({:.0}/s), commit→ack {}; CPU: relay {:.1}%, relay server processes \
         {:.1}%, all PostgreSQL {:.1}%, this process (producers and read-back too) {:.1}% of a \
         core",
        s.drain.events,
        s.drain.events_per_second,
        s.drain.latency.line(),
        s.relay_percent,
        s.relay_backends_percent,
        s.postgres_percent,
        s.process_percent
    )
}

/// A scratch schema with the publication and slot made before any row is written.
async fn cdc_scratch(ctx: &Ctx, tag: &str) -> anyhow::Result<Scratch> {
    let scratch = Scratch::with_outbox(&ctx.pool, &ctx.js, ctx.options.storage, tag).await?;
    let made = match sqlx::Postgres::database(ctx.pool.clone(), scratch.schema.as_str()) {
        Ok(db) => db.migrate_cdc("relay").await,
        Err(e) => Err(e),
    };
    if let Err(e) = made {
        scratch.drop().await;
        return Err(e.into());
    }
    Ok(scratch)
}

/// Drops the scratch's slot and publication (once the relay's session let go of the slot),
/// then the scratch.
async fn drop_cdc_scratch(ctx: &Ctx, scratch: Scratch) {
    if let Ok(db) = sqlx::Postgres::database(ctx.pool.clone(), scratch.schema.as_str()) {
        for _ in 0..100 {
            if db.drop_cdc("relay").await.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    scratch.drop().await;
}

async fn cdc_drain(ctx: &Ctx, keys: usize) -> anyhow::Result<Drain> {
    let scratch = cdc_scratch(ctx, "cdc").await?;
    let result = async {
        let rows = ctx.options.rows as u64;
        let probe = Probe::start(&scratch.js, &scratch.stream).await?;
        fill_analysed(ctx, &scratch, keys, &probe, true).await?;
        let timing = measured_drain(rows, RelayUnderTest::start_cdc(ctx, &scratch)).await?;
        finish(&scratch, probe, rows, timing).await
    }
    .await;
    drop_cdc_scratch(ctx, scratch).await;
    result
}

/// The pids of the relay's server processes: its pool's backends, and its WAL sender.
async fn relay_pids(ctx: &Ctx, relay: &RelayUnderTest, scratch: &Scratch) -> Vec<u32> {
    let walsender = format!("outbox-cdc:outbox_{}_relay", scratch.schema.as_str());
    sqlx::query_scalar::<_, i32>(
        "SELECT pid FROM pg_stat_activity WHERE application_name = $1 OR application_name = $2",
    )
    .bind(&relay.application_name)
    .bind(walsender)
    .fetch_all(&ctx.pool)
    .await
    .unwrap_or_default()
    .into_iter()
    .filter_map(|p| u32::try_from(p).ok())
    .collect()
}

async fn steady(ctx: &Ctx, spec: &Paced, cdc: bool) -> anyhow::Result<Steady> {
    let scratch = if cdc {
        cdc_scratch(ctx, "cdcsteady").await?
    } else {
        Scratch::with_outbox(&ctx.pool, &ctx.js, ctx.options.storage, "pollsteady").await?
    };
    let result = async {
        let probe = Probe::start(&scratch.js, &scratch.stream).await?;
        let relay = if cdc {
            RelayUnderTest::start_cdc(ctx, &scratch).await?
        } else {
            RelayUnderTest::start(ctx, &scratch).await?
        };
        relay.settle().await;
        let pids = relay_pids(ctx, &relay, &scratch).await;
        let window = CpuWindow::start()?;
        let produced = paced(&scratch.pool, &scratch.schema, spec, &probe.latency()).await;
        let cpu = window.end()?;
        let missing = probe.drain(Duration::from_secs(120)).await;
        relay.stop().await;
        let produced = produced?;
        let latency = probe.finish().await;
        if missing > 0 {
            anyhow::bail!(
                "{missing} of {} committed events never reached the stream",
                produced.committed
            );
        }
        Ok(Steady {
            drain: Drain {
                events: produced.committed,
                seconds: produced.seconds,
                events_per_second: produced.events_per_second,
                steady_events_per_second: None,
                latency,
                cpu: None,
            },
            relay_percent: cpu.relay_percent(),
            process_percent: cpu.own_percent(),
            relay_backends_percent: cpu.postgres_percent_of(&pids),
            postgres_percent: cpu.postgres_percent(),
        })
    }
    .await;
    if cdc {
        drop_cdc_scratch(ctx, scratch).await;
    } else {
        scratch.drop().await;
    }
    result
}

/// `pg_recvlogical` from `PATH`, or from the server's own bin directory (Debian keeps it in
/// `/usr/lib/postgresql/<major>/bin`).
fn pg_recvlogical() -> Option<std::path::PathBuf> {
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("pg_recvlogical"))
            .find(|p| p.is_file())
    });
    on_path.or_else(|| {
        let mut found: Vec<_> = std::fs::read_dir("/usr/lib/postgresql")
            .ok()?
            .filter_map(Result::ok)
            .map(|d| d.path().join("bin/pg_recvlogical"))
            .filter(|p| p.is_file())
            .collect();
        found.sort();
        found.pop()
    })
}

/// The floor (see the module documentation): `pg_recvlogical` on a CDC scratch's slot while
/// the steady load runs. `None` when `pg_recvlogical` is not installed.
async fn steady_floor(ctx: &Ctx, spec: &Paced) -> anyhow::Result<Option<Floor>> {
    let Some(program) = pg_recvlogical() else {
        println!("  steady   floor: not measured (pg_recvlogical not found)");
        return Ok(None);
    };
    let scratch = cdc_scratch(ctx, "cdcfloor").await?;
    let names = outbox_db::CdcNames::new(&scratch.schema, "relay")?;
    let application_name = format!("outbox_bench_floor_{}", scratch.suffix);
    let result = async {
        // The connection as libpq's environment, so no password shows in the process list.
        let url: sqlx::postgres::PgConnectOptions = ctx.options.database_url.parse()?;
        let password = outbox_db::tools::postgres::url_password(&ctx.options.database_url)?
            .unwrap_or_default();
        let mut child = tokio::process::Command::new(program)
            .env("PGHOST", url.get_host())
            .env("PGPORT", url.get_port().to_string())
            .env("PGUSER", url.get_username())
            .env("PGPASSWORD", password)
            .arg(format!(
                "--dbname={}",
                url.get_database().unwrap_or(url.get_username())
            ))
            .arg(format!("--slot={}", names.slot))
            .args(["--start", "--file=/dev/null", "--no-loop"])
            .args(["-o", "proto_version=1"])
            .arg("-o")
            .arg(format!("publication_names={}", names.publication))
            .env("PGAPPNAME", &application_name)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let client = child
            .id()
            .ok_or_else(|| anyhow::anyhow!("pg_recvlogical exited at once"))?;
        let mut walsender = Vec::new();
        for _ in 0..50 {
            walsender = sqlx::query_scalar::<_, i32>(
                "SELECT pid FROM pg_stat_activity WHERE application_name = $1",
            )
            .bind(&application_name)
            .fetch_all(&ctx.pool)
            .await?
            .into_iter()
            .filter_map(|p| u32::try_from(p).ok())
            .collect();
            if !walsender.is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        if walsender.is_empty() {
            let _ = child.kill().await;
            let out = child.wait_with_output().await?;
            anyhow::bail!(
                "pg_recvlogical did not start streaming: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        let probe = Probe::recorded_elsewhere();
        let before = crate::cpu::pid_ticks(client).unwrap_or(0);
        let window = CpuWindow::start()?;
        let produced = paced(&scratch.pool, &scratch.schema, spec, &probe.latency()).await;
        let cpu = window.end()?;
        let after = crate::cpu::pid_ticks(client);
        let _ = child.kill().await;
        produced?;
        let after =
            after.ok_or_else(|| anyhow::anyhow!("pg_recvlogical exited during the load"))?;
        Ok(Some(Floor {
            client_percent: after.saturating_sub(before) as f64 / crate::cpu::USER_HZ / cpu.seconds
                * 100.0,
            walsender_percent: cpu.postgres_percent_of(&walsender),
        }))
    }
    .await;
    drop_cdc_scratch(ctx, scratch).await;
    result
}

/// The `query_start` of each of the relay's sessions.
async fn query_starts(ctx: &Ctx, pids: &[u32]) -> Vec<(i32, Option<String>)> {
    let pids: Vec<i32> = pids.iter().filter_map(|&p| i32::try_from(p).ok()).collect();
    sqlx::query_as(
        "SELECT pid, query_start::text FROM pg_stat_activity WHERE pid = ANY($1) ORDER BY pid",
    )
    .bind(&pids)
    .fetch_all(&ctx.pool)
    .await
    .unwrap_or_default()
}

async fn idle(ctx: &Ctx, duration: Duration) -> anyhow::Result<Idle> {
    let scratch = cdc_scratch(ctx, "cdcidle").await?;
    let result = async {
        let relay = RelayUnderTest::start_cdc(ctx, &scratch).await?;
        relay.settle().await;
        let pids = relay_pids(ctx, &relay, &scratch).await;
        let before = query_starts(ctx, &pids).await;
        let window = CpuWindow::start()?;
        tokio::time::sleep(duration).await;
        let cpu = window.end()?;
        let after = query_starts(ctx, &pids).await;
        // Sessions opened during the window ran a statement as they connected.
        let after_pids = relay_pids(ctx, &relay, &scratch).await;
        relay.stop().await;
        let moved = after.iter().filter(|a| !before.contains(a)).count()
            + after_pids.iter().filter(|p| !pids.contains(p)).count();
        Ok(Idle {
            seconds: cpu.seconds,
            sessions_that_ran_a_statement: moved,
            sessions: pids.len(),
            relay_percent: cpu.relay_percent(),
            relay_backends_percent: cpu.postgres_percent_of(&pids),
        })
    }
    .await;
    drop_cdc_scratch(ctx, scratch).await;
    result
}
