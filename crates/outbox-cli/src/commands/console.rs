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
    // The inbox's pages only where its tables are: reading its counts tells.
    let inbox = match super::open_store(&db, true).await {
        Ok((store, place)) => match store.stats().await {
            Ok(_) => Ok(Side { store, place }),
            Err(e) => Err(format!(
                "No inbox here ({e}); `outbox migrate --inbox` creates it."
            )),
        },
        Err(e) => Err(format!(
            "No inbox here ({e}); `outbox migrate --inbox` creates it."
        )),
    };
    let stop = crate::shutdown::on_signal();
    let console = Console::new(Side { store, place }, inbox, routes, &options, &stop);
    outbox_console::run(console, &options, stop).await?;
    Ok(ExitCode::SUCCESS)
}
