//! Creating and upgrading the inbox tables and its processing queue, idempotently.

use outbox_core::Result;
use outbox_postgres::map_sqlx_error;
use sqlx::{PgPool, SqlitePool};

use crate::tables::InboxSchema;

/// PostgreSQL inbox migrations, in order: (version, name, SQL with `{schema}` and `{queue}`).
pub const POSTGRES_MIGRATIONS: &[(i32, &str, &str)] = &[(
    1,
    "inbox",
    include_str!("../migrations/postgres/0001_inbox.sql"),
)];

/// SQLite inbox migrations, in order: (version, name, SQL).
pub const SQLITE_MIGRATIONS: &[(i32, &str, &str)] = &[(
    1,
    "inbox",
    include_str!("../migrations/sqlite/0001_inbox.sql"),
)];

/// Creates or upgrades a PostgreSQL inbox: first the processing queue (the outbox migrations
/// in `schema.queue()`), then the inbox tables in `schema.tables()`, in one transaction
/// serialised by an advisory lock. Safe to run concurrently and repeatedly. Returns the inbox
/// versions applied now.
pub async fn migrate_postgres(pool: &PgPool, schema: &InboxSchema) -> Result<Vec<i32>> {
    outbox_postgres::migrate(pool, schema.queue()).await?;
    let ctx = |what: &str| {
        format!(
            "migrating the inbox in schema `{}`: {what}",
            schema.tables().as_str()
        )
    };
    let mut tx = pool
        .begin()
        .await
        .map_err(|e| map_sqlx_error(&ctx("begin"), e))?;
    // Like the outbox's migration: no statement timeout for an upgrade.
    sqlx::raw_sql("SET LOCAL statement_timeout = 0")
        .execute(&mut *tx)
        .await
        .map_err(|e| map_sqlx_error(&ctx("settings"), e))?;
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext($1))")
        .bind(format!("outbox-inbox-migrate:{}", schema.tables().as_str()))
        .execute(&mut *tx)
        .await
        .map_err(|e| map_sqlx_error(&ctx("lock"), e))?;
    let applied = outbox_postgres::apply_pending(
        &mut tx,
        schema.tables(),
        "inbox_migrations",
        POSTGRES_MIGRATIONS,
        |sql| schema.render(sql),
        &ctx,
    )
    .await?;
    tx.commit()
        .await
        .map_err(|e| map_sqlx_error(&ctx("commit"), e))?;
    Ok(applied)
}

/// Creates or upgrades a SQLite inbox in the file `pool` opened: the processing queue (the
/// outbox tables under the `inbox_queue` prefix) and the inbox tables, in one `BEGIN IMMEDIATE`
/// transaction each. Safe to run concurrently and repeatedly. Returns the inbox versions
/// applied now.
pub async fn migrate_sqlite(pool: &SqlitePool) -> Result<Vec<i32>> {
    outbox_sqlite::migrate_tables(pool, &crate::sqlite::queue_tables()).await?;
    let ctx = |what: &str| format!("migrating the SQLite inbox: {what}");
    let err = |what: &str, e| outbox_sqlite::map_sqlx_error(&ctx(what), e);
    let mut tx = outbox_sqlite::begin_immediate(pool)
        .await
        .map_err(|e| err("begin", e))?;
    let applied = outbox_sqlite::apply_pending(
        &mut tx,
        "inbox_migrations",
        SQLITE_MIGRATIONS,
        str::to_string,
        &ctx,
    )
    .await?;
    tx.commit().await.map_err(|e| err("commit", e))?;
    Ok(applied)
}
