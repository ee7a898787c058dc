//! `outbox migrate`: create or upgrade the outbox tables.

use std::process::ExitCode;

use crate::config::DbSettings;

pub async fn run(db: DbSettings) -> anyhow::Result<ExitCode> {
    let store = super::open_store(&db, 2).await?;
    let applied = outbox_postgres::migrate(store.pool(), store.schema()).await?;
    if applied.is_empty() {
        println!("schema `{}` is up to date", db.schema);
    } else {
        println!("schema `{}`: applied migrations {applied:?}", db.schema);
    }
    Ok(ExitCode::SUCCESS)
}
