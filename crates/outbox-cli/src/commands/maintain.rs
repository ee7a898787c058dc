//! `outbox maintain` and `outbox purge`: storage housekeeping on demand.

use std::process::ExitCode;
use std::time::Duration;

use crate::config::DbSettings;

/// Segments ahead of the writers, and retention, once.
pub async fn maintain(db: DbSettings, retention: Duration) -> anyhow::Result<ExitCode> {
    let backend = super::Backend::open(&db, 2).await?;
    let m = backend.store().maintain(retention).await?;
    println!("{}", serde_json::to_string(&m)?);
    Ok(ExitCode::SUCCESS)
}

/// Drops storage every relay has passed, closed longer ago than `older_than`.
pub async fn purge(db: DbSettings, older_than: Duration) -> anyhow::Result<ExitCode> {
    let backend = super::Backend::open(&db, 2).await?;
    let m = match &backend {
        super::Backend::Postgres(s) => s.purge(older_than).await?,
        super::Backend::Sqlite(s) => outbox_core::Store::maintain(s, older_than).await?,
    };
    println!("{}", serde_json::to_string(&m)?);
    Ok(ExitCode::SUCCESS)
}
