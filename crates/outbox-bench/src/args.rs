//! `outbox bench`'s flags, next to what they configure: the binary parses them (`clap`) and
//! hands them over; [`Args::options`] resolves them, with `DATABASE_URL` and `OUTBOX_SINK`, into
//! the library's [`Options`].

use outbox_core::options::Dur;

use crate::{Mode, Options, Storage};

/// Output of `outbox bench`: the text report, or that and the figures as one JSON object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// The text report only.
    Text,
    /// The text report, then the figures as one JSON object.
    Json,
}

/// `outbox bench` options.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Database URL (default postgres://root@127.0.0.1:5432/test). Env: DATABASE_URL. A
    /// mysql:// or mariadb:// URL runs the backlog, writers, steady and idle-tx modes on
    /// MySQL/MariaDB, in scratch databases of their own.
    #[arg(long, value_name = "URL")]
    pub database_url: Option<String>,
    /// The sink to measure (default: NATS, see --nats). Any sink URL `outbox relay` takes works
    /// in backlog mode, where it is drained side by side with NATS in the same run; the other
    /// modes measure NATS only. Env: OUTBOX_SINK.
    #[arg(long, value_name = "URL")]
    pub sink: Option<String>,
    /// The NATS server of the baseline runs (default nats://127.0.0.1:4222).
    #[arg(long, value_name = "URL")]
    pub nats: Option<String>,
    /// Which measurement.
    #[arg(long, value_enum, default_value_t = Mode::Backlog)]
    pub mode: Mode,
    /// Backlog size for the relay.
    #[arg(long, default_value_t = 100_000)]
    pub rows: usize,
    /// Backlog size for the naive relay (it is slow; default min(rows, 20000); inbox mode:
    /// messages for the naive consumers, default min(rows, 5000)).
    #[arg(long)]
    pub naive_rows: Option<usize>,
    /// Distinct ordering keys. Backlog mode takes a comma list (e.g. 1,10,1000) and runs once
    /// per value; other modes take one value.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "1000",
        value_name = "N[,N...]"
    )]
    pub keys: Vec<usize>,
    /// Backlog mode: skip the ANALYZE after filling (production tables have statistics, so
    /// the default runs it).
    #[arg(long)]
    pub no_analyze: bool,
    /// Payload size in bytes.
    #[arg(long, default_value_t = 200)]
    pub payload_bytes: usize,
    /// Relay workers.
    #[arg(long, default_value_t = 2)]
    pub workers: usize,
    /// Rows per claim.
    #[arg(long, default_value_t = 1000)]
    pub batch_size: usize,
    /// Steady and idle-tx modes: events per second, one row per transaction.
    #[arg(long, default_value_t = 1000)]
    pub rate: u32,
    /// How long to measure: steady (default 20s), writers (each variant, default 20s),
    /// idle-tx (each of its two runs, default 10m), idle (default 30s).
    #[arg(long, value_name = "DURATION")]
    pub duration: Option<Dur>,
    /// Steady and idle-tx modes: producer connections.
    #[arg(long, default_value_t = 16)]
    pub producers: usize,
    /// Writers mode: client connections, each running transactions back to back.
    #[arg(long, default_value_t = 16)]
    pub clients: usize,
    /// Writers mode: rows of the pgbench-like accounts table.
    #[arg(long, default_value_t = 100_000)]
    pub accounts: usize,
    /// Let the relay wake on LISTEN/NOTIFY (opt-in; by default it polls).
    #[arg(long)]
    pub listen: bool,
    /// MySQL/MariaDB: run the binlog route (`outbox migrate --binlog`): writers' inserts run no
    /// trigger and the relay's sequencer positions rows from the binlog. Needs a server with the
    /// row binlog (scripts/services.sh starts one on 127.0.0.1:3307).
    #[arg(long)]
    pub binlog: bool,
    /// Accepted for old scripts: polling is now the default.
    #[arg(long, hide = true, conflicts_with = "listen")]
    pub no_listen: bool,
    /// Relays claim each batch only after the one before it is recorded (see `outbox relay
    /// --no-read-ahead`): the baseline the read ahead is measured against.
    #[arg(long)]
    pub no_read_ahead: bool,
    /// The relay's poll interval (default: the relay's own default).
    #[arg(long, value_name = "DURATION")]
    pub poll_interval: Option<Dur>,
    /// JetStream storage of the bench stream: file or memory.
    #[arg(long, default_value = "file", value_parser = ["file", "memory"])]
    pub storage: String,
    /// Skip the naive relay (backlog mode).
    #[arg(long)]
    pub skip_naive: bool,
    /// CDC mode: how long the idle CDC relay is watched for statements and CPU.
    #[arg(long, value_name = "DURATION", default_value = "10s")]
    pub idle: Dur,
    /// CDC mode: leave out the writers comparison (emit, the outbox table, the naive table).
    #[arg(long)]
    pub skip_writers: bool,
    /// Print the results as one JSON object as well.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
}

impl Args {
    /// The options these flags (and `DATABASE_URL`, `OUTBOX_SINK`) name.
    pub fn options(self) -> Options {
        let database_url = self
            .database_url
            .or_else(|| std::env::var("DATABASE_URL").ok())
            .unwrap_or_else(|| crate::DEFAULT_DATABASE_URL.into());
        let sink = self.sink.or_else(|| std::env::var("OUTBOX_SINK").ok());
        let (nats_url, sink_url) = crate::split_sink(sink, self.nats);
        Options {
            mode: self.mode,
            database_url,
            nats_url,
            sink_url,
            rows: self.rows,
            naive_rows: self.naive_rows,
            keys: self.keys,
            analyze: !self.no_analyze,
            payload_bytes: self.payload_bytes,
            workers: self.workers,
            batch_size: self.batch_size,
            rate: self.rate,
            duration: self.duration.map(|d| d.0),
            producers: self.producers,
            clients: self.clients,
            accounts: self.accounts,
            listen: self.listen,
            binlog: self.binlog,
            read_ahead: !self.no_read_ahead,
            poll_interval: self.poll_interval.map(|d| d.0),
            storage: if self.storage == "memory" {
                Storage::Memory
            } else {
                Storage::File
            },
            naive: !self.skip_naive,
            idle: self.idle.0,
            writers: !self.skip_writers,
            json: self.format == Format::Json,
        }
    }
}
