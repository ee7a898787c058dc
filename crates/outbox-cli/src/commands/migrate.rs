//! `outbox migrate`: create or upgrade the outbox tables.

use std::process::ExitCode;

use crate::config::DbSettings;

/// Applies the migrations, then installs or removes the NOTIFY doorbell when asked.
pub async fn run(db: DbSettings, notify: Option<bool>) -> anyhow::Result<ExitCode> {
    let database = outbox_db::open(&db.url, &db.schema, 2).await?;
    let applied = database.migrate().await?;
    let place = database.place();
    if applied.is_empty() {
        println!("{place} is up to date");
    } else {
        println!("{place}: applied migrations {applied:?}");
    }
    if let Some(on) = notify {
        database.set_notify(on).await?;
        let what = if on {
            "installed (run relays with --listen)"
        } else {
            "removed"
        };
        println!("{place}: NOTIFY doorbell {what}");
    }
    Ok(ExitCode::SUCCESS)
}

/// Creates or upgrades the inbox tables and its processing queue.
pub async fn inbox(db: DbSettings) -> anyhow::Result<ExitCode> {
    let inbox = outbox_inbox::InboxDatabase::open(&db.url, &db.schema, 2).await?;
    let applied = inbox.migrate().await?;
    let place = inbox.place();
    if applied.is_empty() {
        println!("{place} is up to date");
    } else {
        println!("{place}: applied migrations {applied:?}");
    }
    Ok(ExitCode::SUCCESS)
}
