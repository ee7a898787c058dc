//! `outbox maintain` and `outbox purge`: storage housekeeping on demand.

use std::process::ExitCode;
use std::time::Duration;

use crate::config::DbSettings;

/// Segments ahead of the writers, and retention, once.
pub async fn maintain(db: DbSettings, retention: Duration) -> anyhow::Result<ExitCode> {
    let database = outbox_db::open(&db.url, &db.schema, 2).await?;
    database.check().await?;
    let m = database.store().maintain(retention).await?;
    println!("{}", serde_json::to_string(&m)?);
    Ok(ExitCode::SUCCESS)
}

/// Drops storage every relay has passed, closed longer ago than `older_than`.
pub async fn purge(db: DbSettings, older_than: Duration) -> anyhow::Result<ExitCode> {
    let database = outbox_db::open(&db.url, &db.schema, 2).await?;
    database.check().await?;
    let m = database.purge(older_than).await?;
    println!("{}", serde_json::to_string(&m)?);
    Ok(ExitCode::SUCCESS)
}
