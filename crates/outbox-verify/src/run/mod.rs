//! One `outbox verify` run: the database and a scratch destination made for it, relays
//! started, load and faults applied, everything read back, and the verdict.
//!
//! [`run`] goes through named phases, one module each, in this order: [`prepare`] (the
//! database, the run's logins, the destination), [`start`] (the relays and the inbox's
//! processes), [`produce`] (the load, the fault schedule and a `--mode switch` run's switch),
//! [`drain`] (everything committed must arrive, and each effect apply), [`check`] (the
//! processes stopped, the verdict) and [`teardown`] (a failed run's evidence, or the clean-up).

mod check;
mod drain;
mod prepare;
mod produce;
mod start;
mod switch;
mod teardown;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::report::Report;
use crate::workload::Shape;

/// What one run does. Fault kinds are `kill`, `pause`, `broker` (needs both broker commands)
/// and `db` (needs `db_restart`); the caller validates them.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Where the outbox lives: a fresh schema of its own is made on PostgreSQL; on SQLite the
    /// file the URL names, or a fresh one when it names none.
    pub database_url: String,
    /// The sink the relays publish to; `file:` alone and `stdout:` use a fresh file.
    pub sink_url: String,
    /// Length of the load.
    pub duration: Duration,
    /// Relay processes.
    pub relays: usize,
    /// Producers and keys.
    pub shape: Shape,
    /// Seed of the workload and the fault schedule.
    pub seed: u64,
    /// Fault kinds to inject.
    pub faults: Vec<String>,
    /// Mean pause between faults.
    pub fault_interval: Duration,
    /// The relays' lease.
    pub lease: Duration,
    /// Shell commands that stop and start the broker, and restart the database.
    pub broker_stop: Option<String>,
    /// See `broker_stop`.
    pub broker_start: Option<String>,
    /// See `broker_stop`.
    pub db_restart: Option<String>,
    /// Keep the schema, the destination and the logs afterwards.
    pub keep: bool,
    /// The `outbox` binary the relays run as.
    pub program: PathBuf,
    /// Print what is being set up (text output).
    pub announce: bool,
    /// Go on through the receiving side: `outbox inbox` daemons consume the broker into an
    /// inbox beside the outbox, handler processes apply each message's effect, the faults hit
    /// them too, and every effect must be applied once, in per-key order (PostgreSQL and NATS).
    pub through_inbox: bool,
    /// Run the relays in CDC mode (`outbox relay --mode cdc`): see `Args::mode`.
    pub cdc: bool,
    /// Start the relays in polling mode and switch them to CDC mode under load (with `cdc`):
    /// see `Args::mode`.
    pub switch: bool,
    /// MySQL/MariaDB: the outbox runs the binlog route (`outbox migrate --binlog`): writers run
    /// no trigger and the relays' sequencer positions rows from the binlog.
    pub binlog: bool,
    /// Shell command that fails the database over (the `failover` fault).
    pub failover: Option<String>,
    /// Shell command printing the primary's `host:port`: every connection then goes through a
    /// proxy standing for a virtual IP that follows it (see `Args::primary_cmd`).
    pub primary_cmd: Option<String>,
    /// How long the `network` fault black-holes the relays' database connections.
    pub network_blackout: Duration,
    /// Writers, relays and operator commands log in as least-privilege roles made for the run
    /// (docs/roles.md), not as the URL's user (PostgreSQL).
    pub roles: bool,
}

/// `outbox inbox` daemons of a `--through-inbox` run: one ingests, one stands by.
const INBOX_DAEMONS: usize = 2;
/// Handler processes of a `--through-inbox` run, sharing the queue's partitions.
const INBOX_HANDLERS: usize = 2;

/// The verdict of a run.
pub struct Outcome {
    /// The report (`ok` says whether every guarantee held).
    pub report: Report,
    /// Whether every requested fault kind was injected at least once.
    pub all_faults_injected: bool,
}

impl Outcome {
    /// Whether the run passes: every guarantee held and every requested fault happened.
    pub fn passed(&self) -> bool {
        self.report.ok && self.all_faults_injected
    }
}

/// Runs the workload, the relays and the faults of `settings`, reads everything back and
/// judges it. An error means the run could not be carried out (a database or broker that
/// cannot be reached at the start, a fault command that failed), never a failed guarantee: that
/// is in the report.
pub async fn run(settings: Settings) -> anyhow::Result<Outcome> {
    let mut setup = prepare::prepare(&settings).await?;
    let processes = start::start(&settings, &setup).await?;
    let mut load = produce::produce(&settings, &mut setup, &processes).await?;
    let drained = drain::drain(&settings, &mut setup, &processes, &mut load).await?;
    let report = check::check(&settings, &setup, &processes, load, drained).await?;
    let all_faults_injected = settings
        .faults
        .iter()
        .all(|k| report.faults_injected.contains_key(k));
    teardown::teardown(&settings, setup, processes, &report).await;
    Ok(Outcome {
        report,
        all_faults_injected,
    })
}

/// The longest any one step after the load may take (a query, the producers' stop, the
/// clean-up) before the run gives up on it.
const PHASE_LIMIT: Duration = Duration::from_secs(60);

/// `fut` within [`PHASE_LIMIT`]; past it, an error that says so.
async fn bounded<T, E>(fut: impl std::future::Future<Output = Result<T, E>>) -> anyhow::Result<T>
where
    E: Into<anyhow::Error>,
{
    match tokio::time::timeout(PHASE_LIMIT, fut).await {
        Ok(r) => r.map_err(Into::into),
        Err(_) => anyhow::bail!("a database call of the checker took over {PHASE_LIMIT:?}"),
    }
}

/// One line on standard error per phase, whatever the report's format: where a run that
/// takes too long stands.
fn progress(started: Instant, what: &str) {
    eprintln!("verify: {:>6.1} s: {what}", started.elapsed().as_secs_f64());
}
