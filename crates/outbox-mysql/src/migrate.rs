//! Creating and upgrading the outbox tables in a MySQL database, idempotently.

use outbox_core::{Error, ErrorKind, Result};
use sqlx::MySqlPool;

use crate::error::map_sqlx_error;
use crate::schema::Schema;

/// The outbox migrations, in order: (version, name, SQL with `{schema}`).
pub const MIGRATIONS: &[(i32, &str, &str)] =
    &[(1, "outbox", include_str!("../migrations/0001_outbox.sql"))];

/// The schema version this crate's writer needs: the last of [`MIGRATIONS`].
pub const SCHEMA_VERSION: i32 = 1;

/// How long a migrator waits for another one to finish.
const LOCK_WAIT_SECS: i64 = 60;

/// Creates the database `schema` if it is missing, then applies the migrations it lacks, in
/// order, recording each in `outbox_migrations`. Returns the versions applied now (empty when
/// up to date).
///
/// Safe to run concurrently and repeatedly: migrators take `GET_LOCK` on the database's name
/// on a connection of their own, which is closed afterwards, so the lock never outlives the
/// run, even when it fails. MySQL commits each DDL statement as it goes, so a version is
/// recorded after its statements ran; one interrupted half-way is run again whole, which every
/// migration is written to allow (`IF NOT EXISTS`, `INSERT IGNORE`, `DROP … IF EXISTS`).
pub async fn migrate(pool: &MySqlPool, schema: &Schema) -> Result<Vec<i32>> {
    let ctx = |what: &str| {
        format!(
            "migrating the outbox in database `{}`: {what}",
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
    let got: Option<i64> =
        sqlx::query_scalar("SELECT GET_LOCK(CONCAT('outbox-migrate:', SHA1(?)), ?)")
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
    sqlx::raw_sql(&schema.render(
        "CREATE DATABASE IF NOT EXISTS {schema} CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
         CREATE TABLE IF NOT EXISTS {schema}.outbox_migrations (
             version    INT          NOT NULL PRIMARY KEY,
             name       VARCHAR(255) NOT NULL,
             applied_at DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6))
         ) ENGINE = InnoDB;",
    ))
    .execute(&mut *conn)
    .await
    .map_err(|e| map_sqlx_error(&ctx("creating the database"), e))?;
    let done: Vec<i32> =
        sqlx::query_scalar(&schema.render("SELECT version FROM {schema}.outbox_migrations"))
            .fetch_all(&mut *conn)
            .await
            .map_err(|e| map_sqlx_error(&ctx("reading applied versions"), e))?;
    let mut applied = Vec::new();
    for (version, name, sql) in MIGRATIONS {
        if done.contains(version) {
            continue;
        }
        sqlx::raw_sql(&schema.render(sql))
            .execute(&mut *conn)
            .await
            .map_err(|e| map_sqlx_error(&ctx(&format!("applying {version} {name}")), e))?;
        sqlx::query(
            &schema.render("INSERT INTO {schema}.outbox_migrations (version, name) VALUES (?, ?)"),
        )
        .bind(version)
        .bind(name)
        .execute(&mut *conn)
        .await
        .map_err(|e| map_sqlx_error(&ctx("recording the version"), e))?;
        applied.push(*version);
    }
    Ok(applied)
}
