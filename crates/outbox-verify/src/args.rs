//! `outbox verify`'s flags, next to what they configure: the binary parses them (`clap`) and
//! hands them over; [`Args::settings`] turns the profile and flags (and the database URL from
//! the environment) into the checker's [`Settings`].

use std::time::Duration;

use anyhow::Context as _;
use outbox_core::options::Dur;

use crate::workload::Shape;
use crate::Settings;

/// Output of the report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Human-readable, with the run announced as it goes.
    Text,
    /// One JSON object.
    Json,
}

/// Length and size of an `outbox verify` run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Profile {
    /// About a minute: for CI.
    Short,
    /// Ten minutes of load: for releases and `docs/guarantees.md`.
    Long,
}

/// `outbox verify` options.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Database (default DATABASE_URL). A postgres:// run uses a fresh schema of its own, a
    /// mysql:// or mariadb:// run a fresh database of its own (where the plain-INSERT
    /// producers' order counts: the position trigger orders them); a sqlite:// run uses a fresh
    /// file in a temporary folder when no path is given.
    #[arg(long, value_name = "URL")]
    pub database_url: Option<String>,
    /// Broker: nats://host:port (a stream of its own), kafka://… (a topic of its own),
    /// amqp://… (an exchange and queue of its own), redis://… (a stream of its own), mqtt://…
    /// (a topic of its own, read by a persistent-session subscriber), sqs://… (a queue of its
    /// own), sns://… (a topic of its own, read through a subscribed queue), http(s)://…
    /// (a signed receiver of its own; the URL's fragment, e.g. #secret_env=NAME, is kept),
    /// file:path.jsonl or stdout:. Env: OUTBOX_SINK
    /// (keeps a token or password off the command line). Relays get it through the
    /// environment, never as an argument.
    #[arg(
        long,
        value_name = "URL",
        default_value = "nats://127.0.0.1:4222",
        env = "OUTBOX_SINK",
        hide_env_values = true
    )]
    pub sink: String,
    /// Profile: short (about a minute) or long (ten minutes).
    #[arg(long, value_enum, default_value_t = Profile::Short)]
    pub profile: Profile,
    /// Load duration (overrides the profile).
    #[arg(long)]
    pub duration: Option<Dur>,
    /// Relay processes.
    #[arg(long)]
    pub relays: Option<usize>,
    /// Producer tasks writing through the writer API, all on the same keys.
    #[arg(long)]
    pub producers: Option<usize>,
    /// Producer tasks writing the plain SQL `INSERT` without the per-key lock, on keys of their
    /// own (a quarter as many as --keys); their order is reported, not required. 0: none.
    #[arg(long)]
    pub raw_producers: Option<usize>,
    /// Ordering keys of the writer-API producers.
    #[arg(long)]
    pub keys: Option<usize>,
    /// Seed of the fault schedule (default: random, printed).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Relay partition lease.
    #[arg(long, default_value = "3s")]
    pub lease: Dur,
    /// Pause between faults.
    #[arg(long, default_value = "4s")]
    pub fault_interval: Dur,
    /// Fault kinds to inject: kill, pause, broker, db, failover, network (broker, db and
    /// failover need the commands below; network needs a database reached by host and port:
    /// verify puts a proxy of its own in front of it).
    #[arg(long, value_delimiter = ',', default_value = "kill,pause,broker,db")]
    pub faults: Vec<String>,
    /// Shell command that stops the broker (for the `broker` fault).
    #[arg(long, value_name = "CMD")]
    pub broker_stop_cmd: Option<String>,
    /// Shell command that starts the broker again.
    #[arg(long, value_name = "CMD")]
    pub broker_start_cmd: Option<String>,
    /// Shell command that restarts the database (for the `db` fault).
    #[arg(long, value_name = "CMD")]
    pub db_restart_cmd: Option<String>,
    /// Shell command that fails the database over (for the `failover` fault): the primary
    /// stops and a standby is promoted while the producers write. The database URL must name
    /// every server (`postgres://u@h1:5440,h2:5441/db?target_session_attrs=read-write`), so
    /// writers and relays find the new primary; or, on MySQL/MariaDB, whose URLs name one
    /// server, pass --primary-cmd too.
    #[arg(long, value_name = "CMD")]
    pub failover_cmd: Option<String>,
    /// Shell command printing the database's primary now as `host:port`
    /// (`scripts/mariadb-ha.sh primary`). Verify then puts a proxy of its own in front of the
    /// database, standing for a virtual IP moved at promotion: writers, relays and verify's own
    /// reads all connect through it, and each new connection goes to the primary the command
    /// last printed (asked every 250 ms); connections made before a failover stay with the
    /// server they reached and die with it. The URL's host and port are replaced by the proxy's.
    #[arg(long, value_name = "CMD")]
    pub primary_cmd: Option<String>,
    /// How long the `network` fault black-holes the relays' database connections (held open,
    /// nothing passes, no RST): each relay must say so on `/readyz` within 30 s, and reconnect
    /// after.
    #[arg(long, value_name = "DURATION", default_value = "60s")]
    pub network_blackout: Dur,
    /// Run every part as the database URL's user, instead of least-privilege logins made for the
    /// run: writers, relays and operator commands each log in as a role holding only its part's
    /// grants (docs/roles.md on PostgreSQL; on MySQL/MariaDB accounts with exactly the grants of
    /// docs/engine-mysql.md, "Least privileges", the operator running `outbox migrate`).
    #[arg(long)]
    pub no_roles: bool,
    /// Output format of the report.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
    /// Keep the schema / file and the stream afterwards for inspection.
    #[arg(long)]
    pub keep: bool,
    /// Go on through the receiving side (PostgreSQL and a nats:// sink): `outbox inbox`
    /// daemons consume the broker into an inbox, handler processes apply each message's effect,
    /// `kill` and `pause` hit them too, and every effect must be applied exactly once and in
    /// per-key order.
    #[arg(long)]
    pub through_inbox: bool,
    /// polling (default), or cdc: the relays run `outbox relay --mode cdc` on the slot
    /// `verify --mode cdc` makes first (PostgreSQL with wal_level=logical); the plain-INSERT
    /// producers' order becomes a guarantee (commit order), and emit producers write logical
    /// messages beside them. Or switch: polling relays first; a third of the way in, under load,
    /// the slot is made (`outbox migrate --cdc`), every relay is killed (kill -9) and started
    /// again in CDC mode, which delivers what the polling relays left before it reads the
    /// stream (docs/cdc.md, "Switching a running outbox").
    #[arg(long, value_enum, default_value_t = VerifyMode::Polling)]
    pub mode: VerifyMode,
    /// MySQL/MariaDB with the row binlog: run the outbox on the binlog route (`outbox migrate
    /// --binlog`): writers' inserts run no trigger and the relays' sequencer gives positions
    /// from the binlog; the plain-INSERT producers' order counts.
    #[arg(long, conflicts_with_all = ["mode", "through_inbox"])]
    pub binlog: bool,
    /// PostgreSQL or MySQL/MariaDB (the trigger route): the plain-INSERT producers write
    /// Debezium's documented outbox table (`debezium_outbox`: id, aggregatetype, aggregateid,
    /// type, payload) with Debezium's INSERT, adopted as `outbox migrate --adopt-debezium` does
    /// (docs/migrating-from-debezium.md); the checks are the same.
    #[arg(long, conflicts_with_all = ["binlog"])]
    pub debezium: bool,
    /// CDC mode: producers writing with `emit` (no row), on keys of their own (default 2).
    #[arg(long)]
    pub emit_producers: Option<usize>,
    /// MySQL/MariaDB: producers writing the plain INSERT in XA transactions (`XA START … XA
    /// PREPARE … XA COMMIT`, some `XA ROLLBACK`, some `XA COMMIT … ONE PHASE`), on keys of
    /// their own; their order counts (default 2; 0: none).
    #[arg(long)]
    pub xa_producers: Option<usize>,
    /// MySQL/MariaDB: rows written against the SQL contract (an id that is not a UUID, a zero
    /// date; the server's checks off for the statement), each on a key of its own: each must
    /// end `failed` with its column named (default 20; 0: none).
    #[arg(long)]
    pub odd_rows: Option<usize>,
}

/// Which relay `outbox verify` checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum VerifyMode {
    /// The polling relay.
    Polling,
    /// The CDC relay (`outbox relay --mode cdc`).
    Cdc,
    /// Polling relays switched to CDC mode under load, by kill -9.
    Switch,
}

impl Args {
    /// The checker's settings for these flags: the profile's duration, relays and workload
    /// unless a flag overrides them, and the fault kinds whose commands were given (a kind
    /// without its command is skipped, saying so on stderr). `program` is the `outbox` binary
    /// the relays run as.
    pub fn settings(&self, program: std::path::PathBuf) -> anyhow::Result<Settings> {
        let (d, r, p, rp, k) = match self.profile {
            Profile::Short => (Duration::from_secs(40), 3, 4, 2, 64),
            Profile::Long => (Duration::from_secs(600), 3, 8, 4, 500),
        };
        let keys = self.keys.unwrap_or(k).max(1);
        let database_url = self
            .database_url
            .clone()
            .or_else(|| std::env::var("OUTBOX_DATABASE_URL").ok())
            .or_else(|| std::env::var("DATABASE_URL").ok())
            .context("verify needs --database-url (or OUTBOX_DATABASE_URL / DATABASE_URL)")?;
        let mysql = outbox_db::Backend::of(&database_url)? == outbox_db::Backend::Mysql;
        if !mysql
            && (self.xa_producers.is_some_and(|x| x > 0) || self.odd_rows.is_some_and(|x| x > 0))
        {
            anyhow::bail!("verify: --xa-producers and --odd-rows write MySQL/MariaDB's SQL; use a mysql:// URL");
        }
        let shape = Shape {
            producers: self.producers.unwrap_or(p).max(1),
            keys,
            raw_producers: self.raw_producers.unwrap_or(rp),
            raw_keys: (keys / 4).max(2),
            emit_producers: match self.mode {
                VerifyMode::Cdc => self.emit_producers.unwrap_or(2),
                VerifyMode::Polling | VerifyMode::Switch => 0,
            },
            debezium: self.debezium,
            xa_producers: if mysql {
                self.xa_producers.unwrap_or(2)
            } else {
                0
            },
            odd_rows: if mysql {
                self.odd_rows.unwrap_or(20)
            } else {
                0
            },
        };
        if self.mode == VerifyMode::Polling && self.emit_producers.is_some_and(|e| e > 0) {
            anyhow::bail!("verify: --emit-producers writes logical messages only a CDC relay reads; add --mode cdc");
        }
        if self.mode == VerifyMode::Switch && self.emit_producers.is_some_and(|e| e > 0) {
            anyhow::bail!(
                "verify: --mode switch has no emit producers: a logical message written before \
                 the slot exists is in no stream and no table; use --mode cdc for them"
            );
        }
        if self.mode != VerifyMode::Polling && self.through_inbox {
            anyhow::bail!(
                "verify: --mode cdc or switch and --through-inbox are not combined yet; run them \
                 apart"
            );
        }
        let mut kinds: Vec<String> = Vec::new();
        for f in &self.faults {
            match f.as_str() {
                "kill" | "pause" => kinds.push(f.clone()),
                "broker" if self.broker_stop_cmd.is_some() && self.broker_start_cmd.is_some() => {
                    kinds.push(f.clone())
                }
                "db" if self.db_restart_cmd.is_some() => kinds.push(f.clone()),
                "failover" if self.failover_cmd.is_some() => kinds.push(f.clone()),
                "network" => kinds.push(f.clone()),
                "broker" | "db" | "failover" => {
                    eprintln!("verify: fault `{f}` skipped: pass its command (--{f}-…-cmd)")
                }
                other => anyhow::bail!(
                    "verify: unknown fault `{other}` (kill, pause, broker, db, failover, network)"
                ),
            }
        }
        Ok(Settings {
            database_url,
            sink_url: self.sink.clone(),
            duration: self.duration.map_or(d, |x| x.0),
            relays: self.relays.unwrap_or(r).max(1),
            shape,
            seed: self.seed.unwrap_or_else(|| fastrand::u64(..)),
            faults: kinds,
            fault_interval: self.fault_interval.0,
            lease: self.lease.0,
            broker_stop: self.broker_stop_cmd.clone(),
            broker_start: self.broker_start_cmd.clone(),
            db_restart: self.db_restart_cmd.clone(),
            failover: self.failover_cmd.clone(),
            primary_cmd: self.primary_cmd.clone(),
            network_blackout: self.network_blackout.0,
            roles: !self.no_roles,
            keep: self.keep,
            program,
            announce: self.format == Format::Text,
            through_inbox: self.through_inbox,
            cdc: self.mode != VerifyMode::Polling,
            switch: self.mode == VerifyMode::Switch,
            binlog: self.binlog,
        })
    }
}
