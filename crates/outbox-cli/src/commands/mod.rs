//! One module per subcommand.

mod backend;
mod bench;
mod checker;
mod demo;
mod migrate;
mod observer;
mod relay;
mod status;
mod verify;

use std::process::ExitCode;

pub use backend::Backend;

use crate::cli::{Cli, Command};
use crate::config;

/// Runs the parsed command line.
pub async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let loaded = config::load(cli.config.as_deref())?;
    match cli.command {
        Command::Migrate(args) => migrate::run(config::db(&loaded, &args)?).await,
        Command::Relay(args) => relay::run(config::relay(&loaded, &args)?, args.print_config).await,
        Command::Status(args) => status::run(config::db(&loaded, &args.db)?, args.format).await,
        Command::Bench(args) => bench::run(args).await,
        Command::Demo(args) => demo::run(args).await,
        Command::Verify(args) => verify::run(args).await,
    }
}
