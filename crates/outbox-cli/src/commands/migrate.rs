//! `outbox migrate`: create or upgrade the outbox tables.

use std::process::ExitCode;

use crate::config::DbSettings;

pub async fn run(db: DbSettings) -> anyhow::Result<ExitCode> {
    let backend = super::Backend::open(&db, 2).await?;
    let applied = backend.migrate().await?;
    let place = backend.place(&db);
    if applied.is_empty() {
        println!("{place} is up to date");
    } else {
        println!("{place}: applied migrations {applied:?}");
    }
    Ok(ExitCode::SUCCESS)
}
