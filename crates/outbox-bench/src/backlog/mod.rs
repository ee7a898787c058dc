//! Backlog mode, on PostgreSQL or MySQL/MariaDB: for each key count, fill a backlog through the
//! writer API, `ANALYZE` it (production tables have statistics), drain it with the relay, then
//! do the same with the seed articles' naive relay on its own seed-style table, and compare
//! events/s. On MySQL/MariaDB the message table's footprint after the drain and after retention
//! is reported too, with the CPU each message cost the relay, the server and the broker.
//!
//! With `--sink` (PostgreSQL), the same backlog is also drained into the bench's discarding
//! sink (see the `discard` module): the engine alone, so the report says whether the sink or
//! the engine sets the pace.
//!
//! Drain time runs from starting the relay to the relay's `published` counter reaching the
//! backlog (every message acknowledged by the broker); the stream is then checked to hold
//! exactly the backlog. Beside it, in parentheses, the steady rate: from 10% to 90% of the
//! backlog published, without the relay's start-up and its last partial batches. Latency is
//! commit→ack at the broker, so it includes the time a row waited in the backlog.
//!
//! The database's own steps are in `postgres` and `mysql`; the naive relays there are the raw
//! baseline SQL issue 47 excepts.

mod mysql;
mod postgres;

use std::future::Future;
use std::time::{Duration, Instant};

use outbox_relay::RelayMetrics;
use serde::Serialize;

pub(crate) use postgres::{fill_analysed, finish, measured_drain, relay_drain};

use crate::bed::Bed;
use crate::latency::Probe;
use crate::{Drain, DrainTiming, Report};

/// How long a drain may publish nothing before the run is abandoned: a relay that makes
/// progress is waited for, however slow its sink (SQS with one key publishes a few hundred a
/// second, so 200,000 rows take many minutes).
const DRAIN_STALL: Duration = Duration::from_secs(120);

/// Longest a drain may take in all, progress or not.
const DRAIN_LIMIT: Duration = Duration::from_secs(3600);

/// The figures of one key count.
#[derive(Debug, Serialize)]
struct Run {
    keys: usize,
    relay: Drain,
    naive: Option<Drain>,
    /// Relay events/s over naive events/s.
    speedup: Option<f64>,
    /// What only one database reports.
    #[serde(flatten)]
    seen: Seen,
}

/// The figures of a key count that only one database reports.
#[derive(Debug, Serialize)]
#[serde(untagged)]
enum Seen {
    Postgres {
        /// The relay draining the same backlog into `--sink`, when one other than NATS is
        /// given.
        sink: Option<Drain>,
        /// The same backlog into a sink that acknowledges at once (with `--sink`): the
        /// engine's own ceiling beside it.
        engine: Option<Drain>,
    },
    Mysql {
        /// The message table after the drain and after retention.
        footprint: mysql::Retention,
    },
}

/// Runs backlog mode on the database of `bed`.
pub async fn run(bed: Bed<'_>) -> anyhow::Result<Report> {
    let a = bed.options();
    let naive_rows = a.naive_rows.unwrap_or(a.rows.min(20_000));
    match bed {
        Bed::Postgres(ctx) => postgres::header(ctx, naive_rows),
        Bed::Mysql(_) => mysql::header(a, naive_rows),
    }
    let mut runs = Vec::new();
    for &keys in &a.keys {
        let (relay, seen) = match bed {
            Bed::Postgres(ctx) => {
                let (sink, engine) = match &a.sink_url {
                    Some(url) => postgres::sink_and_engine(ctx, url, keys).await?,
                    None => (None, None),
                };
                let relay = relay_drain(ctx, keys).await?;
                println!("  keys {keys:>6}  relay: {}", line(&relay));
                (relay, Seen::Postgres { sink, engine })
            }
            Bed::Mysql(ctx) => {
                let (relay, footprint) = mysql::relay_drain(ctx, keys).await?;
                println!("  keys {keys:>6}  relay: {}", line_as(&relay, "MariaDB"));
                footprint.print(keys);
                (relay, Seen::Mysql { footprint })
            }
        };
        let naive = if a.naive {
            let n = match bed {
                Bed::Postgres(ctx) => postgres::naive_drain(ctx, keys, naive_rows).await?,
                Bed::Mysql(ctx) => mysql::naive_drain(ctx, keys, naive_rows).await?,
            };
            let shown = match bed {
                Bed::Postgres(_) => line(&n),
                Bed::Mysql(_) => line_as(&n, "MariaDB"),
            };
            println!("  keys {keys:>6}  naive: {shown}");
            Some(n)
        } else {
            None
        };
        let speedup = naive
            .as_ref()
            .map(|n| relay.events_per_second / n.events_per_second);
        runs.push(Run {
            keys,
            relay,
            naive,
            speedup,
            seen,
        });
    }
    let mut figures = serde_json::json!({ "mode": "backlog", "rows": a.rows,
        "naive_rows": naive_rows, "analyze": a.analyze, "runs": runs });
    match bed {
        Bed::Postgres(_) => {
            print_summary(&runs);
            figures["listen"] = a.listen.into();
        }
        Bed::Mysql(_) => {
            mysql::print_summary(&runs);
            figures["database"] = "mysql".into();
        }
    }
    Ok(Report::line(figures))
}

/// A drain's figures on one line, the CPU per message named PostgreSQL's.
pub(crate) fn line(d: &Drain) -> String {
    line_as(d, "PostgreSQL")
}

/// [`line`] with the database server named `server`.
fn line_as(d: &Drain, server: &str) -> String {
    let steady = d
        .steady_events_per_second
        .map_or(String::new(), |s| format!(" ({s:.0} from 10% to 90%)"));
    let cpu = d
        .cpu
        .map_or(String::new(), |c| format!("; {}", c.line_as(server)));
    format!(
        "{} events in {:.2} s = {:>7.0} events/s{steady}; commit→ack {} (backlog wait \
         included){cpu}",
        d.events,
        d.seconds,
        d.events_per_second,
        d.latency.line()
    )
}

/// PostgreSQL's summary table: the sink and the engine alone beside the relay and the naive.
fn print_summary(runs: &[Run]) {
    println!(
        "  events/s over the whole drain (from 10% to 90% of it); relay/naive compares whole \
         drains, sink/engine the steady rates"
    );
    println!(
        "  keys            relay ev/s  naive ev/s  relay/naive           sink ev/s         engine ev/s  sink/engine"
    );
    for r in runs {
        let naive = r
            .naive
            .as_ref()
            .map_or("-".into(), |n| format!("{:.0}", n.events_per_second));
        let ratio = r.speedup.map_or("-".into(), |s| format!("{s:.1}x"));
        let (sink, engine) = match &r.seen {
            Seen::Postgres { sink, engine } => (sink.as_ref(), engine.as_ref()),
            Seen::Mysql { .. } => (None, None),
        };
        let share = match (sink, engine) {
            (Some(s), Some(e)) => format!("{:.2}", s.best_rate() / e.best_rate()),
            _ => "-".into(),
        };
        let sink = sink.map_or("-".into(), Drain::rate);
        let engine = engine.map_or("-".into(), Drain::rate);
        println!(
            "  {:>6}  {:>20}  {naive:>10}  {ratio:>11}  {sink:>18}  {engine:>18}  {share:>11}",
            r.keys,
            r.relay.rate()
        );
    }
}

/// Waits for the probe to see every message, checks that the stream holds `rows` (as
/// `in_stream` reads it then), and assembles the figures.
async fn finish_with(
    probe: Probe,
    rows: u64,
    timing: DrainTiming,
    in_stream: impl Future<Output = anyhow::Result<u64>>,
) -> anyhow::Result<Drain> {
    let missing = probe.drain(Duration::from_secs(60)).await;
    let latency = probe.finish().await;
    let in_stream = in_stream.await?;
    if in_stream != rows || missing > 0 {
        anyhow::bail!(
            "the stream holds {in_stream} messages and the probe misses {missing}; expected {rows}"
        );
    }
    Ok(Drain::drained(rows, &timing, latency))
}

/// Waits for the relay's `published` counter to reach `target`, noting when it passed 10% and
/// 90% of it (every 5 ms, so a drain of a second or more is timed to within 1%). Gives up when
/// nothing was published for [`DRAIN_STALL`], or after [`DRAIN_LIMIT`] in all.
pub(crate) async fn wait_published(
    metrics: &RelayMetrics,
    target: u64,
    started: Instant,
) -> anyhow::Result<DrainTiming> {
    let mut timing = DrainTiming {
        took: Duration::ZERO,
        tenth: None,
        ninth_tenth: None,
        cpu: None,
    };
    let mut last = (0, started);
    loop {
        let published = RelayMetrics::get(&metrics.published);
        if timing.tenth.is_none() && published * 10 >= target {
            timing.tenth = Some(started.elapsed());
        }
        if timing.ninth_tenth.is_none() && published * 10 >= target * 9 {
            timing.ninth_tenth = Some(started.elapsed());
        }
        if published >= target {
            timing.took = started.elapsed();
            return Ok(timing);
        }
        let now = Instant::now();
        if published > last.0 {
            last = (published, now);
        }
        if let Some(why) = drain_given_up(now - started, now - last.1) {
            anyhow::bail!("gave up {why}: {published} of {target} published");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Why a drain that has run for `elapsed`, the last `stalled` of it without publishing, is
/// abandoned; `None` while it may go on.
fn drain_given_up(elapsed: Duration, stalled: Duration) -> Option<String> {
    if stalled > DRAIN_STALL {
        Some(format!("after {DRAIN_STALL:?} without progress"))
    } else if elapsed > DRAIN_LIMIT {
        Some(format!("after {DRAIN_LIMIT:?} in all"))
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slow_drain_that_keeps_publishing_is_waited_for() {
        // Twenty minutes in, last published a second ago: SQS with one key looks like this.
        assert_eq!(
            drain_given_up(Duration::from_secs(1200), Duration::from_secs(1)),
            None
        );
    }

    #[test]
    fn a_drain_that_stalls_or_runs_past_the_limit_is_abandoned_and_says_which() {
        let stalled = drain_given_up(Duration::from_secs(300), Duration::from_secs(121)).unwrap();
        assert!(stalled.contains("without progress"), "{stalled}");
        let too_long = drain_given_up(Duration::from_secs(3601), Duration::ZERO).unwrap();
        assert!(too_long.contains("in all"), "{too_long}");
    }
}
