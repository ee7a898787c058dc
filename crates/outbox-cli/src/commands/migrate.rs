//! `outbox migrate`: create or upgrade the outbox tables.

use std::process::ExitCode;

use crate::config::DbSettings;

pub async fn run(db: DbSettings) -> anyhow::Result<ExitCode> {
    let database = outbox_db::open(&db.url, &db.schema, 2).await?;
    let applied = database.migrate().await?;
    let place = database.place();
    if applied.is_empty() {
        println!("{place} is up to date");
    } else {
        println!("{place}: applied migrations {applied:?}");
    }
    Ok(ExitCode::SUCCESS)
}
