//! `outbox status`: the outbox's health at a glance, once or refreshed with `--watch`.

use std::io::{IsTerminal as _, Write as _};
use std::process::ExitCode;

use outbox_core::status::Report;
use outbox_core::RouteSpec;

use crate::cli::{Format, StatusArgs};
use crate::config::DbSettings;
use crate::view::status as view;

/// Prints the report once, or with `--watch` at every interval until SIGINT/SIGTERM (exit 0).
/// A failed read while watching is reported on stderr and the next refresh tries again.
pub async fn run(
    db: DbSettings,
    args: &StatusArgs,
    routes: &[RouteSpec],
) -> anyhow::Result<ExitCode> {
    let (store, place) = super::open_store(&db, args.inbox).await?;
    let title = format!("{:<20}{place}", if args.inbox { "inbox" } else { "outbox" });
    let show = |r: &Report| -> anyhow::Result<()> {
        let mut out = std::io::stdout().lock();
        let text = match (args.format, args.watch) {
            (Format::Json, _) => serde_json::to_string(r)? + "\n",
            (Format::Text, Some(every)) if out.is_terminal() => {
                view::screen(r, &title, args.inbox, every.0)
            }
            (Format::Text, _) => view::text(r, &title, args.inbox),
        };
        Ok(out.write_all(text.as_bytes()).and_then(|()| out.flush())?)
    };
    let Some(interval) = args.watch else {
        show(&Report::collect(&*store, routes).await?)?;
        return Ok(ExitCode::SUCCESS);
    };
    let stop = crate::shutdown::on_signal();
    while let Some(r) = stop
        .run_until_cancelled(Report::collect(&*store, routes))
        .await
    {
        match r {
            Ok(r) => show(&r)?,
            Err(e) => eprintln!(
                "error: {}",
                outbox_core::text::terminal(&outbox_core::redact::sanitize(&e.to_string()))
            ),
        }
        let _ = stop
            .run_until_cancelled(tokio::time::sleep(interval.0))
            .await;
    }
    Ok(ExitCode::SUCCESS)
}
