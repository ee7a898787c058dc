//! [`SqlxBackend`]: what crates built on the outbox (the inbox, tools) need from a caller's own
//! sqlx pool and transaction, for each database, so that they name no backend crate.
//!
//! Applications hand the inbox a typed pool (`PgPool`, `SqlitePool`) and their handlers get a
//! typed `sqlx::Transaction`; everything the outbox does with those types that differs between
//! databases is here, beside [`Database`]. A new database is one more impl in this file.

use async_trait::async_trait;
use outbox_core::{Error, NewMessage, Result};
use outbox_mysql::MysqlStore;
use outbox_postgres::{PgStore, Schema};
use outbox_sqlite::{SqliteStore, Tables};
use sqlx::{MySql, Pool, Postgres, Sqlite};

use crate::backend::Backend;
use crate::database::Database;

/// A sqlx database type the outbox runs on: [`sqlx::Postgres`], [`sqlx::MySql`] or
/// [`sqlx::Sqlite`].
///
/// `place` arguments name one outbox table set in the database: the schema holding it on
/// PostgreSQL, the database holding it on MySQL, the prefix of its tables on SQLite (`outbox`, the application's; the inbox's
/// processing queue is another set). Both are validated (plain lower-case identifiers) before
/// anything is spliced into SQL.
#[async_trait]
pub trait SqlxBackend: sqlx::Database {
    /// Which backend this is.
    const BACKEND: Backend;

    /// A sqlx error as an outbox error whose kind tells retry (a lost connection) from fix
    /// (a missing table: run `outbox migrate`), with `context` saying what was being done.
    fn map_error(context: &str, err: sqlx::Error) -> Error;

    /// Begins a transaction that will write. On SQLite it begins `IMMEDIATE` (the file's write
    /// lock at once, so it never fails with `SQLITE_BUSY` half-way) and always ends as a
    /// `Transaction`, even if the caller is dropped while it begins.
    async fn begin_writing(
        pool: &Pool<Self>,
    ) -> std::result::Result<sqlx::Transaction<'static, Self>, sqlx::Error>;

    /// Adds `messages` to the outbox table set `place` inside `tx`, in one statement, keeping
    /// their order, through the backend's writer (the same ordering rule as
    /// [`crate::Transaction::enqueue_many`]).
    async fn enqueue_many(
        tx: &mut sqlx::Transaction<'_, Self>,
        place: &str,
        messages: &[NewMessage],
    ) -> Result<()>;

    /// The outbox table set `place` in the database `pool` connects to, as a [`Database`]
    /// sharing that pool.
    fn database(pool: Pool<Self>, place: &str) -> Result<Database>;

    /// A pool of at most `max_connections` to the database `url` names, set up as the outbox
    /// sets up its own (the backend's connect options; SQLite's WAL and busy timeout). Fails
    /// at once if the database cannot be reached.
    async fn connect_pool(url: &str, max_connections: u32) -> Result<Pool<Self>>;
}

#[async_trait]
impl SqlxBackend for Postgres {
    const BACKEND: Backend = Backend::Postgres;

    fn map_error(context: &str, err: sqlx::Error) -> Error {
        outbox_postgres::map_sqlx_error(context, err)
    }

    async fn begin_writing(
        pool: &Pool<Self>,
    ) -> std::result::Result<sqlx::Transaction<'static, Self>, sqlx::Error> {
        pool.begin().await
    }

    async fn enqueue_many(
        tx: &mut sqlx::Transaction<'_, Self>,
        place: &str,
        messages: &[NewMessage],
    ) -> Result<()> {
        outbox_postgres::Writer::new(&Schema::new(place)?)
            .enqueue_many(tx, messages)
            .await
    }

    fn database(pool: Pool<Self>, place: &str) -> Result<Database> {
        Ok(Database::Postgres(std::sync::Arc::new(PgStore::new(
            pool,
            Schema::new(place)?,
        ))))
    }

    async fn connect_pool(url: &str, max_connections: u32) -> Result<Pool<Self>> {
        outbox_postgres::connect_pool(url, max_connections).await
    }
}

#[async_trait]
impl SqlxBackend for Sqlite {
    const BACKEND: Backend = Backend::Sqlite;

    fn map_error(context: &str, err: sqlx::Error) -> Error {
        outbox_sqlite::map_sqlx_error(context, err)
    }

    async fn begin_writing(
        pool: &Pool<Self>,
    ) -> std::result::Result<sqlx::Transaction<'static, Self>, sqlx::Error> {
        outbox_sqlite::begin_immediate(pool).await
    }

    async fn enqueue_many(
        tx: &mut sqlx::Transaction<'_, Self>,
        place: &str,
        messages: &[NewMessage],
    ) -> Result<()> {
        outbox_sqlite::Writer::for_tables(&Tables::new(place)?)
            .enqueue_many(tx, messages)
            .await
    }

    fn database(pool: Pool<Self>, place: &str) -> Result<Database> {
        Ok(Database::Sqlite(std::sync::Arc::new(
            SqliteStore::with_tables(pool, Tables::new(place)?),
        )))
    }

    async fn connect_pool(url: &str, max_connections: u32) -> Result<Pool<Self>> {
        outbox_sqlite::connect_pool_sized(url, max_connections).await
    }
}

#[async_trait]
impl SqlxBackend for MySql {
    const BACKEND: Backend = Backend::Mysql;

    fn map_error(context: &str, err: sqlx::Error) -> Error {
        outbox_mysql::map_sqlx_error(context, err)
    }

    async fn begin_writing(
        pool: &Pool<Self>,
    ) -> std::result::Result<sqlx::Transaction<'static, Self>, sqlx::Error> {
        pool.begin().await
    }

    async fn enqueue_many(
        tx: &mut sqlx::Transaction<'_, Self>,
        place: &str,
        messages: &[NewMessage],
    ) -> Result<()> {
        outbox_mysql::enqueue_many(tx, &outbox_mysql::Schema::new(place)?, messages).await
    }

    fn database(pool: Pool<Self>, place: &str) -> Result<Database> {
        Ok(Database::Mysql(std::sync::Arc::new(MysqlStore::new(
            pool,
            outbox_mysql::Schema::new(place)?,
        ))))
    }

    async fn connect_pool(url: &str, max_connections: u32) -> Result<Pool<Self>> {
        outbox_mysql::connect_pool(url, max_connections).await
    }
}
