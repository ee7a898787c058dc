//! The first phase of a run: its scratch directory and the database's virtual IP, the outbox
//! opened (and made) as production runs it, each part's login, the `network` fault's proxies
//! and a fresh destination on the broker with its reader.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context as _;
use outbox_core::Store;
use outbox_db::{Backend, Database};
use outbox_sinks::read::{Reader, ScratchOptions};
use tokio_util::sync::{CancellationToken, DropGuard};

use super::{Settings, INBOX_DAEMONS, INBOX_HANDLERS};
use crate::faults;
use crate::logins::Logins;
use crate::proxy::TcpProxy;
use crate::workload;

/// What the later phases run against.
pub(super) struct Setup {
    /// The run's directory: the relays' logs, a `file:` sink's events, a fresh SQLite file.
    pub tmp: PathBuf,
    /// Stops the virtual IP when the run ends.
    pub _vip_guard: DropGuard,
    /// The database's virtual IP, following the primary (`--primary-cmd`).
    pub vip: Option<Arc<TcpProxy>>,
    /// The outbox, as the URL's own user (an administrator).
    pub db: Arc<Database>,
    /// The outbox as the writer login (the producers).
    pub writer_db: Arc<Database>,
    /// The outbox as the operator login.
    pub operator_db: Arc<Database>,
    /// The operator's store: stats, failed rows and journeys.
    pub store: Arc<dyn Store>,
    /// Where the outbox lives, for the report.
    pub place: String,
    /// The run's least-privilege logins (`--roles`).
    pub logins: Option<Logins>,
    /// The URL's own user's URL (what the run does as an administrator goes there).
    pub admin_db_url: String,
    /// The URL the relays use (their login, through the `network` proxies).
    pub relay_db_url: String,
    /// The URL an operator command uses.
    pub operator_url: String,
    /// The `network` fault's proxies, until the fault schedule takes them.
    pub network: Option<faults::Network>,
    /// The relays reach the database through the proxies until the run ends, long after the
    /// fault schedule (which owns them too) is over.
    pub _proxies: Vec<Arc<TcpProxy>>,
    /// The independent consumer's reader of the destination.
    pub reader: Box<dyn Reader>,
    /// The sink the relays publish to (the scratch destination's, or the given one).
    pub sink_url: String,
    /// The destination the relays publish to.
    pub destination: String,
    /// `stdout:` relays print their messages, all into this one file the consumer tails.
    pub stdout_path: Option<PathBuf>,
}

/// The outbox opened as each part logs in.
struct Opened {
    db: Arc<Database>,
    writer_db: Arc<Database>,
    operator_db: Arc<Database>,
    logins: Option<Logins>,
    admin_db_url: String,
    relay_db_url: String,
    operator_url: String,
}

/// Makes what the run needs before any process starts.
pub(super) async fn prepare(settings: &Settings) -> anyhow::Result<Setup> {
    let tmp = std::env::temp_dir().join(format!("outbox-verify-{:08x}", fastrand::u32(..)));
    std::fs::create_dir_all(&tmp)?;
    // The database's virtual IP, following the primary: everything below connects through it.
    let vip_stop = CancellationToken::new();
    let vip_guard = vip_stop.clone().drop_guard();
    let (db_url, vip) = match &settings.primary_cmd {
        Some(cmd) => {
            let (url, vip) = faults::virtual_ip(&settings.database_url, cmd, vip_stop).await?;
            (url, Some(vip))
        }
        None => (settings.database_url.clone(), None),
    };
    let sink_url = if settings.sink_url == "file:" {
        format!("file:{}", tmp.join("events.jsonl").display())
    } else {
        settings.sink_url.clone()
    };
    let opened = open_as_each_part(settings, &db_url, &tmp).await?;
    let place = opened.db.place();
    let db = opened.db;
    let (relay_db_url, network) = network_proxies(settings, opened.relay_db_url)?;
    let proxies: Vec<Arc<TcpProxy>> = network
        .as_ref()
        .map(|n| n.proxies.clone())
        .unwrap_or_default();
    let store = opened.operator_db.store();
    // `stdout:` relays print their messages, all into one file the consumer tails.
    let stdout_path = (sink_url == "stdout:").then(|| tmp.join("stdout.jsonl"));
    let (reader, sink_url, destination): (Box<dyn Reader>, String, String) =
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
    if settings.announce {
        announce(settings, &place, reader.as_ref(), &tmp);
    }
    Ok(Setup {
        tmp,
        _vip_guard: vip_guard,
        vip,
        db,
        writer_db: opened.writer_db,
        operator_db: opened.operator_db,
        store,
        place,
        logins: opened.logins,
        admin_db_url: opened.admin_db_url,
        relay_db_url,
        operator_url: opened.operator_url,
        network,
        _proxies: proxies,
        reader,
        sink_url,
        destination,
        stdout_path,
    })
}

/// Opens the run's database (see [`open_database`]) and makes the outbox and the ledger in it,
/// then opens it again as the writer and the operator logins (`--roles`).
async fn open_as_each_part(
    settings: &Settings,
    db_url: &str,
    tmp: &std::path::Path,
) -> anyhow::Result<Opened> {
    let Settings {
        shape,
        cdc,
        switch,
        binlog,
        roles,
        ..
    } = *settings;
    // A connection per producer, plus the consumer's status reads and the ledger.
    let pool_size =
        (shape.producers + shape.raw_producers + shape.emit_producers + shape.xa_producers) as u32
            + 6;
    let (db, relay_db_url) = open_database(db_url, tmp, pool_size).await?;
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
            let owner = l.open_owner(&relay_db_url, db.schema()).await?;
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
            // What a superuser does once for CDC mode: pg_walinspect, so a lost slot's emit
            // messages can be read back (the owner may not install it).
            if cdc && db.backend() == Backend::Postgres {
                db.install_wal_salvage().await?;
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
    Ok(Opened {
        db,
        writer_db,
        operator_db,
        logins,
        admin_db_url,
        relay_db_url,
        operator_url,
    })
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

/// The `network` fault: a proxy of verify's own in front of every server the relays reach.
/// Returns the relays' URL through the proxies, and the fault's proxies.
fn network_proxies(
    settings: &Settings,
    relay_db_url: String,
) -> anyhow::Result<(String, Option<faults::Network>)> {
    if !settings.faults.iter().any(|k| k == "network") {
        return Ok((relay_db_url, None));
    }
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
    Ok((
        outbox_db::url::with_hosts(&relay_db_url, &via)?,
        Some(faults::Network {
            proxies,
            blackout: settings.network_blackout,
        }),
    ))
}

/// Prints what the run is about to do (text output).
fn announce(settings: &Settings, place: &str, reader: &dyn Reader, tmp: &std::path::Path) {
    let shape = &settings.shape;
    println!(
        "outbox verify: seed {}, {} relays, {} producers on {} shared keys, {} plain-INSERT \
         producers on {} keys, {:?} of load, faults {:?}",
        settings.seed,
        settings.relays,
        shape.producers,
        shape.keys,
        shape.raw_producers,
        shape.raw_keys,
        settings.duration,
        settings.faults
    );
    println!(
        "  outbox {place}; broker {}; relay logs in {}",
        reader.describe(),
        tmp.display()
    );
    if settings.switch {
        println!(
            "  relays in polling mode, then, a third of the way in, `outbox migrate --cdc` \
             under load and every relay killed (kill -9) and started in CDC mode"
        );
    } else if settings.cdc {
        println!(
            "  relays in CDC mode (outbox relay --mode cdc, one slot reader at a time); {} \
             emit producers on {} keys of their own; plain-INSERT order is a guarantee",
            shape.emit_producers, shape.raw_keys
        );
    }
    if settings.through_inbox {
        println!(
            "  through the inbox: {INBOX_DAEMONS} `outbox inbox` daemons and {INBOX_HANDLERS} \
             handler processes, faults included"
        );
    }
}
