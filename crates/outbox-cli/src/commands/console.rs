//! `outbox console`: the web console over the outbox and, when its tables are there, the inbox
//! in the same database; until SIGINT/SIGTERM.

use std::process::ExitCode;

use outbox_console::{Console, Options, Side};
use outbox_core::RouteSpec;

use crate::config::DbSettings;

pub async fn run(
    db: DbSettings,
    routes: Vec<RouteSpec>,
    options: Options,
) -> anyhow::Result<ExitCode> {
    options.validate().map_err(anyhow::Error::msg)?;
    let (store, place) = super::open_store(&db, false).await?;
    let inbox = match super::open_store(&db, true).await {
        Ok((store, place)) => Ok(Side { store, place }),
        Err(e) => Err(format!(
            "No inbox in this database: {e}. Create it with `outbox migrate --inbox`."
        )),
    };
    let stop = crate::shutdown::on_signal();
    let console = Console::new(Side { store, place }, inbox, routes, &options, &stop);
    outbox_console::run(console, &options, stop).await?;
    Ok(ExitCode::SUCCESS)
}
