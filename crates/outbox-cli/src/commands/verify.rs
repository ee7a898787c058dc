//! `outbox verify`: a workload, real relay processes, faults on a seeded schedule, and a checker
//! of the guarantees. Anyone can run it against their own database and broker.
//!
//! Producers commit business (ledger) rows and their events in one transaction, rolling some
//! back on purpose; relays run as OS processes of this binary; an independent consumer reads the
//! broker. Faults: `kill -9` of a relay, SIGSTOP past the lease then SIGCONT (the fencing case),
//! broker stop/start, database restart. The checker compares what arrived with the ledger.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use outbox_core::{NewMessage, Store};
use outbox_relay::RelayConfig;
use serde::Serialize;
use sqlx::{PgPool, SqlitePool};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::checker::{check, Arrival, FaultMark};
use super::observer::Broker;
use crate::cli::{Format, Profile, VerifyArgs};

/// The workload's database: the ledger (expected set) and the outbox, written together.
enum VerifyDb {
    Postgres {
        pool: PgPool,
        schema: outbox_postgres::Schema,
        writer: outbox_postgres::Writer,
    },
    Sqlite {
        pool: SqlitePool,
        writer: outbox_sqlite::Writer,
        path: PathBuf,
    },
}

/// What happened to one producer transaction.
enum Commit {
    Committed,
    RolledBack,
}

impl VerifyDb {
    async fn open(url: &str, tmp: &std::path::Path) -> anyhow::Result<(Self, String, String)> {
        let sfx = format!("{:08x}", fastrand::u32(..));
        if url.starts_with("postgres") {
            let schema = outbox_postgres::Schema::new(&format!("outbox_verify_{sfx}"))?;
            let pool = outbox_postgres::connect_pool(url, 16).await?;
            outbox_postgres::migrate(&pool, &schema).await?;
            sqlx::raw_sql(&schema.render(
                "CREATE TABLE {schema}.verify_ledger (id uuid PRIMARY KEY, key text NOT NULL, n bigint NOT NULL)",
            ))
            .execute(&pool)
            .await?;
            let name = schema.as_str().to_string();
            Ok((
                Self::Postgres {
                    writer: outbox_postgres::Writer::new(&schema),
                    pool,
                    schema,
                },
                url.to_string(),
                name,
            ))
        } else if url.starts_with("sqlite:") {
            let given = url
                .trim_start_matches("sqlite://")
                .trim_start_matches("sqlite:");
            let path = if given.is_empty() {
                tmp.join("verify.db")
            } else {
                PathBuf::from(given)
            };
            let url = format!("sqlite://{}", path.display());
            let pool = outbox_sqlite::connect_pool(&url).await?;
            outbox_sqlite::migrate(&pool).await?;
            sqlx::query("CREATE TABLE IF NOT EXISTS verify_ledger (id TEXT PRIMARY KEY, key TEXT NOT NULL, n INTEGER NOT NULL)")
                .execute(&pool)
                .await?;
            let name = path.display().to_string();
            Ok((
                Self::Sqlite {
                    pool,
                    writer: outbox_sqlite::Writer::default(),
                    path,
                },
                url,
                name,
            ))
        } else {
            anyhow::bail!(
                "verify: database `{}` must be postgres://… or sqlite://…",
                outbox_core::redact::url(url)
            )
        }
    }

    fn store(&self) -> Arc<dyn Store> {
        match self {
            Self::Postgres { pool, schema, .. } => {
                Arc::new(outbox_postgres::PgStore::new(pool.clone(), schema.clone()))
            }
            Self::Sqlite { pool, .. } => Arc::new(outbox_sqlite::SqliteStore::new(pool.clone())),
        }
    }

    fn schema(&self) -> &str {
        match self {
            Self::Postgres { schema, .. } => schema.as_str(),
            Self::Sqlite { .. } => "public",
        }
    }

    async fn write(&self, id: Uuid, key: &str, n: i64, rollback: bool) -> anyhow::Result<Commit> {
        let msg = NewMessage {
            id,
            ..NewMessage::new(
                "verify",
                key,
                "event",
                serde_json::json!({ "key": key, "n": n }),
            )
        };
        match self {
            Self::Postgres {
                pool,
                schema,
                writer,
            } => {
                let mut tx = pool.begin().await?;
                sqlx::query(
                    &schema.render(
                        "INSERT INTO {schema}.verify_ledger (id, key, n) VALUES ($1, $2, $3)",
                    ),
                )
                .bind(id)
                .bind(key)
                .bind(n)
                .execute(&mut *tx)
                .await?;
                writer.enqueue(&mut tx, &msg).await?;
                if rollback {
                    tx.rollback().await?;
                    return Ok(Commit::RolledBack);
                }
                tx.commit().await?;
            }
            Self::Sqlite { pool, writer, .. } => {
                let mut tx = pool.begin().await?;
                sqlx::query("INSERT INTO verify_ledger (id, key, n) VALUES (?, ?, ?)")
                    .bind(id.to_string())
                    .bind(key)
                    .bind(n)
                    .execute(&mut *tx)
                    .await?;
                writer.enqueue(&mut tx, &msg).await?;
                if rollback {
                    tx.rollback().await?;
                    return Ok(Commit::RolledBack);
                }
                tx.commit().await?;
            }
        }
        Ok(Commit::Committed)
    }

    /// Whether `id` is in the ledger: the truth after a commit whose answer was lost.
    async fn committed(&self, id: Uuid) -> anyhow::Result<bool> {
        Ok(match self {
            Self::Postgres { pool, schema, .. } => {
                sqlx::query(&schema.render("SELECT 1 FROM {schema}.verify_ledger WHERE id = $1"))
                    .bind(id)
                    .fetch_optional(pool)
                    .await?
                    .is_some()
            }
            Self::Sqlite { pool, .. } => sqlx::query("SELECT 1 FROM verify_ledger WHERE id = ?")
                .bind(id.to_string())
                .fetch_optional(pool)
                .await?
                .is_some(),
        })
    }

    async fn ledger(&self) -> anyhow::Result<HashMap<Uuid, (String, i64)>> {
        let rows: Vec<(String, String, i64)> = match self {
            Self::Postgres { pool, schema, .. } => {
                sqlx::query_as(
                    &schema.render("SELECT id::text, key, n FROM {schema}.verify_ledger"),
                )
                .fetch_all(pool)
                .await?
            }
            Self::Sqlite { pool, .. } => {
                sqlx::query_as("SELECT id, key, n FROM verify_ledger")
                    .fetch_all(pool)
                    .await?
            }
        };
        let mut out = HashMap::with_capacity(rows.len());
        for (id, key, n) in rows {
            out.insert(id.parse()?, (key, n));
        }
        Ok(out)
    }

    async fn cleanup(&self) {
        match self {
            Self::Postgres { pool, schema, .. } => {
                let _ = sqlx::raw_sql(&schema.render("DROP SCHEMA IF EXISTS {schema} CASCADE"))
                    .execute(pool)
                    .await;
            }
            Self::Sqlite { path, .. } => outbox_sqlite::remove_database(path),
        }
    }
}

/// One injected fault.
#[derive(Debug, Clone, Serialize)]
struct FaultEvent {
    kind: String,
    at_seconds: f64,
    ended_seconds: f64,
    detail: String,
}

/// Relay processes under test.
struct Relays {
    children: Vec<Child>,
    args: Vec<String>,
    logs: PathBuf,
    /// The database URL, passed in the environment (a password must not show in `ps`).
    database_url: String,
    /// Where every relay's standard output goes (the `stdout:` sink), appended.
    stdout: Option<PathBuf>,
}

impl Drop for Relays {
    /// No relay process outlives the run, whatever ends it.
    fn drop(&mut self) {
        for i in 0..self.children.len() {
            if matches!(self.children[i].try_wait(), Ok(None)) {
                self.signal(i, "-CONT");
                let _ = self.children[i].kill();
                let _ = self.children[i].wait();
            }
        }
    }
}

impl Relays {
    fn spawn_one(&mut self, i: usize) -> anyhow::Result<Child> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.logs.join(format!("relay-{i}.log")))?;
        let stdout = match &self.stdout {
            Some(path) => Stdio::from(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)?,
            ),
            None => Stdio::null(),
        };
        Command::new(std::env::current_exe()?)
            .args(&self.args)
            .env("OUTBOX_LOG", "warn")
            .env("OUTBOX_DATABASE_URL", &self.database_url)
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(log)
            .spawn()
            .context("starting a relay process")
    }

    fn signal(&self, i: usize, sig: &str) {
        let _ = Command::new("kill")
            .args([sig, &self.children[i].id().to_string()])
            .stderr(Stdio::null())
            .status();
    }
}

fn shell(cmd: &str) -> anyhow::Result<()> {
    let st = Command::new("sh")
        .args(["-c", cmd])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .status()?;
    anyhow::ensure!(st.success(), "fault command `{cmd}` exited with {st}");
    Ok(())
}

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
            let n = e.payload["n"].as_i64().unwrap_or(-1);
            self.seen.insert(e.id);
            self.arrivals.push(Arrival {
                id: e.id,
                key: e.key,
                n,
                at,
            });
        }
    }
}

/// The checker's verdict.
#[derive(Debug, Serialize)]
struct Report {
    ok: bool,
    seed: u64,
    database: String,
    sink: String,
    duration_seconds: f64,
    relays: usize,
    producers: usize,
    keys: usize,
    committed: usize,
    rolled_back: usize,
    delivered: usize,
    received: usize,
    lost: usize,
    phantoms: usize,
    order_violations: usize,
    mismatched: usize,
    unreadable: usize,
    pending_after_drain: i64,
    duplicates: usize,
    duplicates_after: BTreeMap<String, usize>,
    faults_injected: BTreeMap<String, usize>,
    faults: Vec<FaultEvent>,
    drain_seconds_after_last_fault: f64,
    pending_at_load_end: i64,
    drain_seconds_after_load: f64,
    lost_sample: Vec<String>,
}

struct Plan {
    duration: Duration,
    relays: usize,
    producers: usize,
    keys: usize,
}

pub async fn run(args: VerifyArgs) -> anyhow::Result<ExitCode> {
    let (d, r, p, k) = match args.profile {
        Profile::Short => (Duration::from_secs(40), 3, 4, 64),
        Profile::Long => (Duration::from_secs(600), 3, 8, 500),
    };
    let plan = Plan {
        duration: args.duration.map_or(d, |x| x.0),
        relays: args.relays.unwrap_or(r).max(1),
        producers: args.producers.unwrap_or(p).max(1),
        keys: args.keys.unwrap_or(k).max(1),
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
    let (db, relay_db_url, place) = VerifyDb::open(&db_url, &tmp).await?;
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
            "outbox verify: seed {seed}, {} relays, {} producers, {} keys, {:?} of load, faults {:?}",
            plan.relays, plan.producers, plan.keys, plan.duration, kinds
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
        RelayConfig {
            lease,
            ..RelayConfig::default()
        }
        .check_ack_timeout(ack)
        .map_err(|why| outbox_core::Error::config(format!("verify: {why}")))?;
    }
    let relay_args: Vec<String> = vec![
        "relay".into(),
        "--schema".into(),
        db.schema().into(),
        "--sink".into(),
        relay_sink,
        "--destination".into(),
        destination.as_str().into(),
        "--lease".into(),
        humantime::format_duration(lease).to_string(),
        "--poll-interval".into(),
        "100ms".into(),
        "--workers".into(),
        "1".into(),
        "--batch-size".into(),
        "200".into(),
        "--max-attempts".into(),
        "100000".into(),
        "--backoff-base".into(),
        "100ms".into(),
        "--backoff-max".into(),
        "2s".into(),
    ];
    let mut relays = Relays {
        children: Vec::new(),
        args: relay_args,
        logs: tmp.clone(),
        database_url: relay_db_url.clone(),
        stdout: stdout_path.clone(),
    };
    for i in 0..plan.relays {
        let c = relays.spawn_one(i)?;
        relays.children.push(c);
    }
    let relays = Arc::new(Mutex::new(relays));
    let started = Instant::now();

    // Producers: each owns the keys k ≡ p (mod P), so a key's `n` grows one commit at a time.
    let stop = CancellationToken::new();
    let rolled_back = Arc::new(Mutex::new(HashSet::<Uuid>::new()));
    let mut producers = Vec::new();
    for p in 0..plan.producers {
        let (db, stop, rolled_back, keys, nprod) = (
            db.clone(),
            stop.clone(),
            rolled_back.clone(),
            plan.keys,
            plan.producers,
        );
        producers.push(tokio::spawn(async move {
            let mine: Vec<usize> = (0..keys).filter(|k| k % nprod == p).collect();
            let mut next = vec![0i64; mine.len()];
            let mut rng = fastrand::Rng::with_seed(seed ^ (p as u64 + 1));
            while !stop.is_cancelled() && !mine.is_empty() {
                let slot = rng.usize(..mine.len());
                let key = format!("key-{}", mine[slot]);
                let id = Uuid::now_v7();
                let rollback = rng.u8(..10) == 0;
                match db.write(id, &key, next[slot], rollback).await {
                    Ok(Commit::Committed) => next[slot] += 1,
                    Ok(Commit::RolledBack) => {
                        if let Ok(mut r) = rolled_back.lock() {
                            r.insert(id);
                        }
                    }
                    Err(_) => {
                        // The answer may be lost with the connection (database restart): ask
                        // the ledger, once the database is back, whether it committed.
                        loop {
                            tokio::time::sleep(Duration::from_millis(200)).await;
                            match db.committed(id).await {
                                Ok(true) => {
                                    next[slot] += 1;
                                    break;
                                }
                                Ok(false) => break,
                                Err(_) if stop.is_cancelled() => return,
                                Err(_) => continue,
                            }
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }));
    }

    // Faults on the seeded schedule: every kind once first (in a seeded order), then at random.
    let faults = Arc::new(Mutex::new(Vec::<FaultEvent>::new()));
    let fault_task = {
        let (relays, faults, kinds, stop) =
            (relays.clone(), faults.clone(), kinds.clone(), stop.clone());
        let (interval, duration) = (args.fault_interval.0, plan.duration);
        let (bstop, bstart, dbcmd) = (
            args.broker_stop_cmd.clone(),
            args.broker_start_cmd.clone(),
            args.db_restart_cmd.clone(),
        );
        tokio::spawn(async move {
            let mut rng = fastrand::Rng::with_seed(seed);
            let mut order = kinds.clone();
            rng.shuffle(&mut order);
            let mut i = 0usize;
            loop {
                let wait = interval.mul_f64(0.5 + rng.f64());
                tokio::time::sleep(wait).await;
                // Every requested kind is injected at least once, even if that outlasts the load.
                let all_done = i >= order.len();
                if kinds.is_empty()
                    || (all_done
                        && (stop.is_cancelled()
                            || started.elapsed() + Duration::from_secs(3) > duration))
                {
                    return anyhow::Ok(());
                }
                let kind = if i < order.len() {
                    order[i].clone()
                } else {
                    kinds[rng.usize(..kinds.len())].clone()
                };
                i += 1;
                let at = started.elapsed().as_secs_f64();
                let detail = match kind.as_str() {
                    "kill" => {
                        let n = relays.lock().map(|r| r.children.len()).unwrap_or(1);
                        let victim = rng.usize(..n);
                        if let Ok(mut r) = relays.lock() {
                            let _ = r.children[victim].kill();
                            let _ = r.children[victim].wait();
                        }
                        tokio::time::sleep(Duration::from_millis(300 + rng.u64(..1000))).await;
                        if let Ok(mut r) = relays.lock() {
                            let c = r.spawn_one(victim)?;
                            r.children[victim] = c;
                        }
                        format!("kill -9 relay {victim}, restarted")
                    }
                    "pause" => {
                        let n = relays.lock().map(|r| r.children.len()).unwrap_or(1);
                        let victim = rng.usize(..n);
                        if let Ok(r) = relays.lock() {
                            r.signal(victim, "-STOP");
                        }
                        tokio::time::sleep(lease + Duration::from_secs(1)).await;
                        if let Ok(r) = relays.lock() {
                            r.signal(victim, "-CONT");
                        }
                        format!(
                            "SIGSTOP relay {victim} for {:?} (past its lease), SIGCONT",
                            lease + Duration::from_secs(1)
                        )
                    }
                    "broker" => {
                        if let (Some(a), Some(b)) = (&bstop, &bstart) {
                            shell(a)?;
                            tokio::time::sleep(Duration::from_secs(2)).await;
                            shell(b)?;
                        }
                        "broker stopped for 2 s, started".to_string()
                    }
                    "db" => {
                        if let Some(c) = &dbcmd {
                            shell(c)?;
                        }
                        "database restarted".to_string()
                    }
                    _ => continue,
                };
                let ended = started.elapsed().as_secs_f64();
                if let Ok(mut f) = faults.lock() {
                    f.push(FaultEvent {
                        kind,
                        at_seconds: at,
                        ended_seconds: ended,
                        detail,
                    });
                }
            }
        })
    };

    // The independent consumer, in this task.
    let mut got = Received::default();
    while started.elapsed() < plan.duration {
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
    let last_fault_end = faults
        .lock()
        .ok()
        .and_then(|f| f.iter().map(|e| e.ended_seconds).reduce(f64::max))
        .unwrap_or(0.0);

    // Drain: everything committed must arrive, and the outbox must empty (a message whose
    // acknowledgement was lost in a fault arrives before its row is marked).
    let ledger = db.ledger().await?;
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
    let rolled_back = rolled_back.lock().map(|r| r.clone()).unwrap_or_default();
    let faults = faults.lock().map(|f| f.clone()).unwrap_or_default();
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
        duration_seconds: plan.duration.as_secs_f64(),
        relays: plan.relays,
        producers: plan.producers,
        keys: plan.keys,
        committed: ledger.len(),
        rolled_back: rolled_back.len(),
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
    };
    match args.format {
        Format::Json => println!("{}", serde_json::to_string_pretty(&report)?),
        Format::Text => {
            for f in &report.faults {
                println!("  fault at {:>5.1}s: {}", f.at_seconds, f.detail);
            }
            println!(
                "  committed {}, rolled back {}, delivered {} ({} messages received)",
                report.committed, report.rolled_back, report.delivered, report.received
            );
            println!(
                "  lost {}   phantoms {}   order violations {}   mismatched {}   duplicates {} {:?}",
                report.lost,
                report.phantoms,
                report.order_violations,
                report.mismatched,
                report.duplicates,
                report.duplicates_after
            );
            if report.unreadable > 0 || report.pending_after_drain != 0 {
                println!(
                    "  unreadable messages {}; pending after the drain {}",
                    report.unreadable, report.pending_after_drain
                );
            }
            println!(
                "  faults injected {:?}; {} pending when the load stopped; drained {:.1} s after the load, \
                 {:.1} s after the last fault",
                report.faults_injected,
                report.pending_at_load_end,
                report.drain_seconds_after_load,
                report.drain_seconds_after_last_fault
            );
            println!(
                "  verdict: {}",
                if report.ok {
                    "every guarantee held"
                } else {
                    "A GUARANTEE WAS BROKEN"
                }
            );
        }
    }
    if !all_kinds {
        eprintln!("verify: not every requested fault kind was injected; lengthen --duration or shorten --fault-interval");
    }
    if !args.keep {
        db.cleanup().await;
        broker.cleanup().await;
        let _ = std::fs::remove_dir_all(&tmp);
    }
    Ok(if report.ok && all_kinds {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
