//! `outbox verify`: a workload, real relay processes, faults on a seeded schedule, and a checker
//! of the guarantees. Anyone can run it against their own database and broker.
//!
//! Producers commit business (ledger) rows and their events in one transaction, several of them
//! on the same keys, rolling some back on purpose (`workload`); relays run as OS processes of
//! this binary (`relays`); an independent consumer reads the broker. Faults (`faults`):
//! `kill -9` of a relay, SIGSTOP past the lease then SIGCONT (the fencing case), broker
//! stop/start, database restart. The checker compares what arrived with the ledger (`report`).

mod faults;
mod relays;
mod report;
mod workload;

use std::collections::{BTreeMap, HashSet};
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use outbox_db::{Backend, Database};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::checker::{check, Arrival, FaultMark};
use super::observer::Broker;
use crate::cli::{Format, Profile, VerifyArgs};
use faults::{FaultEvent, Schedule};
use relays::Relays;
use report::Report;
use workload::Shape;

/// What the independent consumer has received.
#[derive(Default)]
struct Received {
    arrivals: Vec<Arrival>,
    seen: HashSet<Uuid>,
    unreadable: usize,
}

impl Received {
    /// Reads what arrived since the last call. The broker may be down (a fault): then nothing
    /// is read and the next tick tries again.
    async fn poll(&mut self, broker: &mut Broker, started: Instant) {
        let at = started.elapsed().as_secs_f64();
        let (events, unreadable) = broker.poll().await;
        self.unreadable += unreadable;
        for e in events {
            let payload_key = e.payload["key"].as_str().unwrap_or_default().to_string();
            self.seen.insert(e.id);
            self.arrivals.push(Arrival {
                id: e.id,
                key: e.key,
                payload_key,
                at,
            });
        }
    }
}

/// Opens the run's database: a fresh schema of its own on PostgreSQL; on SQLite the file the
/// URL names, or a fresh one in `tmp` when it names none. Returns it and the URL relays use.
async fn open_database(
    url: &str,
    tmp: &std::path::Path,
    pool_size: u32,
) -> anyhow::Result<(Database, String)> {
    let url = match Backend::of(url)? {
        Backend::Sqlite
            if url
                .split_once(':')
                .is_some_and(|(_, rest)| rest.trim_start_matches('/').is_empty()) =>
        {
            format!("sqlite://{}", tmp.join("verify.db").display())
        }
        _ => url.to_string(),
    };
    let schema = format!("outbox_verify_{:08x}", fastrand::u32(..));
    Ok((outbox_db::open(&url, &schema, pool_size).await?, url))
}

pub async fn run(args: VerifyArgs) -> anyhow::Result<ExitCode> {
    let (d, r, p, rp, k) = match args.profile {
        Profile::Short => (Duration::from_secs(40), 3, 4, 2, 64),
        Profile::Long => (Duration::from_secs(600), 3, 8, 4, 500),
    };
    let duration = args.duration.map_or(d, |x| x.0);
    let relay_count = args.relays.unwrap_or(r).max(1);
    let keys = args.keys.unwrap_or(k).max(1);
    let shape = Shape {
        producers: args.producers.unwrap_or(p).max(1),
        keys,
        raw_producers: args.raw_producers.unwrap_or(rp),
        raw_keys: (keys / 4).max(2),
    };
    let seed = args.seed.unwrap_or_else(|| fastrand::u64(..));
    let mut kinds: Vec<String> = Vec::new();
    for f in &args.faults {
        match f.as_str() {
            "kill" | "pause" => kinds.push(f.clone()),
            "broker" if args.broker_stop_cmd.is_some() && args.broker_start_cmd.is_some() => {
                kinds.push(f.clone())
            }
            "db" if args.db_restart_cmd.is_some() => kinds.push(f.clone()),
            "broker" | "db" => {
                eprintln!("verify: fault `{f}` skipped: pass its command (--{f}-…-cmd)")
            }
            other => anyhow::bail!("verify: unknown fault `{other}` (kill, pause, broker, db)"),
        }
    }
    let db_url = args
        .database_url
        .clone()
        .or_else(|| std::env::var("OUTBOX_DATABASE_URL").ok())
        .or_else(|| std::env::var("DATABASE_URL").ok())
        .context("verify needs --database-url (or OUTBOX_DATABASE_URL / DATABASE_URL)")?;
    let tmp = std::env::temp_dir().join(format!("outbox-verify-{:08x}", fastrand::u32(..)));
    std::fs::create_dir_all(&tmp)?;
    let sink_url = if args.sink == "file:" {
        format!("file:{}", tmp.join("events.jsonl").display())
    } else {
        args.sink.clone()
    };
    // A connection per producer, plus the consumer's status reads and the ledger.
    let pool_size = (shape.producers + shape.raw_producers) as u32 + 4;
    let (db, relay_db_url) = open_database(&db_url, &tmp, pool_size).await?;
    workload::prepare(&db, &shape).await?;
    let place = db.place();
    let db = Arc::new(db);
    let store = db.store();
    // `stdout:` relays print their messages, all into one file the consumer tails.
    let stdout_path = (sink_url == "stdout:").then(|| tmp.join("stdout.jsonl"));
    let (mut broker, destination) = if let Some(path) = &stdout_path {
        Broker::stdout_file(path.clone())
    } else {
        let (b, _sink, d) = Broker::open(&sink_url, "verify").await?;
        (b, d)
    };
    if args.format == Format::Text {
        println!(
            "outbox verify: seed {seed}, {} relays, {} producers on {} shared keys, {} plain-INSERT \
             producers on {} keys, {:?} of load, faults {:?}",
            relay_count,
            shape.producers,
            shape.keys,
            shape.raw_producers,
            shape.raw_keys,
            duration,
            kinds
        );
        println!(
            "  outbox {place}; broker {}; relay logs in {}",
            broker.describe(),
            tmp.display()
        );
    }

    let lease = args.lease.0;
    // The relays' sink waits for each acknowledgement a quarter of their short lease (NATS
    // waits 5 s by default, longer than the third of the default 3 s lease a publish may take;
    // a quarter leaves the sink room to report its own timeout first); an explicit ack_timeout
    // that does not fit in a third is refused here, as `outbox relay` would refuse it.
    let relay_sink = outbox_sinks::with_default_ack_timeout(&sink_url, lease / 4);
    if let Some(ack) = outbox_sinks::ack_timeout(&relay_sink)? {
        outbox_relay::RelayConfig {
            lease,
            ..outbox_relay::RelayConfig::default()
        }
        .check_ack_timeout(ack)
        .map_err(|why| outbox_core::Error::config(format!("verify: {why}")))?;
    }
    // Nothing secret on the command line: the database and sink URLs go in the environment.
    let relay_args: Vec<String> = [
        "relay",
        "--schema",
        db.schema(),
        "--destination",
        destination.as_str(),
        "--lease",
        &humantime::format_duration(lease).to_string(),
        "--poll-interval",
        "100ms",
        "--workers",
        "1",
        "--batch-size",
        "200",
        "--max-attempts",
        "100000",
        "--backoff-base",
        "100ms",
        "--backoff-max",
        "2s",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut relays = Relays::new(
        relay_args,
        tmp.clone(),
        relay_db_url,
        relay_sink,
        stdout_path.clone(),
    );
    for i in 0..relay_count {
        let c = relays.spawn_one(i)?;
        relays.children.push(c);
    }
    let relays = Arc::new(Mutex::new(relays));
    let started = Instant::now();

    let stop = CancellationToken::new();
    let (producers, tally) = workload::spawn(db.clone(), shape, seed, stop.clone());
    let fault_log = Arc::new(Mutex::new(Vec::<FaultEvent>::new()));
    let fault_task = faults::spawn(
        Schedule {
            kinds: kinds.clone(),
            interval: args.fault_interval.0,
            duration,
            lease,
            broker_stop: args.broker_stop_cmd.clone(),
            broker_start: args.broker_start_cmd.clone(),
            db_restart: args.db_restart_cmd.clone(),
        },
        relays.clone(),
        fault_log.clone(),
        seed,
        started,
        stop.clone(),
    );

    // The independent consumer, in this task.
    let mut got = Received::default();
    while started.elapsed() < duration {
        tokio::time::sleep(Duration::from_millis(200)).await;
        got.poll(&mut broker, started).await;
    }
    stop.cancel();
    let load_end = started.elapsed().as_secs_f64();
    for p in producers {
        let _ = p.await;
    }
    let pending_at_load_end = store.stats().await.map(|s| s.pending).unwrap_or(-1);
    fault_task
        .await
        .context("fault task")?
        .context("injecting a fault")?;
    let last_fault_end = fault_log
        .lock()
        .ok()
        .and_then(|f| f.iter().map(|e| e.ended_seconds).reduce(f64::max))
        .unwrap_or(0.0);

    // Drain: everything committed must arrive, and the outbox must empty (a message whose
    // acknowledgement was lost in a fault arrives before the relay records it).
    let ledger = workload::ledger(&db).await?;
    let deadline = Instant::now() + Duration::from_secs(180);
    let mut drained_at = started.elapsed().as_secs_f64();
    let mut pending = -1;
    loop {
        let missing = ledger.keys().filter(|id| !got.seen.contains(id)).count();
        if missing == 0 {
            pending = store.stats().await.map(|s| s.pending).unwrap_or(-1);
            if pending == 0 {
                break;
            }
        }
        if Instant::now() > deadline {
            eprintln!(
                "verify: {missing} messages missing and {pending} pending after the drain timeout"
            );
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        got.poll(&mut broker, started).await;
        if missing > 0 {
            drained_at = started.elapsed().as_secs_f64();
        }
    }
    // Late duplicates (a resumed relay) get a moment to show up.
    tokio::time::sleep(Duration::from_secs(1)).await;
    got.poll(&mut broker, started).await;
    {
        let mut r = relays
            .lock()
            .map_err(|_| anyhow::anyhow!("relay list poisoned"))?;
        for i in 0..r.children.len() {
            r.signal(i, "-CONT");
            r.signal(i, "-TERM");
        }
        for c in r.children.iter_mut() {
            let _ = c.wait();
        }
    }

    // The checker.
    let faults = fault_log.lock().map(|f| f.clone()).unwrap_or_default();
    let marks: Vec<FaultMark> = faults
        .iter()
        .map(|f| FaultMark {
            kind: f.kind.clone(),
            at: f.at_seconds,
        })
        .collect();
    let verdict = check(&ledger, &got.arrivals, &marks);
    let mut faults_injected: BTreeMap<String, usize> = BTreeMap::new();
    for f in &faults {
        *faults_injected.entry(f.kind.clone()).or_default() += 1;
    }
    let all_kinds = kinds.iter().all(|k| faults_injected.contains_key(k));
    let report = Report {
        ok: verdict.ok() && pending == 0,
        seed,
        database: place,
        sink: outbox_core::redact::url(&sink_url),
        duration_seconds: duration.as_secs_f64(),
        relays: relay_count,
        producers: shape.producers,
        keys: shape.keys,
        committed: ledger.len(),
        rolled_back: tally.rolled_back.load(Ordering::Relaxed),
        delivered: verdict.delivered,
        received: got.arrivals.len(),
        lost: verdict.lost,
        phantoms: verdict.phantoms,
        order_violations: verdict.order_violations,
        mismatched: verdict.mismatched,
        unreadable: got.unreadable,
        pending_after_drain: pending,
        duplicates: verdict.duplicates,
        duplicates_after: verdict.duplicates_after,
        faults_injected,
        faults,
        drain_seconds_after_last_fault: (drained_at - last_fault_end).max(0.0),
        pending_at_load_end,
        drain_seconds_after_load: (drained_at - load_end).max(0.0),
        lost_sample: verdict.lost_sample,
        keys_written_by_several_producers: verdict.keys_written_by_several_producers,
        raw_producers: shape.raw_producers,
        raw_order: verdict.raw_order,
        producer_errors: tally.errors.load(Ordering::Relaxed),
    };
    match args.format {
        Format::Json => println!("{}", serde_json::to_string_pretty(&report)?),
        Format::Text => report.print_text(),
    }
    if !all_kinds {
        eprintln!("verify: not every requested fault kind was injected; lengthen --duration or shorten --fault-interval");
    }
    if !args.keep {
        let _ = Database::clone(&db).destroy().await;
        broker.cleanup().await;
        let _ = std::fs::remove_dir_all(&tmp);
    }
    Ok(if report.ok && all_kinds {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
