//! `outbox demo`: the outbox story of the seed articles, told live on the embedded default
//! (SQLite and a JSON-lines file), or on real servers with `--database-url` and `--sink`.
//!
//! Scenes: payments commit atomically with their events (rollbacks leave nothing); the broker
//! goes away and events wait, visibly; a relay crashes mid-batch and another takes over when the
//! lease expires; a ledger consumer records every event in its inbox (a redelivery is absorbed
//! by message id) and applies every payment exactly once with the inbox processor.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use async_trait::async_trait;
use outbox_core::{DestinationTemplate, Envelope, NewMessage, RetryPolicy, Sink, SinkError, Stats};
use outbox_db::{Backend, Database};
use outbox_inbox::{HandlerError, Handlers, InboxMessage, InboxProcessor, ProcessorConfig};
use outbox_relay::{Relay, RelayConfig, RelayMetrics};
use sqlx::SqlitePool;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::cli::DemoArgs;
use outbox_sinks::read::{Delivered, Reader, ScratchOptions};

/// The demo's default schema on PostgreSQL; only schemas named like it are ever dropped.
const DEMO_SCHEMA: &str = "outbox_demo";

/// Opens the payments service's database (the outbox and a `payments` table) from nothing:
/// what a previous run left is dropped first, but never a PostgreSQL schema the demo did not
/// make (one not named `outbox_demo…`).
async fn open_payments(url: &str, schema: &str) -> anyhow::Result<Database> {
    let mut db = outbox_db::open(url, schema, 8).await?;
    if db.exists().await? {
        anyhow::ensure!(
            db.backend() != Backend::Postgres || schema.starts_with(DEMO_SCHEMA),
            "demo: schema `{schema}` exists and is not a demo schema; pick another --schema (it is dropped and recreated)"
        );
        db.destroy().await?;
        db = outbox_db::open(url, schema, 8).await?;
    }
    db.migrate().await?;
    // Portable types: the payment id is stored as text on either backend.
    db.execute_script(
        "CREATE TABLE {schema}.payments (id text PRIMARY KEY, amount_cents bigint NOT NULL)",
    )
    .await?;
    Ok(db)
}

/// One payment: the business row and its event in one transaction, committed or (when the
/// fraud check fails) rolled back. Returns the event's id.
async fn pay(db: &Database, amount_cents: i64, fraud: bool) -> anyhow::Result<Uuid> {
    let payment = Uuid::now_v7();
    let event = NewMessage::new(
        "payment",
        payment.to_string(),
        "payment.created",
        serde_json::json!({ "payment_id": payment, "amount_cents": amount_cents }),
    );
    let mut tx = db.begin().await?;
    tx.execute(
        "INSERT INTO {schema}.payments (id, amount_cents) VALUES ($1, $2)",
        &[payment.to_string().into(), amount_cents.into()],
    )
    .await?;
    tx.enqueue(&event).await?;
    if fraud {
        tx.rollback().await?;
    } else {
        tx.commit().await?;
    }
    Ok(event.id)
}

/// The downstream ledger: its own SQLite database, with an inbox. Every event read from the
/// broker is recorded in `inbox_messages` (a redelivery is absorbed there, by message id), and
/// an [`InboxProcessor`] applies each payment to the balance once: its handler runs in a
/// transaction that also claims the message in `processed_messages` (see `docs/consumers.md`).
struct Ledger {
    pool: SqlitePool,
}

impl Ledger {
    async fn open(path: &Path) -> anyhow::Result<Self> {
        outbox_sqlite::remove_database(path);
        let pool = outbox_sqlite::connect_pool(&format!("sqlite://{}", path.display())).await?;
        outbox_inbox::migrate_sqlite(&pool).await?;
        sqlx::raw_sql(
            "CREATE TABLE balance (payments INTEGER NOT NULL, total_cents INTEGER NOT NULL);
             INSERT INTO balance VALUES (0, 0);",
        )
        .execute(&pool)
        .await?;
        Ok(Self { pool })
    }

    /// The processor applying payments to the balance, once each.
    fn processor(&self) -> InboxProcessor {
        let handlers = Handlers::new().on_fn("payment.created", |tx, m| {
            Box::pin(async move {
                let cents = m.payload["amount_cents"]
                    .as_i64()
                    .ok_or_else(|| HandlerError::permanent("payment without amount_cents"))?;
                sqlx::query(
                    "UPDATE balance SET payments = payments + 1, total_cents = total_cents + ?",
                )
                .bind(cents)
                .execute(&mut **tx)
                .await?;
                Ok(())
            })
        });
        InboxProcessor::sqlite(
            self.pool.clone(),
            handlers,
            ProcessorConfig {
                workers: 1,
                poll_interval: Duration::from_millis(50),
                member_prefix: "ledger".into(),
                ..ProcessorConfig::default()
            },
        )
    }

    /// Records `events` in the inbox, in one transaction; returns (recorded, duplicates).
    async fn ingest(&self, events: &[Delivered]) -> anyhow::Result<(u64, u64)> {
        let messages: Vec<InboxMessage> = events
            .iter()
            .map(|e| {
                InboxMessage::from_broker(
                    "demo",
                    &e.payload,
                    e.headers.clone(),
                    e.id,
                    &e.destination,
                    Some(&e.key),
                )
            })
            .collect();
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let flags = outbox_inbox::Inbox::default()
            .ingest_many(&mut tx, &messages)
            .await?;
        tx.commit().await?;
        let recorded = flags.iter().filter(|f| **f).count() as u64;
        Ok((recorded, flags.len() as u64 - recorded))
    }

    async fn totals(&self) -> anyhow::Result<(i64, i64)> {
        Ok(sqlx::query_as("SELECT payments, total_cents FROM balance")
            .fetch_one(&self.pool)
            .await?)
    }
}

/// What the ledger consumer has seen so far.
#[derive(Default)]
struct Consumed {
    received: u64,
    recorded: u64,
    duplicates: u64,
    arrived: HashSet<Uuid>,
}

impl Consumed {
    /// Reads what reached the broker since the last call and records it in the ledger's inbox.
    async fn step(&mut self, broker: &mut dyn Reader, ledger: &Ledger) -> anyhow::Result<()> {
        let events = broker.poll(Duration::from_millis(250)).await.delivered;
        self.received += events.len() as u64;
        self.arrived.extend(events.iter().map(|e| e.id));
        let (ok, dup) = ledger.ingest(&events).await?;
        self.recorded += ok;
        self.duplicates += dup;
        Ok(())
    }
}

/// A broker that can be made to refuse everything (the outage scene).
struct Gate {
    inner: Arc<dyn Sink>,
    open: AtomicBool,
}

#[async_trait]
impl Sink for Gate {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn ack_timeout(&self) -> Option<Duration> {
        self.inner.ack_timeout()
    }
    fn orders_keys(&self) -> bool {
        self.inner.orders_keys()
    }
    async fn publish(&self, batch: &[Envelope]) -> Vec<Result<(), SinkError>> {
        if self.open.load(Ordering::SeqCst) {
            self.inner.publish(batch).await
        } else {
            batch
                .iter()
                .map(|_| Err(SinkError::unavailable("broker unreachable (demo outage)")))
                .collect()
        }
    }
}

/// Crashes the relay at the worst moment: after the broker took a batch and before the relay
/// could record it. When armed, the next publish goes through, then never returns.
struct CrashPoint {
    inner: Arc<dyn Sink>,
    armed: AtomicBool,
    fired: Notify,
    batch: AtomicU64,
}

#[async_trait]
impl Sink for CrashPoint {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn ack_timeout(&self) -> Option<Duration> {
        self.inner.ack_timeout()
    }
    fn orders_keys(&self) -> bool {
        self.inner.orders_keys()
    }
    async fn publish(&self, batch: &[Envelope]) -> Vec<Result<(), SinkError>> {
        let results = self.inner.publish(batch).await;
        if self.armed.swap(false, Ordering::SeqCst) {
            self.batch.store(batch.len() as u64, Ordering::SeqCst);
            self.fired.notify_one();
            std::future::pending::<()>().await;
        }
        results
    }
}

/// What the producer committed and rolled back.
#[derive(Default)]
struct Produced {
    committed: HashMap<Uuid, i64>,
    rolled_back: HashSet<Uuid>,
}

fn relay_config(prefix: &str, lease: Duration, destination: &DestinationTemplate) -> RelayConfig {
    RelayConfig {
        batch_size: 100,
        workers: 1,
        poll_interval: Duration::from_millis(100),
        lease,
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

pub async fn run(args: DemoArgs) -> anyhow::Result<ExitCode> {
    std::fs::create_dir_all(&args.dir)
        .with_context(|| format!("creating {}", args.dir.display()))?;
    let db_url = args
        .database_url
        .clone()
        .unwrap_or_else(|| format!("sqlite://{}", args.dir.join("payments.db").display()));
    let sink_url = args
        .sink
        .clone()
        .unwrap_or_else(|| format!("file:{}", args.dir.join("events.jsonl").display()));
    let schema = args.schema.clone().unwrap_or_else(|| DEMO_SCHEMA.into());
    let lease = args.lease.0;
    let started = Instant::now();

    let db = Arc::new(open_payments(&db_url, &schema).await?);
    // The demo's short lease must still cover the sink's wait for an acknowledgement (a
    // quarter of it, so the sink reports its own timeout before the relay's publish deadline).
    let sink_url = outbox_sinks::with_default_ack_timeout(&sink_url, lease / 4);
    let scratch = outbox_sinks::read::scratch(&sink_url, &ScratchOptions::new("demo")).await?;
    let mut broker = scratch.reader;
    let sink = outbox_sinks::connect(&scratch.sink_url).await?;
    let destination = DestinationTemplate::parse(&scratch.destination)?;
    let ledger_path = args.dir.join("ledger.db");
    let ledger = Ledger::open(&ledger_path).await?;
    let stop_ledger = CancellationToken::new();
    let ledger_task = tokio::spawn(ledger.processor().run(stop_ledger.clone()));
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

    let gate = Arc::new(Gate {
        inner: sink.clone(),
        open: AtomicBool::new(true),
    });
    let crash = Arc::new(CrashPoint {
        inner: gate.clone(),
        armed: AtomicBool::new(false),
        fired: Notify::new(),
        batch: AtomicU64::new(0),
    });
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

    println!("2. The broker goes away for {} s", args.outage_seconds);
    println!(
        "   Every publish is refused. Payments keep committing; their events wait in the outbox."
    );
    gate.open.store(false, Ordering::SeqCst);
    let outage_end = Instant::now() + Duration::from_secs(args.outage_seconds);
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
    gate.open.store(true, Ordering::SeqCst);
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
    crash.armed.store(true, Ordering::SeqCst);
    crash.fired.notified().await;
    relay_a_task.abort();
    let _ = relay_a_task.await;
    let crashed_at = Instant::now();
    println!(
        "   Relay A died right after the broker took a batch of {} and before it recorded it:",
        crash.batch.load(Ordering::SeqCst)
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
    let lost = committed.len() - delivered;
    let phantoms = rolled_back.iter().filter(|id| arrived.contains(id)).count();
    let (ledger_payments, ledger_total) = ledger.totals().await?;
    let s = store.stats().await?;
    let published =
        RelayMetrics::get(&metrics_a.published) + RelayMetrics::get(&metrics_b.published);
    println!("   {}", line(&s, published));
    println!();

    let ok = lost == 0
        && phantoms == 0
        && ledger_total == committed_total
        && ledger_payments as usize == committed.len();
    println!("Summary ({:.0} s)", started.elapsed().as_secs_f64());
    println!(
        "  payments committed        {:>6}   total {}",
        committed.len(),
        money(committed_total)
    );
    println!(
        "  payments rolled back      {:>6}   events published for them: {phantoms}",
        rolled_back.len()
    );
    println!(
        "  events delivered          {:>6}   distinct ids, {} messages received",
        delivered, counts.received
    );
    println!(
        "  duplicates absorbed       {:>6}   (redeliveries after the crash, absorbed by the ledger's inbox)",
        counts.duplicates
    );
    println!("  lost                      {:>6}", lost);
    println!(
        "  ledger                    {:>6}   payments applied once by the inbox processor, total {}{}",
        ledger_payments,
        money(ledger_total),
        if ledger_total == committed_total {
            " = committed total"
        } else {
            "  MISMATCH"
        }
    );
    println!("  files                     {}", args.dir.display());
    // A PostgreSQL demo drops its schema; a SQLite one keeps its file for a look (see `files`).
    if db.backend() == Backend::Postgres {
        let _ = Database::clone(&db).destroy().await;
    }
    broker.cleanup().await;
    if ok {
        println!("\nNothing lost, nothing invented, every payment applied once.");
        Ok(ExitCode::SUCCESS)
    } else {
        println!("\nA guarantee was broken (see above).");
        Ok(ExitCode::FAILURE)
    }
}
