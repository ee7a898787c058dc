//! `outbox migrate`: create or upgrade the outbox tables.

use std::process::ExitCode;

use crate::config::DbSettings;

/// Applies the migrations, then installs or removes the NOTIFY doorbell when asked.
pub async fn run(db: DbSettings, notify: Option<bool>) -> anyhow::Result<ExitCode> {
    let backend = super::Backend::open(&db, 2).await?;
    let applied = backend.migrate().await?;
    let place = backend.place(&db);
    if applied.is_empty() {
        println!("{place} is up to date");
    } else {
        println!("{place}: applied migrations {applied:?}");
    }
    if let Some(on) = notify {
        match &backend {
            super::Backend::Postgres(s) => {
                outbox_postgres::set_notify(s.pool(), s.schema(), on).await?;
                println!(
                    "{place}: NOTIFY doorbell {}",
                    if on {
                        "installed (run relays with --listen)"
                    } else {
                        "removed"
                    }
                );
            }
            super::Backend::Sqlite(_) => {
                anyhow::bail!("--notify and --no-notify apply to PostgreSQL only")
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
