//! The outbox story of the seed articles behind `outbox demo`, as a library: told live on the
//! embedded default (SQLite and a JSON-lines file), or on real servers with a PostgreSQL
//! database URL and a broker's sink URL.
//!
//! Scenes: payments commit atomically with their events (rollbacks leave nothing); the broker
//! goes away and events wait, visibly; a relay crashes mid-batch and another takes over when the
//! lease expires; a ledger consumer records every event in its inbox (a redelivery is absorbed
//! by message id) and applies every payment exactly once with the inbox processor.
//!
//! The faults are sink wrappers of its own (`faults.rs`): [`OutageSink`] takes the broker away,
//! [`CrashingSink`] hangs a relay right after the broker took its batch.

mod args;
mod faults;
mod ledger;
mod payments;

pub use args::Args;

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use faults::{CrashingSink, OutageSink};
use outbox_core::{DestinationTemplate, RetryPolicy, Stats};
use outbox_db::{Backend, Database};
use outbox_relay::{Relay, RelayConfig, RelayMetrics};
use outbox_sinks::read::ScratchOptions;
use tokio_util::sync::CancellationToken;

use ledger::{Consumed, Ledger};
use payments::{pay, Produced};

pub use payments::DEMO_SCHEMA;

/// Where the demo runs and how long its faults last.
#[derive(Debug, Clone)]
pub struct Options {
    /// Folder for the demo's files (created when missing).
    pub dir: PathBuf,
    /// The payments database (default `sqlite://<dir>/payments.db`, recreated). A PostgreSQL
    /// URL uses `schema`, dropped and recreated.
    pub database_url: Option<String>,
    /// Schema of a PostgreSQL demo (default [`DEMO_SCHEMA`]); an existing schema is dropped only
    /// when its name starts with [`DEMO_SCHEMA`].
    pub schema: Option<String>,
    /// The broker (default `file:<dir>/events.jsonl`, recreated); any other sink publishes to a
    /// scratch destination of its own, removed at the end.
    pub sink_url: Option<String>,
    /// How long the broker stays away in the outage scene (whole seconds are printed).
    pub outage: Duration,
    /// Partition lease of the demo's relays: how long the crashed relay's work waits.
    pub lease: Duration,
}

/// How the story ended: what was committed, what arrived, what the ledger applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    /// Payments committed (each with its event).
    pub committed: usize,
    /// Their total, in cents.
    pub committed_cents: i64,
    /// Payments rolled back by the fraud check.
    pub rolled_back: usize,
    /// Events of rolled-back payments that reached the broker (must be 0).
    pub phantoms: usize,
    /// Committed events that reached the broker (distinct ids).
    pub delivered: usize,
    /// Committed events that never reached it (must be 0).
    pub lost: usize,
    /// Messages the ledger read, duplicates included.
    pub received: u64,
    /// Redeliveries the ledger's inbox absorbed.
    pub duplicates: u64,
    /// Payments the ledger applied (must equal `committed`).
    pub ledger_payments: i64,
    /// Their total, in cents (must equal `committed_cents`).
    pub ledger_cents: i64,
}

impl Summary {
    /// Nothing lost, nothing invented, every payment applied once.
    pub fn passed(&self) -> bool {
        self.lost == 0
            && self.phantoms == 0
            && self.ledger_cents == self.committed_cents
            && usize::try_from(self.ledger_payments).is_ok_and(|n| n == self.committed)
    }
}

fn relay_config(prefix: &str, lease: Duration, destination: &DestinationTemplate) -> RelayConfig {
    RelayConfig {
        batch_size: 100,
        workers: 1,
        poll_interval: Duration::from_millis(100),
        lease,
        // The outage scene must end with the backlog drained, never with messages `failed`:
        // a budget no outage of the demo can spend, and retries quick enough to watch.
        retry: RetryPolicy {
            max_attempts: 1000,
            base: Duration::from_millis(200),
            max: Duration::from_secs(1),
        },
        destination: destination.clone(),
        member_prefix: prefix.into(),
        ..RelayConfig::default()
    }
}

fn money(cents: i64) -> String {
    format!("{}.{:02}", cents / 100, cents % 100)
}

fn line(s: &Stats, published: u64) -> String {
    format!(
        "pending {:>4}   oldest pending {:>5}   published {:>5}",
        s.pending,
        s.oldest_pending_age_seconds
            .map_or("-".to_string(), |a| format!("{a:.1}s")),
        published
    )
}

/// Tells the story on stdout, scene by scene, and returns how it ended (the last line printed
/// says whether every guarantee held).
pub async fn run(options: Options) -> anyhow::Result<Summary> {
    // Long because: the story's four scenes in order, sharing one producer, relay and ledger.
    let dir = &options.dir;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let db_url = options
        .database_url
        .clone()
        .unwrap_or_else(|| format!("sqlite://{}", dir.join("payments.db").display()));
    let sink_url = options
        .sink_url
        .clone()
        .unwrap_or_else(|| format!("file:{}", dir.join("events.jsonl").display()));
    let schema = options.schema.clone().unwrap_or_else(|| DEMO_SCHEMA.into());
    let lease = options.lease;
    let started = Instant::now();

    let db = Arc::new(payments::open(&db_url, &schema).await?);
    // The demo's short lease must still cover the sink's wait for an acknowledgement (a
    // quarter of it, so the sink reports its own timeout before the relay's publish deadline).
    let sink_url = outbox_sinks::with_default_ack_timeout(&sink_url, lease / 4);
    let scratch = outbox_sinks::read::scratch(&sink_url, &ScratchOptions::new("demo")).await?;
    let mut broker = scratch.reader;
    let sink = outbox_sinks::connect(&scratch.sink_url).await?;
    let destination = DestinationTemplate::parse(&scratch.destination)?;
    let ledger_path = dir.join("ledger.db");
    let ledger = Ledger::open(&ledger_path).await?;
    let stop_ledger = CancellationToken::new();
    let ledger_task = tokio::spawn(ledger.processor()?.run(stop_ledger.clone()));
    let store = db.store();

    println!(
        "outbox demo: a payments service, its outbox, a relay, a broker and a ledger consumer."
    );
    println!("  database  {}", outbox_core::redact::url(&db_url));
    println!("  broker    {}", broker.describe());
    println!(
        "  ledger    {} (the consumer's own database)",
        ledger_path.display()
    );
    println!();

    // The world keeps turning in the background: payments, and the ledger reading the broker.
    let produced = Arc::new(Mutex::new(Produced::default()));
    let stop_producing = CancellationToken::new();
    let producer = {
        let (db, produced, stop) = (db.clone(), produced.clone(), stop_producing.clone());
        tokio::spawn(async move {
            let mut n: u64 = 0;
            while !stop.is_cancelled() {
                let fraud = n % 5 == 4;
                let amount = 100 + fastrand::i64(0..50_000);
                let id = pay(&db, amount, fraud).await?;
                if let Ok(mut p) = produced.lock() {
                    if fraud {
                        p.rolled_back.insert(id);
                    } else {
                        p.committed.insert(id, amount);
                    }
                }
                n += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            anyhow::Ok(())
        })
    };

    // Relay A publishes through both faults: the outage (scene 2) and the crash (scene 3).
    let outage = Arc::new(OutageSink::new(sink.clone()));
    let crash = Arc::new(CrashingSink::new(outage.clone()));
    let relay_a = Relay::new(
        store.clone(),
        crash.clone(),
        relay_config("relay-a", lease, &destination),
    );
    let metrics_a = relay_a.metrics();
    let relay_a_task = tokio::spawn(relay_a.run(CancellationToken::new()));

    let mut counts = Consumed::default();

    println!("1. Payments and their events commit together");
    println!("   Each payment row and its `payment.created` event are written in one transaction.");
    println!("   Every fifth payment fails a fraud check and rolls back: no payment, no event.");
    // The consumer runs in this task between scene steps (it borrows the broker).
    let run_for = |d: Duration| tokio::time::sleep(d);
    for _ in 0..30 {
        run_for(Duration::from_millis(100)).await;
        counts.step(broker.as_mut(), &ledger).await?;
    }
    let (c, r) = produced
        .lock()
        .map(|p| (p.committed.len(), p.rolled_back.len()))
        .unwrap_or_default();
    println!(
        "   so far: {c} committed, {r} rolled back; {} events published; ledger inbox recorded {}",
        RelayMetrics::get(&metrics_a.published),
        counts.recorded
    );
    println!();

    println!("2. The broker goes away for {} s", options.outage.as_secs());
    println!(
        "   Every publish is refused. Payments keep committing; their events wait in the outbox."
    );
    outage.start_outage();
    let outage_end = Instant::now() + options.outage;
    while Instant::now() < outage_end {
        for _ in 0..10 {
            run_for(Duration::from_millis(100)).await;
            counts.step(broker.as_mut(), &ledger).await?;
        }
        println!(
            "   {}",
            line(
                &store.stats().await?,
                RelayMetrics::get(&metrics_a.published)
            )
        );
    }
    let backlog = store.stats().await?.pending;
    outage.end_outage();
    println!("   The broker is back: the relay retries and the backlog of {backlog} drains.");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        run_for(Duration::from_millis(100)).await;
        counts.step(broker.as_mut(), &ledger).await?;
        let s = store.stats().await?;
        if s.pending < 10 || Instant::now() > deadline {
            println!("   {}", line(&s, RelayMetrics::get(&metrics_a.published)));
            break;
        }
    }
    println!();

    println!("3. A relay crashes mid-batch");
    crash.arm();
    let crashed_batch = crash.crashed().await;
    relay_a_task.abort();
    let _ = relay_a_task.await;
    let crashed_at = Instant::now();
    println!(
        "   Relay A died right after the broker took a batch of {crashed_batch} and before it recorded it:"
    );
    println!("   those rows are still pending, and its partitions stay leased for {lease:?}.");
    let relay_b = Relay::new(
        store.clone(),
        sink.clone(),
        relay_config("relay-b", lease, &destination),
    );
    let metrics_b = relay_b.metrics();
    let stop_b = CancellationToken::new();
    let relay_b_task = tokio::spawn(relay_b.run(stop_b.clone()));
    println!("   Relay B starts and waits for the lease to expire...");
    let deadline = Instant::now() + lease * 5 + Duration::from_secs(10);
    loop {
        run_for(Duration::from_millis(100)).await;
        counts.step(broker.as_mut(), &ledger).await?;
        let s = store.stats().await?;
        let b_owns = s
            .members
            .iter()
            .any(|m| m.member.starts_with("relay-b") && m.partitions > 0);
        let a_gone = !s
            .members
            .iter()
            .any(|m| m.member.starts_with("relay-a") && m.partitions > 0);
        if b_owns && a_gone {
            println!(
                "   Relay B took over after {:.1} s and republished the unrecorded batch (same message ids).",
                crashed_at.elapsed().as_secs_f64()
            );
            break;
        }
        anyhow::ensure!(Instant::now() < deadline, "relay B never took over: {s:?}");
    }
    for _ in 0..20 {
        run_for(Duration::from_millis(100)).await;
        counts.step(broker.as_mut(), &ledger).await?;
    }
    println!();

    println!("4. The ledger catches up");
    stop_producing.cancel();
    producer.await??;
    let committed_total: i64;
    let (committed, rolled_back) = {
        let p = produced
            .lock()
            .map_err(|_| anyhow::anyhow!("producer state poisoned"))?;
        committed_total = p.committed.values().sum();
        (
            p.committed.keys().copied().collect::<HashSet<_>>(),
            p.rolled_back.clone(),
        )
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        run_for(Duration::from_millis(100)).await;
        counts.step(broker.as_mut(), &ledger).await?;
        let have = committed
            .iter()
            .filter(|id| counts.arrived.contains(id))
            .count();
        if have == committed.len() || Instant::now() > deadline {
            break;
        }
    }
    stop_b.cancel();
    relay_b_task.await?;
    // The ledger's processor applies what its inbox recorded.
    let deadline = Instant::now() + Duration::from_secs(30);
    while ledger.totals().await?.0 < committed.len() as i64 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop_ledger.cancel();
    ledger_task.await?;
    let arrived = &counts.arrived;
    let delivered = committed.iter().filter(|id| arrived.contains(id)).count();
    let (ledger_payments, ledger_total) = ledger.totals().await?;
    let summary = Summary {
        committed: committed.len(),
        committed_cents: committed_total,
        rolled_back: rolled_back.len(),
        phantoms: rolled_back.iter().filter(|id| arrived.contains(id)).count(),
        delivered,
        lost: committed.len() - delivered,
        received: counts.received,
        duplicates: counts.duplicates,
        ledger_payments,
        ledger_cents: ledger_total,
    };
    let s = store.stats().await?;
    let published =
        RelayMetrics::get(&metrics_a.published) + RelayMetrics::get(&metrics_b.published);
    println!("   {}", line(&s, published));
    println!();

    print_summary(&summary, started, dir);
    // A PostgreSQL or MySQL demo drops its schema (database); a SQLite one keeps its file for a
    // look (see `files`).
    if db.backend() != Backend::Sqlite {
        let _ = Database::clone(&db).destroy().await;
    }
    broker.cleanup().await;
    if summary.passed() {
        println!("\nNothing lost, nothing invented, every payment applied once.");
    } else {
        println!("\nA guarantee was broken (see above).");
    }
    Ok(summary)
}

fn print_summary(s: &Summary, started: Instant, dir: &std::path::Path) {
    println!("Summary ({:.0} s)", started.elapsed().as_secs_f64());
    println!(
        "  payments committed        {:>6}   total {}",
        s.committed,
        money(s.committed_cents)
    );
    println!(
        "  payments rolled back      {:>6}   events published for them: {}",
        s.rolled_back, s.phantoms
    );
    println!(
        "  events delivered          {:>6}   distinct ids, {} messages received",
        s.delivered, s.received
    );
    println!(
        "  duplicates absorbed       {:>6}   (redeliveries after the crash, absorbed by the ledger's inbox)",
        s.duplicates
    );
    println!("  lost                      {:>6}", s.lost);
    println!(
        "  ledger                    {:>6}   payments applied once by the inbox processor, total {}{}",
        s.ledger_payments,
        money(s.ledger_cents),
        if s.ledger_cents == s.committed_cents {
            " = committed total"
        } else {
            "  MISMATCH"
        }
    );
    println!("  files                     {}", dir.display());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary() -> Summary {
        Summary {
            committed: 3,
            committed_cents: 1_000,
            rolled_back: 1,
            phantoms: 0,
            delivered: 3,
            lost: 0,
            received: 4,
            duplicates: 1,
            ledger_payments: 3,
            ledger_cents: 1_000,
        }
    }

    #[test]
    fn a_story_passes_only_when_nothing_is_lost_invented_or_applied_twice() {
        assert!(summary().passed());
        assert!(!Summary {
            lost: 1,
            ..summary()
        }
        .passed());
        assert!(!Summary {
            phantoms: 1,
            ..summary()
        }
        .passed());
        assert!(!Summary {
            ledger_payments: 4,
            ..summary()
        }
        .passed());
        assert!(!Summary {
            ledger_cents: 999,
            ..summary()
        }
        .passed());
    }

    #[test]
    fn amounts_print_as_money() {
        assert_eq!(money(12_411_199), "124111.99");
        assert_eq!(money(105), "1.05");
    }
}
