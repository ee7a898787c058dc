//! Creating and upgrading the outbox tables in a MySQL database, idempotently.

use outbox_core::{Error, ErrorKind, Result};
use sqlx::MySqlPool;

use crate::error::map_sqlx_error;
use crate::schema::Schema;

/// The outbox migrations, in order: (version, name, SQL with `{schema}`).
pub const MIGRATIONS: &[(i32, &str, &str)] = &[
    (1, "outbox", include_str!("../migrations/0001_outbox.sql")),
    (2, "relay", include_str!("../migrations/0002_relay.sql")),
    (3, "ranges", include_str!("../migrations/0003_ranges.sql")),
    (4, "checks", include_str!("../migrations/0004_checks.sql")),
];

/// The schema version this crate's writer and store need: the last of [`MIGRATIONS`].
pub const SCHEMA_VERSION: i32 = 4;

/// How long a migrator waits for another one to finish.
const LOCK_WAIT_SECS: i64 = 60;

/// Creates the database `schema` if it is missing, then applies the migrations it lacks, in
/// order, recording each in `outbox_migrations`, and makes the message table's ranges ahead of
/// the writers ([`crate::ranges::lay_ahead`]). Returns the versions applied now (empty when up
/// to date).
///
/// Safe to run concurrently and repeatedly: migrators take `GET_LOCK` on the database's name
/// on a connection of their own, which is closed afterwards, so the lock never outlives the
/// run, even when it fails. MySQL commits each DDL statement as it goes, so a version is
/// recorded after its statements ran; one interrupted half-way is run again whole, which every
/// migration is written to allow (`IF NOT EXISTS`, `INSERT IGNORE`, `DROP … IF EXISTS`).
pub async fn migrate(pool: &MySqlPool, schema: &Schema) -> Result<Vec<i32>> {
    let applied = apply_migrations(
        pool,
        schema,
        "outbox_migrations",
        "outbox-migrate",
        MIGRATIONS,
        &|sql| schema.render(sql),
    )
    .await?;
    // The binlog route's own table, when it is on, gains what this version reads.
    crate::binlog::route::upgrade(pool, schema).await?;
    // Ranges ready before the first writer, so none lands in the catch-all.
    crate::ranges::lay_ahead(pool, schema).await?;
    Ok(applied)
}

/// Creates database `schema` if missing and applies the `migrations` its `ledger` table does
/// not list, in order, under `GET_LOCK(lock + the database's name)` held by a connection of
/// its own (closed afterwards, so the lock never outlives the run). `render` turns each
/// migration's text into SQL (at least `{schema}`). Returns the versions applied now. MySQL
/// commits DDL as it goes: a version is recorded after its statements ran, and one interrupted
/// half-way runs again whole, so every migration must be written to allow that.
pub async fn apply_migrations(
    pool: &MySqlPool,
    schema: &Schema,
    ledger: &str,
    lock: &str,
    migrations: &[(i32, &str, &str)],
    render: &(dyn Fn(&str) -> String + Sync),
) -> Result<Vec<i32>> {
    let ctx = |what: &str| {
        format!(
            "migrating `{ledger}` in database `{}`: {what}",
            schema.as_str()
        )
    };
    let mut conn = pool
        .acquire()
        .await
        .map_err(|e| map_sqlx_error(&ctx("connecting"), e))?;
    // The lock is the connection's: closing it (not returning it to the pool) releases it.
    conn.close_on_drop();
    // A lock name has at most 64 characters: the database's name goes in hashed.
    let got: Option<i64> = sqlx::query_scalar(include_str!("../queries/migrate_lock.sql"))
        .bind(lock)
        .bind(schema.as_str())
        .bind(LOCK_WAIT_SECS)
        .fetch_one(&mut *conn)
        .await
        .map_err(|e| map_sqlx_error(&ctx("waiting for other migrators"), e))?;
    if got != Some(1) {
        return Err(Error::new(
            ErrorKind::Timeout,
            ctx(&format!(
                "another migrator held the lock for {LOCK_WAIT_SECS} s; run it again once that one finished"
            )),
        ));
    }
    // `ledger` is a fixed table name of the caller's, never user input.
    let with_ledger = |sql: &str| schema.render(&sql.replace("{ledger}", ledger));
    sqlx::raw_sql(&with_ledger(include_str!(
        "../queries/migrations_ledger.sql"
    )))
    .execute(&mut *conn)
    .await
    .map_err(|e| map_sqlx_error(&ctx("creating the database"), e))?;
    let done: Vec<i32> = sqlx::query_scalar(&with_ledger(include_str!(
        "../queries/migrations_applied.sql"
    )))
    .fetch_all(&mut *conn)
    .await
    .map_err(|e| map_sqlx_error(&ctx("reading applied versions"), e))?;
    let mut applied = Vec::new();
    for (version, name, sql) in migrations {
        if done.contains(version) {
            continue;
        }
        sqlx::raw_sql(&render(sql))
            .execute(&mut *conn)
            .await
            .map_err(|e| map_sqlx_error(&ctx(&format!("applying {version} {name}")), e))?;
        sqlx::query(&with_ledger(include_str!(
            "../queries/migrations_record.sql"
        )))
        .bind(version)
        .bind(name)
        .execute(&mut *conn)
        .await
        .map_err(|e| map_sqlx_error(&ctx("recording the version"), e))?;
        applied.push(*version);
    }
    Ok(applied)
}

/// Checks that database `schema` holds the outbox tables at [`SCHEMA_VERSION`]. The error says
/// what to do: run `outbox migrate`, or the newer relay.
pub async fn check_schema(pool: &MySqlPool, schema: &Schema) -> Result<()> {
    let name = schema.as_str();
    let ctx = format!("checking database `{name}`");
    let ledger: i64 = sqlx::query_scalar(include_str!("../queries/migrations_table_exists.sql"))
        .bind(name)
        .fetch_one(pool)
        .await
        .map_err(|e| map_sqlx_error(&ctx, e))?;
    if ledger == 0 {
        return Err(Error::new(
            ErrorKind::Schema,
            format!(
                "database `{name}` has no outbox tables: run outbox migrate with this database URL"
            ),
        ));
    }
    let version: Option<i32> =
        sqlx::query_scalar(&schema.render(include_str!("../queries/schema_version.sql")))
            .fetch_one(pool)
            .await
            .map_err(|e| map_sqlx_error(&ctx, e))?;
    match version.unwrap_or(0) {
        v if v < SCHEMA_VERSION => Err(Error::new(
            ErrorKind::Schema,
            format!(
                "database `{name}` holds outbox tables of version {v}; this relay needs version \
                 {SCHEMA_VERSION}: run outbox migrate with this database URL"
            ),
        )),
        v if v > SCHEMA_VERSION => Err(Error::new(
            ErrorKind::Schema,
            format!(
                "database `{name}` holds outbox tables of version {v}, newer than this relay \
                 knows ({SCHEMA_VERSION}): run the newer relay"
            ),
        )),
        _ => Ok(()),
    }
}
