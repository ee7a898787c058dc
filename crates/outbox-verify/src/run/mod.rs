//! One `outbox verify` run: the database and a scratch destination made for it, relays
//! started, load and faults applied, everything read back, and the verdict.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use outbox_db::{Backend, Database};
use outbox_sinks::read::{Reader, ScratchOptions};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::checker::{check, check_odd, Arrival, Committed, FailedRow, FaultMark, OddVerdict};
use crate::effects::check_effects;
use crate::faults::{self, FaultEvent, Schedule};
use crate::logins::Logins;
use crate::proxy::TcpProxy;
use crate::relays::Relays;
use crate::report::{InboxReport, Report};
use crate::workload::{self, Shape};

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
    async fn poll(&mut self, reader: &mut dyn Reader, started: Instant) {
        let at = started.elapsed().as_secs_f64();
        let polled = reader.poll(Duration::from_millis(250)).await;
        self.unreadable += polled.unreadable;
        for e in polled.delivered {
            let payload_key = serde_json::from_slice::<serde_json::Value>(&e.payload)
                .ok()
                .and_then(|v| v["key"].as_str().map(str::to_string))
                .unwrap_or_default();
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

/// The server's WAL position now (CDC mode).
/// The switch of a `--mode switch` run, under load: kills every relay (kill -9, whatever it is
/// in the middle of), lets the producers write for [`SWITCH_GAP`] with no relay running, makes
/// the slot (what `outbox migrate --cdc` does), then starts every relay again in CDC mode: it
/// must deliver what the polling relays left, before the slot and after, then read the stream.
/// Recorded among the faults, so the duplicates it causes are attributed.
async fn switch_to_cdc(
    db: &Database,
    relays: &Mutex<Relays>,
    started: Instant,
    logins: Option<&Logins>,
) -> anyhow::Result<FaultEvent> {
    let at = started.elapsed().as_secs_f64();
    progress(
        started,
        "switching: every relay killed, the slot made under load, the relays started in CDC mode",
    );
    let Database::Postgres(pg) = db else {
        anyhow::bail!("verify --mode switch reads PostgreSQL's WAL; use a postgres:// URL");
    };
    let names = outbox_postgres::cdc::CdcNames::new(pg.schema(), "relay")?;
    let lock = || {
        relays
            .lock()
            .map_err(|_| anyhow::anyhow!("the relays' lock is poisoned"))
    };
    let kill_all = |r: &mut Relays| {
        for i in 0..r.children.len() {
            r.signal(i, "-CONT");
            let _ = r.children[i].kill();
            let _ = r.children[i].wait();
        }
    };
    kill_all(&mut *lock()?);
    tokio::time::sleep(SWITCH_GAP).await;
    // The database may be restarting (the `db` fault): tried again for up to a minute.
    let mut tries = 0;
    while let Err(e) = bounded(outbox_postgres::cdc::setup::migrate_cdc(pg.pool(), &names)).await {
        tries += 1;
        if tries >= 60 {
            return Err(e.context("creating the CDC publication and slot under load"));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    // The relay role reads the WAL now: its grants again give it the REPLICATION attribute.
    if let Some(l) = logins {
        l.grant(db).await?;
    }
    let mut r = lock()?;
    // A relay the fault schedule restarted meanwhile runs in polling mode: killed again.
    kill_all(&mut r);
    r.replace_arg("polling", "cdc");
    for i in 0..r.children.len() {
        let c = r.spawn_one(i)?;
        r.children[i] = c;
    }
    Ok(FaultEvent {
        problem: None,
        kind: "switch".into(),
        at_seconds: at,
        ended_seconds: started.elapsed().as_secs_f64(),
        detail: format!(
            "{} polling relays killed (kill -9); {SWITCH_GAP:?} later slot {} made under load; \
             the relays started in CDC mode",
            r.children.len(),
            names.slot,
        ),
    })
}

/// How long a switching run's producers write with no relay running, before the slot is made:
/// a backlog the CDC relays' catch-up must deliver.
const SWITCH_GAP: Duration = Duration::from_secs(2);

async fn cdc_wal_now(db: &Database) -> outbox_core::Result<String> {
    let (lsn,): (String,) = db
        .fetch_one("SELECT pg_current_wal_lsn()::text", &[])
        .await?;
    Ok(lsn)
}

/// CDC mode's pending figure: 1 while the slot has not confirmed `lsn` (a position after the
/// last commit of the load), plus the parked messages still to publish; 0 once everything is
/// handled.
async fn cdc_pending(db: &Database, lsn: String) -> outbox_core::Result<i64> {
    let schema = db.schema().to_string();
    let sql = format!(
        "SELECT (SELECT count(*) FROM pg_replication_slots \
                 WHERE slot_name = 'outbox_' || $1 || '_relay' \
                   AND confirmed_flush_lsn < CAST($2 AS pg_lsn)) \
              + (SELECT count(*) FROM {schema}.outbox_parked WHERE state <> 'failed')"
    );
    let (n,): (i64,) = db.fetch_one(&sql, &[schema.into(), lsn.into()]).await?;
    Ok(n)
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

/// Runs the workload, the relays and the faults of `settings`, reads everything back and
/// judges it. An error means the run could not be carried out (a database or broker that
/// cannot be reached at the start, a fault command that failed), never a failed guarantee: that
/// is in the report.
pub async fn run(settings: Settings) -> anyhow::Result<Outcome> {
    let Settings {
        database_url: db_url,
        sink_url,
        duration,
        relays: relay_count,
        shape,
        seed,
        faults: kinds,
        fault_interval,
        lease,
        broker_stop,
        broker_start,
        db_restart,
        keep,
        program,
        announce,
        through_inbox,
        cdc,
        switch,
        binlog,
        failover,
        primary_cmd,
        network_blackout,
        roles,
    } = settings;
    let tmp = std::env::temp_dir().join(format!("outbox-verify-{:08x}", fastrand::u32(..)));
    std::fs::create_dir_all(&tmp)?;
    // The database's virtual IP, following the primary: everything below connects through it.
    let vip_stop = CancellationToken::new();
    let _vip_guard = vip_stop.clone().drop_guard();
    let (db_url, vip) = match &primary_cmd {
        Some(cmd) => {
            let (url, vip) = faults::virtual_ip(&db_url, cmd, vip_stop.clone()).await?;
            (url, Some(vip))
        }
        None => (db_url, None),
    };
    let sink_url = if sink_url == "file:" {
        format!("file:{}", tmp.join("events.jsonl").display())
    } else {
        sink_url
    };
    // A connection per producer, plus the consumer's status reads and the ledger.
    let pool_size =
        (shape.producers + shape.raw_producers + shape.emit_producers + shape.xa_producers) as u32
            + 6;
    let (db, relay_db_url) = open_database(&db_url, &tmp, pool_size).await?;
    // The URL's own user, an administrator: what the run does as one (its checks, the inbox
    // side on MySQL) goes there.
    let admin_db_url = relay_db_url.clone();
    // Each part as production runs it: the tables owned by a login of their own, and each part
    // a login holding only its grants (docs/roles.md; docs/engine-mysql.md, "Least
    // privileges", on MySQL/MariaDB, where the operator owns the outbox).
    let logins = match db.backend() {
        Backend::Postgres if roles => Some(Logins::make(&db).await?),
        Backend::Mysql if roles => Some(Logins::make_mysql(&db, binlog).await?),
        _ => None,
    };
    // A switching run makes its slot under load, later.
    match &logins {
        Some(l) => {
            let owner = outbox_db::open(&l.owner_url(&relay_db_url)?, db.schema(), 2)
                .await
                .context("logging in as the owner role")?;
            workload::prepare(&owner, &shape, cdc && !switch, binlog).await?;
            // On MySQL the operator may not grant: the administrator gives the business tables.
            let granting = match db.backend() {
                Backend::Mysql => &db,
                _ => &owner,
            };
            workload::grant_ledger(granting, &l.writer.0, shape.debezium).await?;
            if let Database::Mysql(s) = &owner {
                s.pool().close().await;
            }
            if cdc {
                // What a superuser does once for CDC mode: pg_walinspect, so a lost slot's
                // emit messages can be read back (the owner may not install it).
                if let Database::Postgres(pg) = &db {
                    outbox_postgres::cdc::salvage::install(pg.pool()).await?;
                }
            }
            l.grant(&db).await?;
        }
        None => workload::prepare(&db, &shape, cdc && !switch, binlog).await?,
    }
    let db = if binlog {
        // Opened again: it reads positions where the route keeps them.
        let schema = db.schema().to_string();
        outbox_db::open(&relay_db_url, &schema, pool_size).await?
    } else {
        db
    };
    let place = db.place();
    let db = Arc::new(db);
    let writer_db = match &logins {
        Some(l) => Arc::new(
            outbox_db::open(&l.url(&relay_db_url, &l.writer)?, db.schema(), pool_size)
                .await
                .context("logging in as the writer role")?,
        ),
        None => db.clone(),
    };
    let operator_db = match &logins {
        Some(l) => Arc::new(
            outbox_db::open(&l.url(&relay_db_url, &l.operator)?, db.schema(), 4)
                .await
                .context("logging in as the operator role")?,
        ),
        None => db.clone(),
    };
    let relay_db_url = match &logins {
        Some(l) => l.url(&relay_db_url, &l.relay)?,
        None => relay_db_url,
    };
    let operator_url = match &logins {
        Some(l) => l.url(&relay_db_url, &l.operator)?,
        None => relay_db_url.clone(),
    };
    // The `network` fault: a proxy of verify's own in front of every server the relays reach.
    let (relay_db_url, network) = if kinds.iter().any(|k| k == "network") {
        let servers = outbox_db::url::hosts(&relay_db_url)?;
        anyhow::ensure!(
            !servers.is_empty(),
            "verify: the network fault needs a database reached over the network"
        );
        let mut proxies = Vec::new();
        let mut via = Vec::new();
        for (host, port) in servers {
            let p = TcpProxy::start_to(format!("{host}:{port}"))
                .context("starting the network fault's proxy")?;
            via.push(("127.0.0.1".to_string(), p.port()));
            proxies.push(Arc::new(p));
        }
        (
            outbox_db::url::with_hosts(&relay_db_url, &via)?,
            Some(faults::Network {
                proxies,
                blackout: network_blackout,
            }),
        )
    } else {
        (relay_db_url, None)
    };
    // The relays reach the database through the proxies until the run ends, long after the
    // fault schedule (which owns them too) is over.
    let _proxies: Vec<Arc<TcpProxy>> = network
        .as_ref()
        .map(|n| n.proxies.clone())
        .unwrap_or_default();
    let store = operator_db.store();
    // `stdout:` relays print their messages, all into one file the consumer tails.
    let stdout_path = (sink_url == "stdout:").then(|| tmp.join("stdout.jsonl"));
    let (mut reader, sink_url, destination): (Box<dyn Reader>, String, String) =
        if let Some(path) = &stdout_path {
            (
                Box::new(outbox_sinks::file::FileReader::new(path.clone())),
                sink_url,
                outbox_core::routing::DEFAULT_DESTINATION.to_string(),
            )
        } else {
            let scratch = outbox_sinks::read::scratch(&sink_url, &ScratchOptions::new("verify"))
                .await
                .context("preparing a destination on the broker")?;
            (scratch.reader, scratch.sink_url, scratch.destination)
        };
    if announce {
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
            reader.describe(),
            tmp.display()
        );
        if switch {
            println!(
                "  relays in polling mode, then, a third of the way in, `outbox migrate --cdc` \
                 under load and every relay killed (kill -9) and started in CDC mode"
            );
        } else if cdc {
            println!(
                "  relays in CDC mode (outbox relay --mode cdc, one slot reader at a time); {} \
                 emit producers on {} keys of their own; plain-INSERT order is a guarantee",
                shape.emit_producers, shape.raw_keys
            );
        }
        if through_inbox {
            println!(
                "  through the inbox: {INBOX_DAEMONS} `outbox inbox` daemons and {INBOX_HANDLERS} \
                 handler processes, faults included"
            );
        }
    }

    // The receiving side: the inbox beside the outbox, fed from the scratch stream. On
    // MySQL/MariaDB the inbox's least privileges are not written down: its daemons and handlers
    // run as the URL's user there (the relays as the relay login).
    let inbox_db_url = match (&logins, db.backend()) {
        (Some(_), Backend::Mysql) => admin_db_url.clone(),
        _ => relay_db_url.clone(),
    };
    let inbox_setup = if through_inbox {
        anyhow::ensure!(
            db.backend() != Backend::Sqlite,
            "--through-inbox runs on PostgreSQL or MySQL/MariaDB: the inbox daemons and handler \
             processes write at once, and SQLite takes one writer at a time"
        );
        anyhow::ensure!(
            sink_url.starts_with("nats://") || sink_url.starts_with("tls://"),
            "--through-inbox reads the broker with `outbox inbox`, whose sources in this build are \
             NATS JetStream and Redis Streams: pass a nats:// sink"
        );
        let inbox = crate::inbox::prepare(&inbox_db_url, db.schema()).await?;
        // The NATS scratch stream is the destination's first token, upper-cased
        // (outbox-sinks `nats/reader.rs`).
        let prefix = destination.split('.').next().unwrap_or_default();
        let base = sink_url.split('?').next().unwrap_or(&sink_url);
        let source = format!(
            "{base}?stream={}&ack_wait={}ms",
            prefix.to_ascii_uppercase(),
            (lease * 2 / 3).as_millis().max(500)
        );
        Some((inbox, source))
    } else {
        None
    };

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
    let mode = if cdc && !switch { "cdc" } else { "polling" };
    let relay_args: Vec<String> = [
        "relay",
        "--mode",
        mode,
        "--schema",
        db.schema(),
        "--destination",
        &destination,
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
        program.clone(),
        relay_args,
        tmp.clone(),
        relay_db_url.clone(),
        relay_sink,
        stdout_path.clone(),
    )
    .with_probes();
    for i in 0..relay_count {
        let c = relays.spawn_one(i)?;
        relays.children.push(c);
    }
    let relays = Arc::new(Mutex::new(relays));
    let mut groups = vec![relays.clone()];
    if let Some((_, source)) = &inbox_setup {
        let lease_arg = humantime::format_duration(lease).to_string();
        let daemon_args: Vec<String> = [
            "inbox",
            "--schema",
            db.schema(),
            "--batch-size",
            "200",
            "--poll-interval",
            "20ms",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let handler_args: Vec<String> = [
            "verify-inbox-handler",
            "--schema",
            db.schema(),
            "--lease",
            &lease_arg,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        for (role, args, env, count) in [
            (
                "inbox",
                daemon_args,
                Some("OUTBOX_INBOX_SOURCE"),
                INBOX_DAEMONS,
            ),
            ("handler", handler_args, None, INBOX_HANDLERS),
        ] {
            let mut group = Relays::new(
                program.clone(),
                args,
                tmp.clone(),
                inbox_db_url.clone(),
                source.clone(),
                None,
            )
            .with_role(role, env);
            for i in 0..count {
                let c = group.spawn_one(i)?;
                group.children.push(c);
            }
            groups.push(Arc::new(Mutex::new(group)));
        }
    }
    let started = Instant::now();

    let stop = CancellationToken::new();
    let (producers, tally) =
        workload::spawn(writer_db.clone(), shape, seed, db.schema(), stop.clone());
    let fault_log = Arc::new(Mutex::new(Vec::<FaultEvent>::new()));
    let fault_task = faults::spawn(
        Schedule {
            kinds: kinds.clone(),
            interval: fault_interval,
            duration,
            lease,
            broker_stop,
            broker_start,
            db_restart,
            failover,
            network,
            vip: vip.clone(),
        },
        groups.clone(),
        fault_log.clone(),
        seed,
        started,
        stop.clone(),
    );

    // The independent consumer, in this task.
    let mut got = Received::default();
    let mut switch_at = switch.then_some(duration / 3);
    while started.elapsed() < duration {
        tokio::time::sleep(Duration::from_millis(200)).await;
        got.poll(reader.as_mut(), started).await;
        if switch_at.is_some_and(|at| started.elapsed() >= at) {
            switch_at = None;
            let event = switch_to_cdc(&db, &relays, started, logins.as_ref()).await?;
            if let Ok(mut log) = fault_log.lock() {
                log.push(event);
            }
        }
    }
    stop.cancel();
    let load_end = started.elapsed().as_secs_f64();
    progress(
        started,
        "load over; waiting for the producers and the last fault",
    );
    // Every wait below is bounded: a run that cannot finish must fail with a reason, never
    // hang its caller (a CI job has a budget).
    let mut stuck = Vec::new();
    for (i, p) in producers.into_iter().enumerate() {
        let abort = p.abort_handle();
        if tokio::time::timeout(PHASE_LIMIT, p).await.is_err() {
            abort.abort();
            stuck.push(format!(
                "producer {i} had not stopped {PHASE_LIMIT:?} after the load"
            ));
        }
    }
    // In CDC mode the backlog is the WAL the slot has not confirmed up to here, and the parked
    // messages still to publish (the table's positions are the polling relay's).
    let load_end_lsn = if cdc {
        bounded(cdc_wal_now(&db)).await.ok()
    } else {
        None
    };
    let pending_at_load_end = match &load_end_lsn {
        Some(lsn) => bounded(cdc_pending(&db, lsn.clone())).await.unwrap_or(-1),
        None => bounded(store.stats())
            .await
            .map(|s| s.pending)
            .unwrap_or(-1),
    };
    let fault_abort = fault_task.abort_handle();
    match tokio::time::timeout(PHASE_LIMIT + Duration::from_secs(120), fault_task).await {
        Ok(done) => done.context("fault task")?.context("injecting a fault")?,
        Err(_) => {
            fault_abort.abort();
            anyhow::bail!("the fault schedule did not finish within {PHASE_LIMIT:?} of the load");
        }
    }
    progress(started, "draining: every committed message must arrive");
    let last_fault_end = fault_log
        .lock()
        .ok()
        .and_then(|f| f.iter().map(|e| e.ended_seconds).reduce(f64::max))
        .unwrap_or(0.0);

    // Drain: everything committed must arrive, and the outbox must empty (a message whose
    // acknowledgement was lost in a fault arrives before the relay records it).
    let ledger = bounded(workload::ledger(&db)).await?;
    let deadline = Instant::now() + Duration::from_secs(180);
    let mut drained_at = started.elapsed().as_secs_f64();
    let mut pending = -1;
    let mut skipped_by_reader: HashSet<Uuid> = HashSet::new();
    loop {
        let missing = ledger.keys().filter(|id| !got.seen.contains(id)).count();
        if missing == 0 {
            pending = match &load_end_lsn {
                Some(lsn) => bounded(cdc_pending(&db, lsn.clone())).await.unwrap_or(-1),
                None => bounded(store.stats())
                    .await
                    .map(|s| s.pending)
                    .unwrap_or(-1),
            };
            if pending == 0 {
                break;
            }
        }
        if Instant::now() > deadline {
            eprintln!(
                "verify: {missing} messages missing and {pending} pending after the drain timeout"
            );
            if missing > 0 {
                skipped_by_reader = fresh_read(reader.as_mut(), &ledger, &got.seen).await;
                if skipped_by_reader.len() == missing {
                    pending = bounded(store.stats())
                        .await
                        .map(|s| s.pending)
                        .unwrap_or(-1);
                }
            }
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        got.poll(reader.as_mut(), started).await;
        if missing > 0 {
            drained_at = started.elapsed().as_secs_f64();
        }
    }
    // Late duplicates (a resumed relay) get a moment to show up.
    tokio::time::sleep(Duration::from_secs(1)).await;
    got.poll(reader.as_mut(), started).await;
    // Through the inbox: every committed message's effect, once.
    let mut inbox_effects = None;
    if let Some((inbox, _)) = &inbox_setup {
        progress(
            started,
            "through the inbox: every committed message's effect must apply",
        );
        let deadline = Instant::now() + Duration::from_secs(180);
        let mut applied_at = started.elapsed().as_secs_f64();
        loop {
            let effects = bounded(crate::inbox::effects(inbox)).await?;
            let have: HashSet<Uuid> = effects.iter().map(|e| e.id).collect();
            let missing = ledger.keys().filter(|id| !have.contains(id)).count();
            if missing == 0 {
                break;
            }
            if Instant::now() > deadline {
                eprintln!("verify: {missing} effects missing after the drain timeout");
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
            applied_at = started.elapsed().as_secs_f64();
        }
        // Late doubles (a resumed handler) get a moment to show up.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let effects = bounded(crate::inbox::effects(inbox)).await?;
        let ingested = bounded(crate::inbox::ingested(inbox)).await?;
        inbox_effects = Some(InboxReport {
            daemons: INBOX_DAEMONS,
            handlers: INBOX_HANDLERS,
            ingested,
            effects: check_effects(&ledger, &effects),
            effects_drain_seconds_after_load: (applied_at - load_end).max(0.0),
        });
    }
    // The odd rows: each must have ended `failed` with its column named.
    let odd = if shape.odd_rows > 0 {
        let rows = bounded(crate::mysql_producers::odd_rows(&db)).await?;
        let failed = bounded(store.failed(ODD_FAILED_READ)).await?;
        let failed: Vec<FailedRow> = failed
            .into_iter()
            .map(|f| FailedRow {
                seq: f.seq,
                error: f.last_error,
            })
            .collect();
        check_odd(&rows, &failed)
    } else {
        OddVerdict::default()
    };
    progress(started, "stopping the processes (SIGTERM)");
    for group in &groups {
        let group = group.clone();
        let stopped = tokio::task::spawn_blocking(move || {
            group
                .lock()
                .map(|mut r| r.stop_all(STOP_GRACE))
                .map_err(|_| anyhow::anyhow!("process list poisoned"))
        })
        .await
        .context("stopping processes")??;
        for s in &stopped {
            eprintln!("verify: {s}");
        }
        stuck.extend(stopped);
    }

    // An operator command as the operator role: what `outbox status` needs, that role has.
    if logins.is_some() {
        if let Err(e) = operator_status(&program, &operator_url, db.schema()).await {
            stuck.push(format!("`outbox status` as the operator role: {e:#}"));
        }
    }

    // The checker.
    let faults = fault_log.lock().map(|f| f.clone()).unwrap_or_default();
    let fault_problems: Vec<String> = faults.iter().filter_map(|f| f.problem.clone()).collect();
    for p in &fault_problems {
        eprintln!("verify: {p}");
    }
    let marks: Vec<FaultMark> = faults
        .iter()
        .map(|f| FaultMark {
            kind: f.kind.clone(),
            at: f.at_seconds,
        })
        .collect();
    let mut verdict = check(&ledger, &got.arrivals, &marks);
    // Found at the broker by a second reader: delivered, and reported apart.
    verdict.lost -= skipped_by_reader.len().min(verdict.lost);
    verdict.delivered += skipped_by_reader.len();
    verdict.lost_sample.retain(|id| {
        id.parse()
            .map_or(true, |id| !skipped_by_reader.contains(&id))
    });
    // MySQL/MariaDB orders the plain insert too (docs/sql-contract.md, section 8): there the
    // raw writers' keys are a guarantee, not information.
    // So does CDC mode: the WAL is in commit order, whatever the writer did.
    // Not in a switching run: the polling relays delivered part of them, in no such order.
    // Nor across a failover before PostgreSQL 17: the slot is lost with the old primary, and
    // the table's messages since the last checkpoint come again by polling (docs/cdc.md).
    let slot_lost = kinds.iter().any(|k| k == "failover");
    let raw_ordered = db.backend() == Backend::Mysql || (cdc && !switch && !slot_lost);
    if raw_ordered {
        verdict.count_raw_order();
    }
    let mut faults_injected: BTreeMap<String, usize> = BTreeMap::new();
    for f in &faults {
        *faults_injected.entry(f.kind.clone()).or_default() += 1;
    }
    let all_kinds = kinds.iter().all(|k| faults_injected.contains_key(k));
    let inbox_ok = inbox_effects.as_ref().is_none_or(|i| i.effects.ok());
    let report = Report {
        ok: verdict.ok()
            && pending == 0
            && inbox_ok
            && stuck.is_empty()
            && fault_problems.is_empty()
            && odd.ok(),
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
        order_sample: verdict.order_sample.clone(),
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
        skipped_by_reader: skipped_by_reader.len(),
        keys_written_by_several_producers: verdict.keys_written_by_several_producers,
        raw_producers: shape.raw_producers,
        raw_order: verdict.raw_order,
        raw_ordered,
        emit_producers: shape.emit_producers,
        emit_committed: ledger
            .values()
            .filter(|c| c.writer == crate::checker::WriterKind::Emit)
            .count(),
        mode: match (cdc, switch) {
            (_, true) => "switch",
            (true, false) => "cdc",
            (false, false) => "polling",
        },
        producer_errors: tally.errors.load(Ordering::Relaxed),
        xa_producers: shape.xa_producers,
        xa_committed: ledger
            .values()
            .filter(|c| c.writer == crate::checker::WriterKind::Xa)
            .count(),
        xa_rolled_back: tally.xa_rolled_back.load(Ordering::Relaxed),
        xa_one_phase: tally.xa_one_phase.load(Ordering::Relaxed),
        xa_recovered: tally.xa_recovered.load(Ordering::Relaxed),
        odd,
        inbox: inbox_effects,
        stuck,
    };
    progress(started, "checked; cleaning up");
    // A failed run keeps its evidence: what the relays logged and what the database holds
    // are what explains a lost message, and nothing else would.
    let failed = !report.ok;
    if failed {
        eprintln!(
            "verify: the run failed; the {} and the relay logs in {} are kept for inspection \
             (remove them by hand)",
            report.database,
            tmp.display()
        );
        print_log_tails(&tmp);
        // Whether the store recorded a lost message as acknowledged tells a broker (or reader)
        // that dropped it from a relay that never published it.
        for id in report.lost_sample.iter().take(LOST_EXPLAINED) {
            let Ok(uuid) = id.parse::<uuid::Uuid>() else {
                continue;
            };
            match bounded(store.journey(&outbox_core::JourneyQuery::Id(uuid), 1)).await {
                Ok(journeys) => match journeys.first() {
                    Some(j) => {
                        let steps: Vec<String> = j
                            .steps
                            .iter()
                            .map(|s| format!("{} ({})", s.what, s.detail))
                            .collect();
                        eprintln!(
                            "verify: lost message {id} (key {}, seq {}): the store says {}: {}",
                            j.aggregate_id,
                            j.seq,
                            j.state.as_str(),
                            steps.join("; ")
                        );
                    }
                    None => eprintln!("verify: lost message {id}: the store does not hold it"),
                },
                Err(e) => eprintln!("verify: lost message {id}: its journey is unknown: {e}"),
            }
        }
    }
    if !keep && !failed {
        if let Some((inbox, _)) = inbox_setup {
            let _ = bounded(inbox.destroy_queue()).await;
        }
        if cdc {
            // The relays are gone; their sessions let go of the slot within a moment.
            if let (Database::Postgres(pg), Ok(names)) = (
                &*db,
                outbox_postgres::Schema::new(db.schema())
                    .and_then(|s| outbox_postgres::cdc::CdcNames::new(&s, "relay")),
            ) {
                for _ in 0..100 {
                    if outbox_postgres::cdc::setup::drop_cdc(pg.pool(), &names)
                        .await
                        .is_ok()
                    {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
        if let Some(l) = &logins {
            // Their sessions first: a login is dropped with what it holds in the schema.
            if let (Some(w), Some(o)) = (writer_db.postgres(), operator_db.postgres()) {
                w.pool().close().await;
                o.pool().close().await;
            }
            l.drop_all(&db).await;
        }
        let _ = bounded(Database::clone(&db).destroy()).await;
        let _ = tokio::time::timeout(PHASE_LIMIT, reader.cleanup()).await;
        let _ = std::fs::remove_dir_all(&tmp);
    }
    Ok(Outcome {
        report,
        all_faults_injected: all_kinds,
    })
}

/// The missing messages (in `ledger`, not in `seen`) that a second reader of the destination,
/// from its start, finds there; empty where the reader cannot be opened again. Reads until
/// every missing one is found, the second reader goes [`FRESH_READ_QUIET`] without a message,
/// or [`FRESH_READ_LIMIT`] passes.
async fn fresh_read(
    reader: &mut dyn Reader,
    ledger: &HashMap<Uuid, Committed>,
    seen: &HashSet<Uuid>,
) -> HashSet<Uuid> {
    let mut found = HashSet::new();
    let Some(mut fresh) = reader.fresh_reader().await else {
        return found;
    };
    let missing: HashSet<Uuid> = ledger
        .keys()
        .filter(|id| !seen.contains(*id))
        .copied()
        .collect();
    let give_up = Instant::now() + FRESH_READ_LIMIT;
    let mut last_message = Instant::now();
    while Instant::now() < give_up && last_message.elapsed() < FRESH_READ_QUIET {
        let polled = fresh.poll(Duration::from_millis(500)).await;
        if !polled.delivered.is_empty() {
            last_message = Instant::now();
        }
        found.extend(
            polled
                .delivered
                .iter()
                .map(|d| d.id)
                .filter(|id| missing.contains(id)),
        );
        if found.len() == missing.len() {
            break;
        }
    }
    eprintln!(
        "verify: a second reader of the destination, from its start, found {} of the {} \
         missing messages there",
        found.len(),
        missing.len()
    );
    // Dropped here, before any clean-up deletes the destination: a Kafka consumer must be
    // closed before its topic goes (see the Kafka reader's `cleanup`).
    drop(fresh);
    found
}

/// How long [`fresh_read`] reads at most, and how long without a message ends it sooner.
const FRESH_READ_LIMIT: Duration = Duration::from_secs(60);
const FRESH_READ_QUIET: Duration = Duration::from_secs(5);

/// Prints the last lines of every log in `dir` to stderr, so that CI's output shows what the
/// processes said before a failed check.
fn print_log_tails(dir: &std::path::Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut logs: Vec<_> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .collect();
    logs.sort();
    for path in logs {
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        let lines: Vec<&str> = text.lines().collect();
        eprintln!("verify: the last lines of {}:", path.display());
        for line in &lines[lines.len().saturating_sub(LOG_TAIL_LINES)..] {
            eprintln!("  {line}");
        }
    }
}

/// How many failed rows the odd-row check reads: more than a run writes odd rows.
const ODD_FAILED_READ: usize = 10_000;

/// How many lost messages a failed run looks up in the store.
const LOST_EXPLAINED: usize = 5;

/// How many lines of each process's log a failed run prints.
const LOG_TAIL_LINES: usize = 30;

/// The longest any one step after the load may take (a query, the producers' stop, the
/// clean-up) before the run gives up on it.
const PHASE_LIMIT: Duration = Duration::from_secs(60);

/// How long the processes get to stop after SIGTERM: long enough for a relay to finish a
/// batch whose acknowledgement times out, short enough to keep a hang out of CI.
const STOP_GRACE: Duration = Duration::from_secs(30);

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

/// Runs `outbox status --format json` as `url`'s login (the operator role): the command an
/// on-call engineer runs first must work with that role's grants.
async fn operator_status(program: &std::path::Path, url: &str, schema: &str) -> anyhow::Result<()> {
    let out = tokio::time::timeout(
        PHASE_LIMIT,
        tokio::process::Command::new(program)
            .args(["status", "--format", "json", "--schema", schema])
            .env("OUTBOX_DATABASE_URL", url)
            .env("OUTBOX_LOG", "warn")
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .context("`outbox status` did not answer")??;
    anyhow::ensure!(
        out.status.success(),
        "exited with {}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    serde_json::from_slice::<serde_json::Value>(&out.stdout)
        .context("`outbox status --format json` did not print JSON")?;
    Ok(())
}
