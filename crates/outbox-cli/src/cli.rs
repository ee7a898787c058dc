//! Command-line interface. Flags override `OUTBOX_…` environment variables, which override
//! `outbox.toml`.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::config::Dur;

/// Transactional outbox relay: publishes rows your transactions wrote to a broker, at least once.
#[derive(Debug, Parser)]
#[command(name = "outbox", version, about, propagate_version = true)]
pub struct Cli {
    /// Config file (default: ./outbox.toml when it exists). Env: OUTBOX_CONFIG.
    #[arg(long, global = true, value_name = "PATH")]
    pub config: Option<PathBuf>,

    /// Log format on stderr: text or json. Filter with OUTBOX_LOG or RUST_LOG.
    #[arg(long, global = true, default_value = "text", value_parser = ["text", "json"])]
    pub log_format: String,

    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create or upgrade the outbox tables (idempotent).
    Migrate(MigrateArgs),
    /// Publish pending outbox rows to a sink until stopped (SIGINT/SIGTERM).
    Relay(RelayArgs),
    /// Show pending, oldest pending age, failed and published counts.
    Status(StatusArgs),
    /// Measure the outbox against real PostgreSQL and NATS: drain, latency, write cost, held
    /// snapshots, idle CPU.
    Bench(outbox_bench::Args),
    /// Tell the outbox story end to end in under a minute: SQLite and a file, no server needed.
    Demo(outbox_demo::Args),
    /// Check the guarantees under faults: workload, relay processes, kill -9, SIGSTOP, broker
    /// and database restarts, and a checker (lost, phantoms, order, duplicates).
    Verify(outbox_verify::Args),
    /// Housekeeping once: create storage segments ahead of the writers and drop the ones every
    /// relay has passed and whose retention ran out (the relay does this every 30 s).
    Maintain(MaintainArgs),
    /// Drop, now, storage that every relay has passed and that closed longer ago than
    /// --older-than. Never drops a pending or parked message.
    Purge(PurgeArgs),
    /// List messages that ended `failed`, with their errors.
    Failed(FailedArgs),
    /// Give failed messages a fresh budget: they are retried now, in key order, and each one is
    /// recorded in the `outbox_redrives` audit table.
    Redrive(RedriveArgs),
    /// Consume a broker into the inbox table until stopped (SIGINT/SIGTERM): batches recorded
    /// once per message id, the broker acknowledged only after the insert committed.
    Inbox(InboxArgs),
    /// Serve the web console until stopped: overview, partitions, failed messages and redrive,
    /// retention, the inbox, a message's journey. Loopback by default.
    Console(ConsoleArgs),
    /// The inbox handler process `outbox verify --through-inbox` starts (not for users).
    #[command(hide = true)]
    VerifyInboxHandler(VerifyInboxHandlerArgs),
}

/// `outbox inbox` options.
#[derive(Debug, Clone, Args)]
pub struct InboxArgs {
    #[command(flatten)]
    pub db: DbArgs,
    /// Source URL, one of: nats://host:4222?stream=S[&durable=D][&subject=F][&ack_wait=30s];
    /// redis://host:6379?stream=K[&group=G][&consumer=C][&start=0|$];
    /// kafka://host:9092[,host:9092]?topic=T[&group=G][&start=earliest|latest];
    /// amqp://user:pass@host:5672/%2f?queue=Q[&ack_timeout=5s];
    /// sqs://?queue=NAME_OR_URL[&region=R][&endpoint=URL][&visibility_timeout=60s][&wait=1s];
    /// mqtt://host:1883?topic=FILTER[&client_id=C][&session_expiry=7d]. Each also takes
    /// `name=` (the `source` column). Env: OUTBOX_INBOX_SOURCE.
    #[arg(long, value_name = "URL")]
    pub source: Option<String>,
    /// Messages per batch: one fetch, one transaction, one round of acknowledgements (default
    /// 500). Env: OUTBOX_INBOX_BATCH_SIZE.
    #[arg(long, value_name = "N")]
    pub batch_size: Option<usize>,
    /// Longest wait between fetches when the source is idle (default 100ms). Env:
    /// OUTBOX_INBOX_POLL_INTERVAL.
    #[arg(long, value_name = "DURATION")]
    pub poll_interval: Option<Dur>,
    /// How long processed inbox rows and dedupe claims are kept (default 7d); must exceed the
    /// source's longest redelivery window (a warning says when the source keeps messages
    /// longer). Env: OUTBOX_INBOX_RETENTION.
    #[arg(long, value_name = "DURATION")]
    pub retention: Option<Dur>,
    /// Serve /metrics (Prometheus), /livez and /readyz on this address, e.g. 127.0.0.1:9464
    /// (default: off). Bind 0.0.0.0 only where the probes must be reached from outside the
    /// host (a Kubernetes pod). Env: OUTBOX_INBOX_METRICS_ADDR.
    #[arg(long, value_name = "ADDR")]
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// Export a receive span per batch, linked to each message's writer span, over OTLP/HTTP
    /// to this collector, e.g. http://127.0.0.1:4318. Env: OUTBOX_OTLP_ENDPOINT.
    #[arg(long, value_name = "URL", env = "OUTBOX_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,
    /// Print the settings as resolved (passwords masked), then exit.
    #[arg(long)]
    pub print_config: bool,
}

/// `outbox failed` options.
#[derive(Debug, Clone, Args)]
pub struct FailedArgs {
    #[command(flatten)]
    pub db: DbArgs,
    /// The inbox's messages whose handlers gave up, instead of the outbox's.
    #[arg(long)]
    pub inbox: bool,
    /// At most this many messages, oldest first.
    #[arg(long, default_value_t = 100)]
    pub limit: usize,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
}

/// `outbox redrive` options.
#[derive(Debug, Clone, Args)]
#[command(group(clap::ArgGroup::new("which").required(true).args(["all", "id"])))]
pub struct RedriveArgs {
    #[command(flatten)]
    pub db: DbArgs,
    /// The inbox's failed messages (their handlers run again), instead of the outbox's.
    #[arg(long)]
    pub inbox: bool,
    /// Every failed message.
    #[arg(long)]
    pub all: bool,
    /// The failed message with this id (repeat the flag, or separate with commas).
    #[arg(long, value_name = "UUID", num_args = 1.., value_delimiter = ',')]
    pub id: Vec<uuid::Uuid>,
    /// Why, for the audit table (default: `outbox redrive` and the user running it).
    #[arg(long, value_name = "TEXT")]
    pub reason: Option<String>,
}

/// `outbox migrate` options.
#[derive(Debug, Clone, Args)]
pub struct MigrateArgs {
    #[command(flatten)]
    pub db: DbArgs,
    /// The inbox instead: `inbox_messages`, `processed_messages`, `idempotency_keys` in
    /// --schema, and the processing queue in `<schema>_inbox` (SQLite: `inbox_queue…`).
    #[arg(long, conflicts_with_all = ["notify", "no_notify"])]
    pub inbox: bool,
    /// Install the NOTIFY doorbell (PostgreSQL): relays wake at once on insert, at a price for
    /// writers: notifying commits are serialised (about half the write throughput of 16 busy
    /// clients). For low-write apps that want no idle polling.
    #[arg(long, conflicts_with = "no_notify")]
    pub notify: bool,
    /// Remove the NOTIFY doorbell (PostgreSQL).
    #[arg(long)]
    pub no_notify: bool,
    /// Also set up CDC mode (PostgreSQL with wal_level=logical): the publication
    /// `outbox_<schema>` of the message table and the replication slot
    /// `outbox_<schema>_<group>` that `outbox relay --mode cdc` reads. Idempotent.
    #[arg(long, conflicts_with = "inbox")]
    pub cdc: bool,
    /// The CDC relay group whose slot --cdc creates (one slot, one reader at a time, per
    /// group). Env: OUTBOX_CDC_GROUP.
    #[arg(
        long,
        value_name = "NAME",
        default_value = "relay",
        env = "OUTBOX_CDC_GROUP"
    )]
    pub cdc_group: String,
    /// Also turn the binlog route on (MySQL/MariaDB with the row binlog): writers' inserts run
    /// no trigger, and the relay gives each committed row its position from the binlog, in
    /// commit order (docs/engine-mysql.md, "The binlog route"). Stop the relays first, run
    /// this, start them again. Idempotent.
    #[arg(long, conflicts_with_all = ["inbox", "cdc"])]
    pub binlog: bool,
    /// Give a part of the deployment its least privileges on the outbox tables: PART=ROLE,
    /// where PART is writer, relay, operator or reader (docs/roles.md), for example
    /// `--grant writer=app_rw --grant relay=outbox_relay`. Repeatable. Recorded, and applied
    /// again by every later `outbox migrate`, so an upgrade keeps them. PostgreSQL (a role);
    /// MySQL/MariaDB (an account, `user` or `user@host`).
    #[arg(long, value_name = "PART=ROLE", conflicts_with = "inbox")]
    pub grant: Vec<outbox_core::Grant>,
    /// Adopt a Debezium outbox table (PostgreSQL, MySQL/MariaDB): `name` or `schema.name`
    /// (`database.name` on MySQL), laid out as
    /// Debezium documents it (id, aggregatetype, aggregateid, type, payload, optional
    /// tracingspancontext, any additional columns). An AFTER INSERT trigger copies each row
    /// into --schema's outbox in the writer's transaction, so the application's INSERTs stay
    /// as they are (docs/migrating-from-debezium.md). Idempotent.
    #[arg(long, value_name = "TABLE", conflicts_with_all = ["inbox", "release_debezium"])]
    pub adopt_debezium: Option<String>,
    /// Remove what --adopt-debezium installed on TABLE (the rollback). Idempotent.
    #[arg(long, value_name = "TABLE", conflicts_with = "inbox")]
    pub release_debezium: Option<String>,
}

/// Where `outbox relay` reads messages from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum RelayMode {
    /// Claims from the table: positions, partitions and leases (every database).
    #[default]
    Polling,
    /// Reads PostgreSQL's WAL by logical replication: commit order, no polling, and
    /// messages written with `emit` (needs `outbox migrate --cdc`).
    Cdc,
}

/// `outbox maintain` options.
#[derive(Debug, Clone, Args)]
pub struct MaintainArgs {
    #[command(flatten)]
    pub db: DbArgs,
    /// How long storage every relay has passed is kept (default 7d). Env: OUTBOX_RETENTION.
    #[arg(long, value_name = "DURATION")]
    pub retention: Option<Dur>,
}

/// `outbox purge` options.
#[derive(Debug, Clone, Args)]
pub struct PurgeArgs {
    #[command(flatten)]
    pub db: DbArgs,
    /// Drop storage every relay has passed and that closed longer ago than this (e.g. 1d, 0s).
    #[arg(long, value_name = "DURATION")]
    pub older_than: Dur,
}

/// Where the outbox lives.
#[derive(Debug, Clone, Args)]
pub struct DbArgs {
    /// Database URL, e.g. postgres://user@host/db. Env: DATABASE_URL or OUTBOX_DATABASE_URL.
    #[arg(long, value_name = "URL")]
    pub database_url: Option<String>,
    /// Schema holding the outbox tables (default public). Env: OUTBOX_SCHEMA.
    #[arg(long, value_name = "NAME")]
    pub schema: Option<String>,
}

/// `outbox relay` options.
#[derive(Debug, Clone, Args)]
pub struct RelayArgs {
    #[command(flatten)]
    pub db: DbArgs,
    /// polling (default) or cdc: read the WAL of PostgreSQL by logical replication (see
    /// docs/cdc.md). Env: OUTBOX_RELAY_MODE.
    #[arg(long, value_enum, default_value_t = RelayMode::Polling, env = "OUTBOX_RELAY_MODE")]
    pub mode: RelayMode,
    /// CDC mode: the relay group, whose slot `outbox_<schema>_<group>` this relay reads. Env:
    /// OUTBOX_CDC_GROUP.
    #[arg(
        long,
        value_name = "NAME",
        default_value = "relay",
        env = "OUTBOX_CDC_GROUP"
    )]
    pub cdc_group: String,
    /// CDC mode: write a heartbeat (a non-transactional logical message) into the WAL when
    /// the stream has been silent this long, e.g. 30s (default: off; PostgreSQL's own idle
    /// positions keep the slot moving, and an idle relay then sends no statement). Env:
    /// OUTBOX_CDC_HEARTBEAT.
    #[arg(long, value_name = "DURATION", env = "OUTBOX_CDC_HEARTBEAT")]
    pub cdc_heartbeat: Option<crate::config::Dur>,
    /// CDC mode: when the slot is this far behind (WAL written since its confirmed position,
    /// e.g. 20GiB), the relay drops it and makes it again, saying so: the table's messages are
    /// delivered by polling meanwhile, and the emit messages it had not published are read back
    /// from the WAL and parked (docs/cdc.md, "When the slot is lost"). Checked every maintenance
    /// round while the relay has messages in hand. Default: no limit of ours (PostgreSQL's
    /// max_slot_wal_keep_size still applies). Env: OUTBOX_CDC_MAX_RETAINED_WAL.
    #[arg(long, value_name = "SIZE", env = "OUTBOX_CDC_MAX_RETAINED_WAL")]
    pub cdc_max_retained_wal: Option<crate::config::ByteSize>,
    /// CDC mode: a message held in the relay this long (its route's sink down, or retried)
    /// while other messages are published is parked in outbox_parked with its key's later
    /// messages, so the slot's confirmed position moves on and its WAL is released; they are
    /// published from there, in order, once the sink is back (default 60s). While no sink
    /// publishes at all, nothing is parked: the slot holds the WAL. Env: OUTBOX_CDC_PARK_AFTER.
    #[arg(long, value_name = "DURATION", env = "OUTBOX_CDC_PARK_AFTER")]
    pub cdc_park_after: Option<crate::config::Dur>,
    /// Sink URL, e.g. nats://127.0.0.1:4222. Env: OUTBOX_SINK.
    #[arg(long, value_name = "URL")]
    pub sink: Option<String>,
    /// Destination template; placeholders {aggregate_type} {aggregate_id} {event_type} {topic}.
    /// A row's `topic` wins. Default {aggregate_type}.{event_type}. Env: OUTBOX_DESTINATION.
    #[arg(long, value_name = "TEMPLATE")]
    pub destination: Option<String>,
    /// Rows per claim (default 1000). Env: OUTBOX_BATCH_SIZE.
    #[arg(long, value_name = "N")]
    pub batch_size: Option<usize>,
    /// Payload bytes the relay holds at once (default 16MiB), shared by its workers: claims stop
    /// there, so memory follows this, not the payloads' size; a single larger payload still
    /// goes through, alone. Env: OUTBOX_BATCH_BYTES.
    #[arg(long, value_name = "SIZE")]
    pub batch_bytes: Option<crate::config::ByteSize>,
    /// Worker tasks (relay members) in this process (default 2). Env: OUTBOX_WORKERS.
    #[arg(long, value_name = "N")]
    pub workers: Option<usize>,
    /// Longest wait between polls when idle (default 100ms). Polling is adaptive: at once after a
    /// full batch, 1 ms after a partial one, doubling while empty. Env: OUTBOX_POLL_INTERVAL.
    #[arg(long, value_name = "DURATION")]
    pub poll_interval: Option<Dur>,
    /// Also wake on LISTEN/NOTIFY (needs `outbox migrate --notify`). Env: OUTBOX_LISTEN=true.
    #[arg(long, conflicts_with = "no_listen")]
    pub listen: bool,
    /// Poll only (the default). Env: OUTBOX_LISTEN=false.
    #[arg(long)]
    pub no_listen: bool,
    /// Claim each batch only after the one before it is recorded, instead of reading it while
    /// a full batch is published (the default). Env: OUTBOX_READ_AHEAD=false.
    #[arg(long)]
    pub no_read_ahead: bool,
    /// How long storage every relay has passed is kept before it is dropped (default 7d).
    /// Env: OUTBOX_RETENTION.
    #[arg(long, value_name = "DURATION")]
    pub retention: Option<Dur>,
    /// How often the relay maintains storage: segments ahead of the writers, retention
    /// (default 30s). 0 turns it off, for a relay role without the tables owner's privileges:
    /// then run `outbox maintain` as the owner on a schedule (docs/roles.md).
    /// Env: OUTBOX_MAINTAIN_EVERY.
    #[arg(long, value_name = "DURATION")]
    pub maintain_every: Option<Dur>,
    /// Partition lease: how soon a dead relay's work is taken over (default 30s). The sink's ack
    /// timeout must fit in a third of it. Env: OUTBOX_LEASE.
    #[arg(long, value_name = "DURATION")]
    pub lease: Option<Dur>,
    /// Deadline of each database call a relay worker makes (default 15s); one without an
    /// answer by then is abandoned and retried. Env: OUTBOX_STORE_TIMEOUT.
    #[arg(long, value_name = "DURATION")]
    pub store_timeout: Option<Dur>,
    /// Attempts before a message ends `failed` (default 10). Env: OUTBOX_MAX_ATTEMPTS.
    #[arg(long, value_name = "N")]
    pub max_attempts: Option<u32>,
    /// First retry delay, doubled per attempt with jitter (default 1s). Env: OUTBOX_BACKOFF_BASE.
    #[arg(long, value_name = "DURATION")]
    pub backoff_base: Option<Dur>,
    /// Longest retry delay (default 5m). Env: OUTBOX_BACKOFF_MAX.
    #[arg(long, value_name = "DURATION")]
    pub backoff_max: Option<Dur>,
    /// What a `failed` message means for the rest of its key: `block` (default: they wait, order
    /// holds) or `skip` (they flow on). Env: OUTBOX_ON_FAILED.
    #[arg(long, value_name = "POLICY")]
    pub on_failed: Option<outbox_core::OnFailed>,
    /// Confine the relay to these destinations: NATS-style patterns, `*` one token, a final `>`
    /// one or more (e.g. `orders.>`). A row rendering outside them ends `failed` with the reason.
    /// System spaces (`$JS.`, `$KV.`, `_INBOX.`, any `$…`) need a pattern naming them.
    /// Repeat the flag or separate with commas. Env: OUTBOX_ALLOW_DESTINATIONS (comma list).
    #[arg(long, value_name = "PATTERN", num_args = 1.., value_delimiter = ',')]
    pub allow_destinations: Vec<String>,
    /// A routing rule: rows it matches go to its sink instead of --sink. `;`-separated
    /// `key=value` pairs: `aggregate_type`, `event_type`, `topic` (globs, `*` matches anything;
    /// every one given must match), `sink` (required), `destination` (a template; default
    /// --destination), `name`, `envelope` (`outbox` default, `cloudevents` binary mode,
    /// `cloudevents-structured`; docs/envelopes.md; `debezium`, the Outbox Event Router's output,
    /// with its `route.by.field`, `route.topic.replacement`, `table.expand.json.payload` and
    /// `table.fields.additional.placement` options; docs/migrating-from-debezium.md) and
    /// `source` (the CloudEvents `source`, a URI-reference, default `/outbox`). E.g. `event_type=payment.*; sink=kafka://127.0.0.1:9092;
    /// destination=payments`. Repeat the flag; the first matching rule wins, rows matching none
    /// go to --sink (and end `failed` when there is none). Replaces `[[relay.routes]]`.
    #[arg(long, value_name = "RULE")]
    pub route: Vec<String>,
    /// Serve /metrics (Prometheus), /livez and /readyz on this address, e.g. 127.0.0.1:9464
    /// (default: off). Bind 0.0.0.0 only where the probes must be reached from outside the
    /// host (a Kubernetes pod). Env: OUTBOX_METRICS_ADDR.
    #[arg(long, value_name = "ADDR")]
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// Export a publish span per batch, linked to each message's writer span, over OTLP/HTTP
    /// to this collector, e.g. http://127.0.0.1:4318. Env: OUTBOX_OTLP_ENDPOINT.
    #[arg(long, value_name = "URL", env = "OUTBOX_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,
    /// Also serve the web console (as `outbox console`, outbox pages only) on this address,
    /// e.g. 127.0.0.1:8080; its token from OUTBOX_CONSOLE_TOKEN (required unless the address is
    /// loopback), further host names from OUTBOX_CONSOLE_ALLOWED_HOSTS.
    #[arg(long, value_name = "ADDR")]
    pub console: Option<std::net::SocketAddr>,
    /// /readyz fails once every sink's circuit has been open for longer than this (default
    /// 15s): the relay cannot make progress, though a restart would not help (see
    /// docs/operations.md). Env: OUTBOX_UNREADY_AFTER.
    #[arg(long, value_name = "DURATION")]
    pub unready_after: Option<Dur>,
    /// Print the settings as resolved from file, environment and flags (passwords masked), then
    /// exit without connecting to anything.
    #[arg(long)]
    pub print_config: bool,
}

/// Output format of `status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// Human-readable.
    Text,
    /// One JSON object.
    Json,
}

/// `outbox status` options.
#[derive(Debug, Clone, Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub db: DbArgs,
    /// The inbox's processing queue instead (`published` counts handled messages).
    #[arg(long)]
    pub inbox: bool,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
    /// Refresh every INTERVAL (default 2s) until Ctrl-C: the text view is redrawn on a
    /// terminal; with --format json, one JSON object per line per refresh.
    #[arg(long, value_name = "INTERVAL", num_args = 0..=1, default_missing_value = "2s")]
    pub watch: Option<Dur>,
    /// The relay's routing rules (as `outbox relay --route`), to group the backlog by route as
    /// it does; replaces `[[relay.routes]]` of the file. Repeat the flag.
    #[arg(long, value_name = "RULE")]
    pub route: Vec<String>,
}

/// `outbox console` options.
#[derive(Debug, Clone, Args)]
pub struct ConsoleArgs {
    #[command(flatten)]
    pub db: DbArgs,
    #[command(flatten)]
    pub console: outbox_console::Options,
    /// The relay's routing rules (as `outbox relay --route`), to group the backlog by route as
    /// it does; replaces `[[relay.routes]]` of the file. Repeat the flag.
    #[arg(long, value_name = "RULE")]
    pub route: Vec<String>,
}

/// The hidden handler process of `outbox verify --through-inbox`.
#[derive(Debug, Clone, Args)]
pub struct VerifyInboxHandlerArgs {
    /// Schema of the run's inbox. The database URL comes from OUTBOX_DATABASE_URL.
    #[arg(long, value_name = "NAME")]
    pub schema: String,
    /// The processor's partition lease.
    #[arg(long, default_value = "3s")]
    pub lease: Dur,
}
