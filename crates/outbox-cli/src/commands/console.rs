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
    options.validate().map_err(crate::config::ConfigError)?;
    let (store, place) = super::open_store(&db, false).await?;
    // Bound before anything else starts: an address in use is reported at once, with it.
    let bound = outbox_console::bind(options.listen).await?;
    // The inbox's pages only where its tables are: reading its counts tells. Looked for again
    // while it is missing, so `outbox migrate --inbox` needs no console restart.
    let opener: outbox_console::InboxOpener = Box::new(move || {
        let db = db.clone();
        Box::pin(async move { open_inbox(&db).await })
    });
    let inbox = opener().await;
    let stop = crate::shutdown::on_signal_saying("shutdown requested: the console stops serving");
    let console = Console::with_inbox_opener(
        Side { store, place },
        inbox,
        opener,
        routes,
        &options,
        &stop,
    );
    outbox_console::serve(bound, console, stop).await;
    Ok(ExitCode::SUCCESS)
}

/// The inbox's side, or why there is none (yet) and what creates it.
async fn open_inbox(db: &DbSettings) -> Result<Side, String> {
    match super::open_store(db, true).await {
        Ok((store, place)) => match store.stats().await {
            Ok(_) => Ok(Side { store, place }),
            Err(e) => Err(outbox_console::no_inbox_yet(&e)),
        },
        Err(e) => Err(outbox_console::no_inbox_yet(&e)),
    }
}
