//! One module per subcommand.

mod bench;
mod migrate;
mod naive;
mod relay;
mod status;

use std::process::ExitCode;

use outbox_core::{Error, ErrorKind};
use outbox_postgres::{connect_pool, PgStore, Schema};

use crate::cli::{Cli, Command};
use crate::config::{self, DbSettings};

/// Runs the parsed command line.
pub async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let loaded = config::load(cli.config.as_deref())?;
    match cli.command {
        Command::Migrate(args) => migrate::run(config::db(&loaded, &args)?).await,
        Command::Relay(args) => relay::run(config::relay(&loaded, &args)?).await,
        Command::Status(args) => status::run(config::db(&loaded, &args.db)?, args.format).await,
        Command::Bench(args) => bench::run(args).await,
    }
}

/// Opens the store a database URL names. Only PostgreSQL is in this build.
pub async fn open_store(db: &DbSettings, pool_size: u32) -> Result<PgStore, Error> {
    let scheme = db.url.split_once("://").map(|(s, _)| s).unwrap_or("");
    match scheme {
        "postgres" | "postgresql" => {
            let schema = Schema::new(&db.schema)?;
            let pool = connect_pool(&db.url, pool_size).await?;
            Ok(PgStore::new(pool, schema))
        }
        _ => Err(Error::new(
            ErrorKind::Config,
            format!(
                "database URL `{}`: unsupported scheme `{scheme}`; this build supports postgres://",
                outbox_core::redact::url(&db.url)
            ),
        )),
    }
}
