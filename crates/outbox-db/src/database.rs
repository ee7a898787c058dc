//! [`Database`]: an opened outbox database, whichever backend its URL named.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use outbox_core::{Error, Result, Store};
use outbox_mysql::MysqlStore;
use outbox_postgres::{PgStore, Schema};
use outbox_sqlite::SqliteStore;

use crate::backend::Backend;
use crate::sql::{self, Param, Row};
use crate::transaction::Transaction;

/// PostgreSQL's default schema: shared by everything in the database, never destroyed.
const PUBLIC: &str = "public";

/// Opens the database `url` names, with at most `pool_size` connections.
///
/// `schema` is the PostgreSQL schema holding the outbox tables; it is validated (a plain
/// lower-case identifier) before anything connects. On MySQL it names the database holding
/// them, and `public` (PostgreSQL's default, which no MySQL user means) stands for the database
/// the URL names. SQLite has no schemas: the outbox is the file, and `schema` is ignored. Nothing is created but an empty SQLite file; call
/// [`Database::migrate`] for the tables.
///
/// Errors are [`outbox_core::Error`]s whose text never contains the URL's password:
/// [`Config`](outbox_core::ErrorKind::Config) for an unsupported scheme (naming the URL and the
/// accepted schemes), a bad schema name or a file that cannot be opened;
/// a transient error ([`Connection`](outbox_core::ErrorKind::Connection), or
/// [`Timeout`](outbox_core::ErrorKind::Timeout) after ten seconds of retries) when the server
/// cannot be reached.
pub async fn open(url: &str, schema: &str, pool_size: u32) -> Result<Database> {
    open_with_deadline(
        url,
        schema,
        pool_size,
        outbox_postgres::DEFAULT_STORE_DEADLINE,
    )
    .await
}

/// [`open`] for a relay that abandons a store call after `store_deadline`: statements the
/// server runs for it time out before that (PostgreSQL's `statement_timeout`, see
/// [`outbox_postgres::statement_timeout_for`]), so an abandoned write cannot land after its
/// retry.
pub async fn open_with_deadline(
    url: &str,
    schema: &str,
    pool_size: u32,
    store_deadline: Duration,
) -> Result<Database> {
    let pool_size = pool_size.max(1);
    match Backend::of(url)? {
        Backend::Postgres => {
            let schema = Schema::new(schema)?;
            let pool = outbox_postgres::connect_pool_with(url, pool_size, store_deadline).await?;
            Ok(Database::Postgres(Arc::new(PgStore::new(pool, schema))))
        }
        Backend::Sqlite => {
            let pool = outbox_sqlite::connect_pool_sized(url, pool_size).await?;
            Ok(Database::Sqlite(Arc::new(SqliteStore::new(pool))))
        }
        Backend::Mysql => {
            let schema = mysql_database(url, schema)?;
            let pool = outbox_mysql::connect_pool(url, pool_size).await?;
            // The binlog route (`outbox migrate --binlog`) reads positions the relay's
            // sequencer gives; it starts only when the store relays or inserts.
            let store = if outbox_mysql::binlog::route::is_on(&pool, &schema).await? {
                MysqlStore::binlog(pool, schema, url)?
            } else {
                MysqlStore::new(pool, schema)
            };
            Ok(Database::Mysql(Arc::new(store)))
        }
    }
}

/// The MySQL database that holds the outbox: `schema`, or the URL's database when `schema` is
/// PostgreSQL's default `public`.
fn mysql_database(url: &str, schema: &str) -> Result<outbox_mysql::Schema> {
    if schema != PUBLIC {
        return outbox_mysql::Schema::new(schema);
    }
    match outbox_mysql::url_database(url)? {
        Some(name) => outbox_mysql::Schema::new(&name),
        None => Err(Error::config(format!(
            "database URL `{}` names no database: write it in the URL \
             (mysql://user@host:3306/shop) or pass --schema",
            crate::backend::shown(url)
        ))),
    }
}

/// An opened outbox database. Cheap to share behind an `Arc`; its pool is shared by every
/// [`Store`] and [`Transaction`] it hands out.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Database {
    /// PostgreSQL, the outbox in one schema.
    Postgres(Arc<PgStore>),
    /// SQLite, the outbox in one file.
    Sqlite(Arc<SqliteStore>),
    /// MySQL/MariaDB, the outbox in one database.
    Mysql(Arc<MysqlStore>),
}

impl Database {
    /// Which backend this is.
    pub fn backend(&self) -> Backend {
        match self {
            Self::Postgres(_) => Backend::Postgres,
            Self::Sqlite(_) => Backend::Sqlite,
            Self::Mysql(_) => Backend::Mysql,
        }
    }

    /// Creates or upgrades the outbox tables; returns the migration versions applied now (empty
    /// when up to date). Safe to run concurrently and repeatedly.
    pub async fn migrate(&self) -> Result<Vec<i32>> {
        match self {
            Self::Postgres(s) => outbox_postgres::migrate(s.pool(), s.schema()).await,
            Self::Sqlite(s) => outbox_sqlite::migrate_tables(s.pool(), s.tables()).await,
            Self::Mysql(s) => outbox_mysql::migrate(s.pool(), s.schema()).await,
        }
    }

    /// Another outbox table set in the same database, sharing this one's pool: the schema
    /// `place` on PostgreSQL, the tables prefixed `place` on SQLite (see
    /// [`SqlxBackend`](crate::SqlxBackend) for what a place is). The inbox keeps its processing
    /// queue in one.
    pub fn sibling(&self, place: &str) -> Result<Database> {
        use crate::SqlxBackend;
        match self {
            Self::Postgres(s) => sqlx::Postgres::database(s.pool().clone(), place),
            Self::Sqlite(s) => sqlx::Sqlite::database(s.pool().clone(), place),
            Self::Mysql(s) => sqlx::MySql::database(s.pool().clone(), place),
        }
    }

    /// Installs (`on`) or removes the opt-in NOTIFY doorbell (PostgreSQL only; see
    /// `outbox migrate --notify` for its cost to writers).
    pub async fn set_notify(&self, on: bool) -> Result<()> {
        match self {
            Self::Postgres(s) => outbox_postgres::set_notify(s.pool(), s.schema(), on).await,
            Self::Sqlite(_) | Self::Mysql(_) => Err(outbox_core::Error::config(format!(
                "--notify and --no-notify apply to PostgreSQL only: {} relays poll",
                self.backend().name()
            ))),
        }
    }

    /// Turns the binlog route on (MySQL/MariaDB with a row binlog only; see
    /// `outbox migrate --binlog`).
    pub async fn enable_binlog_route(&self) -> Result<()> {
        match self {
            Self::Mysql(s) => outbox_mysql::binlog::route::enable(s.pool(), s.schema()).await,
            Self::Postgres(_) | Self::Sqlite(_) => Err(outbox_core::Error::config(format!(
                "--binlog reads the binlog of MySQL or MariaDB; {} is {} (PostgreSQL has --cdc)",
                self.place(),
                self.backend().name()
            ))),
        }
    }

    /// Drops storage every relay has passed and that closed longer ago than `older_than`
    /// (PostgreSQL segments, MySQL ranges; SQLite deletes published rows that old). Never a
    /// pending or parked message.
    pub async fn purge(&self, older_than: std::time::Duration) -> Result<outbox_core::Maintenance> {
        match self {
            Self::Postgres(s) => s.purge(older_than).await,
            Self::Sqlite(s) => outbox_core::Store::maintain(s.as_ref(), older_than).await,
            Self::Mysql(s) => outbox_core::Store::maintain(s.as_ref(), older_than).await,
        }
    }

    /// The store the relay, `status` and checks go through (the only engine-neutral view of
    /// the outbox's progress).
    pub fn store(&self) -> Arc<dyn Store> {
        match self {
            Self::Postgres(s) => s.clone(),
            Self::Sqlite(s) => s.clone(),
            Self::Mysql(s) => s.clone(),
        }
    }

    /// Checks, before a command uses them, that the outbox tables are there at the version this
    /// build needs (and, on PostgreSQL, that the sequence can serve the claims' floor). The
    /// error says what to do: `schema "s" has no outbox tables: run outbox migrate --schema s`.
    pub async fn check(&self) -> Result<()> {
        match self {
            Self::Postgres(s) => outbox_postgres::check_schema(s.pool(), s.schema()).await,
            Self::Sqlite(s) if s.tables() == &outbox_sqlite::Tables::default() => {
                outbox_sqlite::check_schema(s.pool(), &self.sqlite_path()).await
            }
            // Another table set (a sibling): reading its figures fails with a `Schema` error
            // when its tables are missing.
            Self::Sqlite(s) => s.stats().await.map(drop),
            Self::Mysql(s) => outbox_mysql::check_schema(s.pool(), s.schema()).await,
        }
    }

    /// Where the outbox tables live, for messages: ``schema `name` `` or `database file path`.
    pub fn place(&self) -> String {
        match self {
            Self::Postgres(s) => format!("schema `{}`", s.schema().as_str()),
            Self::Sqlite(_) => format!("database file {}", self.sqlite_path().display()),
            Self::Mysql(s) => format!("database `{}`", s.schema().as_str()),
        }
    }

    /// The schema `{schema}` stands for in statements: the outbox's schema on PostgreSQL,
    /// its database on MySQL, `main` on SQLite. Relays given this name (`--schema`) serve the
    /// same tables (SQLite relays ignore it).
    pub fn schema(&self) -> &str {
        match self {
            Self::Postgres(s) => s.schema().as_str(),
            Self::Sqlite(_) => sql::SQLITE_SCHEMA,
            Self::Mysql(s) => s.schema().as_str(),
        }
    }

    /// The PostgreSQL store, for PostgreSQL-only tools (`bench`); `None` on other backends.
    pub fn postgres(&self) -> Option<&PgStore> {
        match self {
            Self::Postgres(s) => Some(s),
            Self::Sqlite(_) | Self::Mysql(_) => None,
        }
    }

    /// Begins a business transaction: write the application's rows and enqueue their messages
    /// in it, then commit. SQLite transactions begin `IMMEDIATE` (they take the file's write
    /// lock at once, so one that reads before it writes never fails with `SQLITE_BUSY`).
    pub async fn begin(&self) -> Result<Transaction<'_>> {
        Transaction::begin(self).await
    }

    /// Runs one statement outside any transaction of the caller's; returns the rows affected.
    /// See the crate's statement conventions (`$n`, `{schema}`).
    pub async fn execute(&self, sql: &str, params: &[Param]) -> Result<u64> {
        let ctx = || format!("running a statement on {}", self.place());
        match self {
            Self::Postgres(s) => {
                sqlx::query_with(&s.schema().render(sql), sql::pg_arguments(params)?)
                    .execute(s.pool())
                    .await
                    .map(|r| r.rows_affected())
                    .map_err(|e| outbox_postgres::map_sqlx_error(&ctx(), e))
            }
            Self::Sqlite(s) => {
                sqlx::query_with(&sql::render_sqlite(sql), sql::sqlite_arguments(params)?)
                    .execute(s.pool())
                    .await
                    .map(|r| r.rows_affected())
                    .map_err(|e| outbox_sqlite::map_sqlx_error(&ctx(), e))
            }
            Self::Mysql(s) => {
                let (text, order) = sql::render_mysql(sql, s.schema().as_str());
                sqlx::query_with(&text, sql::mysql_arguments(params, &order)?)
                    .execute(s.pool())
                    .await
                    .map(|r| r.rows_affected())
                    .map_err(|e| outbox_mysql::map_sqlx_error(&ctx(), e))
            }
        }
    }

    /// Runs several `;`-separated statements without parameters (DDL), in order.
    pub async fn execute_script(&self, sql: &str) -> Result<()> {
        let ctx = || format!("running a script on {}", self.place());
        match self {
            Self::Postgres(s) => sqlx::raw_sql(&s.schema().render(sql))
                .execute(s.pool())
                .await
                .map(drop)
                .map_err(|e| outbox_postgres::map_sqlx_error(&ctx(), e)),
            Self::Sqlite(s) => sqlx::raw_sql(&sql::render_sqlite(sql))
                .execute(s.pool())
                .await
                .map(drop)
                .map_err(|e| outbox_sqlite::map_sqlx_error(&ctx(), e)),
            Self::Mysql(s) => sqlx::raw_sql(&s.schema().render(sql))
                .execute(s.pool())
                .await
                .map(drop)
                .map_err(|e| outbox_mysql::map_sqlx_error(&ctx(), e)),
        }
    }

    /// Every row a query returns.
    pub async fn fetch_all<T: Row>(&self, sql: &str, params: &[Param]) -> Result<Vec<T>> {
        let ctx = || format!("querying {}", self.place());
        match self {
            Self::Postgres(s) => {
                sqlx::query_as_with(&s.schema().render(sql), sql::pg_arguments(params)?)
                    .fetch_all(s.pool())
                    .await
                    .map_err(|e| outbox_postgres::map_sqlx_error(&ctx(), e))
            }
            Self::Sqlite(s) => {
                sqlx::query_as_with(&sql::render_sqlite(sql), sql::sqlite_arguments(params)?)
                    .fetch_all(s.pool())
                    .await
                    .map_err(|e| outbox_sqlite::map_sqlx_error(&ctx(), e))
            }
            Self::Mysql(s) => {
                let (text, order) = sql::render_mysql(sql, s.schema().as_str());
                sqlx::query_as_with(&text, sql::mysql_arguments(params, &order)?)
                    .fetch_all(s.pool())
                    .await
                    .map_err(|e| outbox_mysql::map_sqlx_error(&ctx(), e))
            }
        }
    }

    /// The one row a query returns (an error when it returns none).
    pub async fn fetch_one<T: Row>(&self, sql: &str, params: &[Param]) -> Result<T> {
        let ctx = || format!("querying {}", self.place());
        match self {
            Self::Postgres(s) => {
                sqlx::query_as_with(&s.schema().render(sql), sql::pg_arguments(params)?)
                    .fetch_one(s.pool())
                    .await
                    .map_err(|e| outbox_postgres::map_sqlx_error(&ctx(), e))
            }
            Self::Sqlite(s) => {
                sqlx::query_as_with(&sql::render_sqlite(sql), sql::sqlite_arguments(params)?)
                    .fetch_one(s.pool())
                    .await
                    .map_err(|e| outbox_sqlite::map_sqlx_error(&ctx(), e))
            }
            Self::Mysql(s) => {
                let (text, order) = sql::render_mysql(sql, s.schema().as_str());
                sqlx::query_as_with(&text, sql::mysql_arguments(params, &order)?)
                    .fetch_one(s.pool())
                    .await
                    .map_err(|e| outbox_mysql::map_sqlx_error(&ctx(), e))
            }
        }
    }

    /// Whether the place this database names already holds something: a schema of that name
    /// (PostgreSQL), a database of that name (MySQL), any table in the file (SQLite). For
    /// tools that must not wipe what they did not make.
    pub async fn exists(&self) -> Result<bool> {
        let (found,): (bool,) = match self {
            Self::Mysql(s) => {
                let (n,): (i64,) = self
                    .fetch_one(
                        "SELECT COUNT(*) FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = $1",
                        &[Param::from(s.schema().as_str())],
                    )
                    .await?;
                (n > 0,)
            }
            Self::Postgres(s) => {
                self.fetch_one(
                    "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)",
                    &[Param::from(s.schema().as_str())],
                )
                .await?
            }
            Self::Sqlite(_) => {
                self.fetch_one(
                    "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table')",
                    &[],
                )
                .await?
            }
        };
        Ok(found)
    }

    /// Deletes the outbox and everything beside it: the whole schema, `CASCADE` (PostgreSQL),
    /// the whole database (MySQL), or the file with its `-wal` and `-shm` companions (SQLite),
    /// then closes the pool. For scratch databases (demo, verify, tests) only; refuses
    /// PostgreSQL's `public` schema and MySQL's own databases.
    pub async fn destroy(self) -> Result<()> {
        match &self {
            Self::Postgres(s) => {
                if s.schema().as_str() == PUBLIC {
                    return Err(Error::config(
                        "refusing to drop the `public` schema: only scratch schemas are destroyed",
                    ));
                }
                self.execute_script("DROP SCHEMA IF EXISTS {schema} CASCADE")
                    .await?;
                s.pool().close().await;
            }
            Self::Sqlite(s) => {
                let path = self.sqlite_path();
                s.pool().close().await;
                outbox_sqlite::remove_database(&path);
            }
            Self::Mysql(s) => {
                if ["mysql", "information_schema", "performance_schema", "sys"]
                    .contains(&s.schema().as_str())
                {
                    return Err(Error::config(
                        "refusing to drop a MySQL system database: only scratch databases are \
                         destroyed",
                    ));
                }
                self.execute_script("DROP DATABASE IF EXISTS {schema}")
                    .await?;
                s.pool().close().await;
            }
        }
        Ok(())
    }

    /// The SQLite file (an empty path on other backends).
    fn sqlite_path(&self) -> PathBuf {
        match self {
            Self::Sqlite(s) => s.pool().connect_options().get_filename().to_path_buf(),
            Self::Postgres(_) | Self::Mysql(_) => PathBuf::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use outbox_core::ErrorKind;

    use super::*;

    #[tokio::test]
    async fn an_unsupported_scheme_fails_before_connecting() {
        let e = open("redis://:pw@127.0.0.1:1", "public", 1)
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Config);
        assert!(!e.to_string().contains(":pw@"), "{e}");
    }

    #[tokio::test]
    async fn a_bad_schema_fails_before_connecting() {
        // Port 1: nothing listens, so only the schema check can answer with a Config error.
        let e = open("postgres://app@127.0.0.1:1/x", "Robert'); DROP", 1)
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Config);
        assert!(e.to_string().contains("schema"), "{e}");
    }

    #[tokio::test]
    async fn an_unreachable_server_is_a_transient_error_without_the_password() {
        let e = open("postgres://app:hunter2@127.0.0.1:1/x", "public", 1)
            .await
            .unwrap_err();
        assert!(e.is_transient(), "{e}");
        assert!(!e.to_string().contains("hunter2"), "password leaked: {e}");
    }

    #[tokio::test]
    async fn a_sqlite_file_in_a_missing_folder_is_an_error_naming_it() {
        let e = open("sqlite:///nonexistent-outbox-dir/x.db", "public", 1)
            .await
            .unwrap_err();
        assert!(e.to_string().contains("nonexistent-outbox-dir"), "{e}");
    }
}
