//! `outbox demo`'s flags, next to what they configure: the binary parses them (`clap`) and
//! hands them over; [`Args::options`] turns them into the library's [`Options`].

use std::time::Duration;

use outbox_core::options::Dur;

use crate::Options;

/// `outbox demo` options.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Database (default sqlite://<dir>/payments.db, recreated). A postgres:// URL uses the
    /// schema `outbox_demo`, a mysql:// or mariadb:// URL the database `outbox_demo` (dropped
    /// and recreated), unless --schema is given.
    #[arg(long, value_name = "URL")]
    pub database_url: Option<String>,
    /// Schema for a PostgreSQL demo, database for a MySQL one (default outbox_demo; dropped and
    /// recreated, so it must be named outbox_demo…).
    #[arg(long, value_name = "NAME")]
    pub schema: Option<String>,
    /// Broker (default file:<dir>/events.jsonl, recreated). nats://host:port uses a stream of
    /// its own, deleted at the end.
    #[arg(long, value_name = "URL")]
    pub sink: Option<String>,
    /// Folder for the demo's files.
    #[arg(long, value_name = "PATH", default_value = "outbox-demo")]
    pub dir: std::path::PathBuf,
    /// Seconds the broker stays away in the outage scene.
    #[arg(long, default_value_t = 5)]
    pub outage_seconds: u64,
    /// Partition lease of the demo relays: how long the crashed relay's work waits.
    #[arg(long, default_value = "2s")]
    pub lease: Dur,
}

impl Args {
    /// The options these flags name.
    pub fn options(self) -> Options {
        Options {
            dir: self.dir,
            database_url: self.database_url,
            schema: self.schema,
            sink_url: self.sink,
            outage: Duration::from_secs(self.outage_seconds),
            lease: self.lease.0,
        }
    }
}
