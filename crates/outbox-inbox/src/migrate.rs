//! The inbox's migrations, and creating or upgrading its tables and processing queue from a
//! pool the application already has (see [`crate::InboxDatabase::migrate`]).

use outbox_core::Result;
use sqlx::{MySqlPool, PgPool, SqlitePool};

use crate::tables::InboxSchema;
use crate::InboxDatabase;

/// PostgreSQL inbox migrations, in order: (version, name, SQL with `{schema}` and `{queue}`).
pub const POSTGRES_MIGRATIONS: &[(i32, &str, &str)] = &[(
    1,
    "inbox",
    include_str!("../migrations/postgres/0001_inbox.sql"),
)];

/// MySQL/MariaDB inbox migrations, in order: (version, name, SQL with `{schema}` and `{queue}`,
/// the databases of the tables and of the queue). DDL commits as it goes on MySQL: each can
/// be run again whole.
pub const MYSQL_MIGRATIONS: &[(i32, &str, &str)] = &[(
    1,
    "inbox",
    include_str!("../migrations/mysql/0001_inbox.sql"),
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
    InboxDatabase::from_pool(pool.clone(), schema.clone())?
        .migrate()
        .await
}

/// Creates or upgrades a SQLite inbox in the file `pool` opened: the processing queue (the
/// outbox tables under the `inbox_queue` prefix) and the inbox tables, in one `BEGIN IMMEDIATE`
/// transaction each. Safe to run concurrently and repeatedly. Returns the inbox versions
/// applied now.
pub async fn migrate_sqlite(pool: &SqlitePool) -> Result<Vec<i32>> {
    InboxDatabase::from_pool(pool.clone(), InboxSchema::default())?
        .migrate()
        .await
}

/// Creates or upgrades a MySQL/MariaDB inbox: first the processing queue (the outbox
/// migrations in database `schema.queue()`, created if missing), then the inbox tables in
/// database `schema.tables()`, serialised against other migrators by `GET_LOCK`. Safe to run
/// concurrently and repeatedly. Returns the inbox versions applied now.
pub async fn migrate_mysql(pool: &MySqlPool, schema: &InboxSchema) -> Result<Vec<i32>> {
    InboxDatabase::from_pool(pool.clone(), schema.clone())?
        .migrate()
        .await
}
