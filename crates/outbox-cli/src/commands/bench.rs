//! `outbox bench`: measurements against real PostgreSQL and NATS JetStream, each compared side
//! by side in one run. Every mode works in scratch schemas and streams of its own and drops them.
//!
//! - `backlog`: drain throughput of the relay and of the seed articles' naive relay, per key count;
//!   with `--sink`, that sink's drain beside the engine alone (a discarding sink).
//! - `steady`: commit→ack latency under a paced load.
//! - `writers`: what the outbox costs a business transaction (writer API, raw SQL, naive table).
//! - `idle-tx`: the steady load without, then with, a REPEATABLE READ snapshot held open.
//! - `big-tx`: one transaction of a million rows committed while the relay drains other keys,
//!   beside the same rows written as a thousand transactions.
//! - `idle`: CPU of the relay and of PostgreSQL with no traffic.
//! - `inbox`: the receiving side, ingest and handlers, each beside a naive consumer that does one
//!   transaction per message.
//!
//! Latency is measured at the broker (see [`latency`]); published counts come from the relay's
//! metrics and the stream. Nothing reads the engine's tables or columns, so the modes keep
//! working when the engine changes underneath.

mod backlog;
mod big_tx;
mod discard;
mod idle;
mod idle_tx;
mod inbox;
mod latency;
mod load;
mod naive;
mod relay;
mod scratch;
mod steady;
mod writers;

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use async_nats::jetstream;
use outbox_postgres::connect_pool;
use serde::Serialize;
use sqlx::PgPool;

use crate::cli::{BenchArgs, BenchMode, Format};
use latency::LatencyFigures;

const DEFAULT_DB: &str = "postgres://root@127.0.0.1:5432/test";
const DEFAULT_NATS: &str = "nats://127.0.0.1:4222";

/// What every mode needs: the arguments, a pool for producers and setup, and JetStream.
pub struct Ctx {
    pub args: BenchArgs,
    pub db: String,
    pub nats_url: String,
    /// A sink other than NATS to measure, side by side with NATS (backlog mode).
    pub sink_url: Option<String>,
    pub pool: PgPool,
    pub js: jetstream::Context,
}

impl Ctx {
    /// `--duration`, or the mode's default.
    fn duration(&self, default: Duration) -> Duration {
        self.args.duration.map_or(default, |d| d.0)
    }

    /// `--keys` for the modes that take one value.
    fn single_keys(&self) -> anyhow::Result<usize> {
        match self.args.keys.as_slice() {
            [k] => Ok(*k),
            _ => Err(outbox_core::Error::config(
                "--keys takes one value in this mode (a comma list only in backlog mode)",
            )
            .into()),
        }
    }

    /// Payload padding of `--payload-bytes`.
    fn pad(&self) -> String {
        load::pad(self.args.payload_bytes)
    }

    /// "LISTEN/NOTIFY wake-ups" or "polling", for report headers.
    fn wake_up(&self) -> &'static str {
        if self.args.listen {
            "LISTEN/NOTIFY wake-ups"
        } else {
            "polling (no LISTEN)"
        }
    }

    fn json(&self) -> bool {
        self.args.format == Format::Json
    }
}

/// Figures of one measured drain or load.
#[derive(Debug, Serialize)]
pub struct Drain {
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
        }
    }

    /// The figures of a timed backlog drain, its steady rate included.
    pub fn drained(events: u64, timing: &DrainTiming, latency: LatencyFigures) -> Self {
        Self {
            steady_events_per_second: timing.steady_rate(events),
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
pub struct DrainTiming {
    /// From the relay's start to the whole backlog published.
    pub took: Duration,
    /// From the relay's start to 10% and to 90% of the backlog published.
    pub tenth: Option<Duration>,
    pub ninth_tenth: Option<Duration>,
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

/// Runs the mode `args` names.
pub async fn run(args: BenchArgs) -> anyhow::Result<ExitCode> {
    let db = args
        .database_url
        .clone()
        .or_else(|| std::env::var("DATABASE_URL").ok())
        .unwrap_or_else(|| DEFAULT_DB.into());
    let sink = args
        .sink
        .clone()
        .or_else(|| std::env::var("OUTBOX_SINK").ok());
    let is_nats = |u: &str| u.starts_with("nats://") || u.starts_with("tls://");
    // `--sink nats://…` names the NATS server itself, as it always did.
    let (nats_url, sink_url) = match sink {
        Some(u) if is_nats(&u) => (u, None),
        other => (
            args.nats.clone().unwrap_or_else(|| DEFAULT_NATS.into()),
            other,
        ),
    };
    if sink_url.is_some() && args.mode != BenchMode::Backlog {
        anyhow::bail!("bench: only backlog mode measures sinks other than NATS; drop --sink or use --mode backlog");
    }
    let connections = args.producers.max(args.clients).max(4) as u32 + 4;
    let pool = connect_pool(&db, connections).await?;
    // Through the sink's own config: credentials go to the client, never into its log.
    let client = outbox_sinks::nats::NatsConfig::from_url(&nats_url)?
        .connect_client()
        .await
        .context("connecting to NATS for the bench stream")?;
    let ctx = Ctx {
        js: jetstream::new(client),
        args,
        db,
        nats_url,
        sink_url,
        pool,
    };
    match ctx.args.mode {
        BenchMode::Backlog => backlog::run(&ctx).await,
        BenchMode::Steady => steady::run(&ctx).await,
        BenchMode::Writers => writers::run(&ctx).await,
        BenchMode::IdleTx => idle_tx::run(&ctx).await,
        BenchMode::Idle => idle::run(&ctx).await,
        BenchMode::Inbox => inbox::run(&ctx).await,
        BenchMode::BigTx => big_tx::run(&ctx).await,
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
    fn no_steady_rate_without_both_marks_or_for_a_blink() {
        assert_eq!(timing(10, None, Some(9)).steady_rate(10), None);
        assert_eq!(timing(10, Some(1), Some(20)).steady_rate(10), None);
        let d = Drain::drained(10, &timing(1_000, Some(1), None), LatencyFigures::default());
        assert_eq!(d.rate(), "10");
        assert_eq!(d.best_rate(), 10.0);
    }
}
