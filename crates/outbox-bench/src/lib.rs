//! The measurements behind `outbox bench`, as a library: real PostgreSQL and NATS JetStream,
//! each figure compared side by side in one run. Every mode works in scratch schemas and streams
//! of its own and drops them. The `outbox` binary turns its flags into [`Options`], calls
//! [`run`] and prints the [`Report`].
//!
//! - `backlog`: drain throughput of the relay and of the seed articles' naive relay, per key count;
//!   with `--sink`, that sink's drain beside the engine alone (a discarding sink).
//! - `steady`: commit→ack latency under a paced load.
//! - `writers`: what the outbox costs a business transaction (writer API, raw SQL, naive table).
//! - `idle-tx`: the steady load without, then with, a REPEATABLE READ snapshot held open.
//! - `big-tx`: one transaction of a million rows committed while the relay drains other keys,
//!   beside the same rows written as a thousand transactions.
//! - `idle`: CPU of the relay and of PostgreSQL with no traffic.
//! - `cdc`: the relay reading the WAL beside the polling relay (backlog, steady, idle, writers).
//! - `inbox`: the receiving side, ingest and handlers, each beside a naive consumer that does one
//!   transaction per message.
//!
//! Backlog, steady, writers, idle-tx and inbox modes also run on MySQL/MariaDB (`--database-url
//! mysql://…`): each mode is one bench parameterised by the database (the `bed` module), the
//! `mysql` module giving it its scratch database, relay and writer target. Every database is
//! reached through `outbox_db`; the naive baselines' SQL is raw, as issue 47 excepts.
//!
//! Latency is measured at the broker (see the `latency` module); published counts come from the
//! relay's metrics and the stream. Nothing reads the engine's tables or columns, so the modes keep
//! working when the engine changes underneath.

mod args;
mod backlog;
mod bed;
mod big_tx;
mod cdc;
mod cpu;
mod discard;
mod idle;
mod idle_tx;
mod inbox;
mod latency;
mod load;
mod mysql;
mod naive;
mod relay;
mod scratch;
mod sql;
mod steady;
mod writers;

use std::time::Duration;

use anyhow::Context as _;
use async_nats::jetstream;
use outbox_db::SqlxBackend as _;
use serde::Serialize;
use sqlx::PgPool;

use latency::LatencyFigures;

/// The database a run uses when none is given.
pub const DEFAULT_DATABASE_URL: &str = "postgres://root@127.0.0.1:5432/test";
/// The NATS server of the baseline runs when none is given.
pub const DEFAULT_NATS_URL: &str = "nats://127.0.0.1:4222";

pub use args::{Args, Format};

/// What a run measures (`--mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// Fill a backlog, drain it with the relay, then with a naive relay, per key count.
    Backlog,
    /// Producers commit one row per transaction at a fixed rate; measure commit→ack latency.
    Steady,
    /// Write-path cost: business UPDATE plus one outbox row per transaction, through the writer
    /// API, a raw SQL insert and a naive seed-style table, beside the UPDATE alone.
    Writers,
    /// A steady load twice: without, then with a REPEATABLE READ snapshot held open.
    IdleTx,
    /// No traffic: CPU used by the relay and by PostgreSQL.
    Idle,
    /// The receiving side: ingest NATS -> PostgreSQL by `outbox inbox`, and handlers by the
    /// inbox processor, each beside a naive consumer doing one transaction per message.
    Inbox,
    /// One transaction of --rows rows (the acceptance figure uses 1,000,000), committed while
    /// the relay drains other keys, beside the same rows written as 1,000 transactions: drain
    /// rates and claim times.
    BigTx,
    /// The CDC relay (reading the WAL) beside the polling relay: backlog drain, steady
    /// commit→ack and CPU, idle statements, and the writers (emit among them).
    Cdc,
}

/// JetStream storage of the bench streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Storage {
    /// On disk, as production streams are (the default).
    File,
    /// In memory: the broker's disk out of the figures.
    Memory,
}

impl Storage {
    /// Whether streams (and the scratch destinations of other sinks) are durable.
    fn durable(self) -> bool {
        self == Storage::File
    }
}

impl std::fmt::Display for Storage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Storage::File => "file",
            Storage::Memory => "memory",
        })
    }
}

/// The settings of one run. Each mode reads the fields it needs; the docs say which.
#[derive(Debug, Clone)]
pub struct Options {
    /// Which measurement.
    pub mode: Mode,
    /// PostgreSQL, where every mode makes its scratch schemas.
    pub database_url: String,
    /// The NATS server of the baseline runs and of every mode's scratch stream.
    pub nats_url: String,
    /// A sink other than NATS, drained beside NATS in the same run (backlog mode only; the
    /// others refuse it). See [`split_sink`].
    pub sink_url: Option<String>,
    /// Backlog size for the relay; big-tx: rows of the measured transaction(s); inbox: messages.
    pub rows: usize,
    /// Backlog size for the naive relay (default min(rows, 20000)); inbox mode: messages for
    /// the naive consumers (default min(rows, 5000)).
    pub naive_rows: Option<usize>,
    /// Distinct ordering keys: backlog mode runs once per value, the others take one value.
    pub keys: Vec<usize>,
    /// Backlog mode: `ANALYZE` after filling (production tables have statistics).
    pub analyze: bool,
    /// Payload size in bytes.
    pub payload_bytes: usize,
    /// Relay workers.
    pub workers: usize,
    /// Rows per claim.
    pub batch_size: usize,
    /// Steady, idle-tx and big-tx modes: events per second, one row per transaction.
    pub rate: u32,
    /// How long to measure (each mode has its own default).
    pub duration: Option<Duration>,
    /// Steady and idle-tx modes: producer connections.
    pub producers: usize,
    /// Writers mode: client connections, each running transactions back to back.
    pub clients: usize,
    /// Writers mode: rows of the pgbench-like accounts table.
    pub accounts: usize,
    /// Let the relay wake on LISTEN/NOTIFY (by default it polls).
    pub listen: bool,
    /// MySQL/MariaDB: the binlog route (writers run no trigger; see `outbox migrate --binlog`).
    pub binlog: bool,
    /// The relay reads its next batch while one is published (`false`: the baseline without).
    pub read_ahead: bool,
    /// The relay's poll interval (default: the relay's own default).
    pub poll_interval: Option<Duration>,
    /// JetStream storage of the bench streams.
    pub storage: Storage,
    /// Backlog mode: drain with the naive relay too.
    pub naive: bool,
    /// CDC mode: how long the idle relay is watched.
    pub idle: Duration,
    /// CDC mode: run the writers comparison too.
    pub writers: bool,
    /// The caller prints the [`Report`] as JSON: a mode whose text summary only repeats the
    /// report (inbox) leaves it out.
    pub json: bool,
}

/// What a run measured: the mode's figures as one JSON object. The text report was printed on
/// stdout as the run went.
#[derive(Debug, Clone)]
pub struct Report {
    json: String,
}

impl Report {
    /// The figures on one line.
    fn line(figures: serde_json::Value) -> Self {
        Self {
            json: figures.to_string(),
        }
    }

    /// The figures indented, fields in their struct's order (inbox mode, whose JSON stands in
    /// for its text summary).
    fn pretty(figures: &impl Serialize) -> anyhow::Result<Self> {
        Ok(Self {
            json: serde_json::to_string_pretty(figures)?,
        })
    }

    /// The figures as `outbox bench --format json` prints them.
    pub fn json(&self) -> &str {
        &self.json
    }
}

/// Splits `--sink` and `--nats` into the NATS server and the other sink measured beside it: a
/// `nats://` (or `tls://`) sink names the NATS server itself, as it always did.
pub fn split_sink(sink: Option<String>, nats: Option<String>) -> (String, Option<String>) {
    let is_nats = |u: &str| u.starts_with("nats://") || u.starts_with("tls://");
    match sink {
        Some(u) if is_nats(&u) => (u, None),
        other => (nats.unwrap_or_else(|| DEFAULT_NATS_URL.into()), other),
    }
}

/// What every mode needs: the options, a pool for producers and setup, and JetStream.
struct Ctx {
    options: Options,
    pool: PgPool,
    js: jetstream::Context,
}

impl Ctx {
    /// `duration`, or the mode's default.
    fn duration(&self, default: Duration) -> Duration {
        self.options.duration.unwrap_or(default)
    }

    /// `keys` for the modes that take one value.
    fn single_keys(&self) -> anyhow::Result<usize> {
        single_keys(&self.options)
    }

    /// Payload padding of `payload_bytes`.
    fn pad(&self) -> String {
        load::pad(self.options.payload_bytes)
    }

    /// "LISTEN/NOTIFY wake-ups" or "polling", for report headers.
    fn wake_up(&self) -> &'static str {
        if self.options.listen {
            "LISTEN/NOTIFY wake-ups"
        } else {
            "polling (no LISTEN)"
        }
    }
}

/// Figures of one measured drain or load.
#[derive(Debug, Serialize)]
pub(crate) struct Drain {
    /// Messages published.
    pub events: u64,
    /// Seconds the drain (or the load) took.
    pub seconds: f64,
    /// `events / seconds`.
    pub events_per_second: f64,
    /// Events/s while the relay ran at full speed: from 10% to 90% of the backlog published,
    /// leaving out its start (connections, taking partitions) and its tail (the last, partial
    /// batches), as a client library's own benchmark leaves out its connection set-up. Backlog
    /// drains only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub steady_events_per_second: Option<f64>,
    /// Commit→ack at the broker.
    pub latency: LatencyFigures,
    /// CPU each message cost the relay, PostgreSQL and the broker during the drain.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<cpu::CpuPerMessage>,
}

impl Drain {
    /// The figures of `events` published in `took`.
    pub fn of(events: u64, took: Duration, latency: LatencyFigures) -> Self {
        Self {
            events,
            seconds: took.as_secs_f64(),
            events_per_second: events as f64 / took.as_secs_f64(),
            steady_events_per_second: None,
            latency,
            cpu: None,
        }
    }

    /// The figures of a timed backlog drain, its steady rate included.
    pub fn drained(events: u64, timing: &DrainTiming, latency: LatencyFigures) -> Self {
        Self {
            steady_events_per_second: timing.steady_rate(events),
            cpu: timing.cpu,
            ..Self::of(events, timing.took, latency)
        }
    }

    /// `events/s`, and the steady rate beside it when there is one.
    pub fn rate(&self) -> String {
        match self.steady_events_per_second {
            Some(s) => format!("{:.0} ({s:.0})", self.events_per_second),
            None => format!("{:.0}", self.events_per_second),
        }
    }

    /// The steady rate when measured, else the whole drain's: what ratios compare.
    pub fn best_rate(&self) -> f64 {
        self.steady_events_per_second
            .unwrap_or(self.events_per_second)
    }
}

/// When a backlog drain started, reached 10% and 90% of the backlog, and ended.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DrainTiming {
    /// From the relay's start to the whole backlog published.
    pub took: Duration,
    /// From the relay's start to 10% of the backlog published.
    pub tenth: Option<Duration>,
    /// From the relay's start to 90% of the backlog published.
    pub ninth_tenth: Option<Duration>,
    /// CPU per message over the whole drain.
    pub cpu: Option<cpu::CpuPerMessage>,
}

impl DrainTiming {
    /// Events/s between 10% and 90% of `events` published; none when the two were not
    /// both seen or too close to tell apart (a tiny backlog).
    pub fn steady_rate(&self, events: u64) -> Option<f64> {
        let (a, b) = (self.tenth?, self.ninth_tenth?);
        let span = b.checked_sub(a)?.as_secs_f64();
        (span >= 0.05).then(|| (events as f64 * 0.8) / span)
    }
}

/// Runs the mode `options` names, printing its text report on stdout as it goes; every mode
/// works in scratch schemas and streams of its own and drops them, failed or not.
pub async fn run(options: Options) -> anyhow::Result<Report> {
    if mysql::is_mysql(&options.database_url) {
        return mysql::run(options).await;
    }
    if options.sink_url.is_some() && options.mode != Mode::Backlog {
        anyhow::bail!("bench: only backlog mode measures sinks other than NATS; drop --sink or use --mode backlog");
    }
    let connections = options.producers.max(options.clients).max(4) as u32 + 4;
    let pool = sqlx::Postgres::connect_pool(&options.database_url, connections).await?;
    // Through the sink's own config: credentials go to the client, never into its log.
    let client = outbox_sinks::nats::NatsConfig::from_url(&options.nats_url)?
        .connect_client()
        .await
        .context("connecting to NATS for the bench stream")?;
    let ctx = Ctx {
        js: jetstream::new(client),
        options,
        pool,
    };
    match ctx.options.mode {
        Mode::Backlog => backlog::run(bed::Bed::Postgres(&ctx)).await,
        Mode::Steady => steady::run(bed::Bed::Postgres(&ctx)).await,
        Mode::Writers => writers::run(bed::Bed::Postgres(&ctx)).await,
        Mode::IdleTx => idle_tx::run(bed::Bed::Postgres(&ctx)).await,
        Mode::Idle => idle::run(&ctx).await,
        Mode::Inbox => inbox::run(bed::Bed::Postgres(&ctx)).await,
        Mode::BigTx => big_tx::run(&ctx).await,
        Mode::Cdc => cdc::run(&ctx).await,
    }
}

/// `keys` for the modes that take one value, on any database.
fn single_keys(options: &Options) -> anyhow::Result<usize> {
    match options.keys.as_slice() {
        [k] => Ok(*k),
        _ => Err(outbox_core::Error::config(
            "--keys takes one value in this mode (a comma list only in backlog mode)",
        )
        .into()),
    }
}

/// "met" or "missed", for a figure against its target.
fn verdict(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "missed"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timing(took: u64, tenth: Option<u64>, ninth: Option<u64>) -> DrainTiming {
        DrainTiming {
            cpu: None,
            took: Duration::from_millis(took),
            tenth: tenth.map(Duration::from_millis),
            ninth_tenth: ninth.map(Duration::from_millis),
        }
    }

    #[test]
    fn the_steady_rate_leaves_out_the_start_and_the_tail() {
        // 100,000 events: 2 s to start, 80,000 of them in the next 1 s, a slow tail.
        let t = timing(4_000, Some(2_000), Some(3_000));
        assert_eq!(t.steady_rate(100_000), Some(80_000.0));
        let d = Drain::drained(100_000, &t, LatencyFigures::default());
        assert_eq!(d.events_per_second, 25_000.0);
        assert_eq!(d.best_rate(), 80_000.0);
        assert_eq!(d.rate(), "25000 (80000)");
    }

    #[test]
    fn a_nats_sink_names_the_baseline_server_and_any_other_is_measured_beside_it() {
        let nats = |u: &str| Some(u.to_string());
        assert_eq!(
            split_sink(nats("nats://h:4222"), nats("nats://other:4222")),
            ("nats://h:4222".into(), None)
        );
        assert_eq!(
            split_sink(nats("redis://h:6379"), None),
            (DEFAULT_NATS_URL.into(), nats("redis://h:6379"))
        );
        assert_eq!(
            split_sink(None, nats("tls://n:4222")),
            ("tls://n:4222".into(), None)
        );
    }

    #[test]
    fn no_steady_rate_without_both_marks_or_for_a_blink() {
        assert_eq!(timing(10, None, Some(9)).steady_rate(10), None);
        assert_eq!(timing(10, Some(1), Some(20)).steady_rate(10), None);
        let d = Drain::drained(10, &timing(1_000, Some(1), None), LatencyFigures::default());
        assert_eq!(d.rate(), "10");
        assert_eq!(d.best_rate(), 10.0);
    }
}
