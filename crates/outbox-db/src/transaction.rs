//! [`Transaction`]: an application's business transaction on any of the three databases, with the writer
//! API (`enqueue`) inside it.

use outbox_core::{NewMessage, Result};
use outbox_mysql::MysqlStore;
use outbox_postgres::PgStore;
use outbox_sqlite::SqliteStore;
use sqlx::{MySql, Postgres, Sqlite};
use uuid::Uuid;

use crate::database::Database;
use crate::sql::{self, Param, Row};

/// A business transaction: the application's rows and their outbox messages, committed
/// together or not at all. Dropped without [`commit`](Self::commit), it rolls back.
///
/// Messages written with [`enqueue`](Self::enqueue) go through each backend's writer, which
/// keeps per-key order equal to commit order (PostgreSQL: a transaction-scoped advisory lock per
/// key taken before `seq` is drawn; SQLite: one writer at a time; MySQL: a per-partition
/// position counter the transaction keeps locked until it ends). Rows written with
/// [`execute`](Self::execute) are whatever the statement says: an outbox `INSERT` written that
/// way takes no lock, as an app in another language would.
pub struct Transaction<'db> {
    inner: Inner<'db>,
}

enum Inner<'db> {
    Postgres(&'db PgStore, sqlx::Transaction<'db, Postgres>),
    Sqlite(&'db SqliteStore, sqlx::Transaction<'db, Sqlite>),
    Mysql(&'db MysqlStore, sqlx::Transaction<'db, MySql>),
}

/// The sqlx transaction under a [`Transaction`], typed, for code that has SQL of its own per
/// database (the inbox's statements). Match it exhaustively: a new backend is a new variant,
/// and the compiler then shows every place that needs its SQL.
pub enum SqlxTransaction<'t, 'db> {
    /// PostgreSQL's.
    Postgres(&'t mut sqlx::Transaction<'db, Postgres>),
    /// SQLite's.
    Sqlite(&'t mut sqlx::Transaction<'db, Sqlite>),
    /// MySQL's (MariaDB's).
    Mysql(&'t mut sqlx::Transaction<'db, MySql>),
}

impl<'db> Transaction<'db> {
    pub(crate) async fn begin(db: &'db Database) -> Result<Self> {
        let ctx = format!("beginning a transaction on {}", db.place());
        let inner = match db {
            Database::Postgres(s) => Inner::Postgres(
                s,
                s.pool()
                    .begin()
                    .await
                    .map_err(|e| outbox_postgres::map_sqlx_error(&ctx, e))?,
            ),
            Database::Sqlite(s) => Inner::Sqlite(
                s,
                outbox_sqlite::begin_immediate(s.pool())
                    .await
                    .map_err(|e| outbox_sqlite::map_sqlx_error(&ctx, e))?,
            ),
            Database::Mysql(s) => Inner::Mysql(
                s,
                s.pool()
                    .begin()
                    .await
                    .map_err(|e| outbox_mysql::map_sqlx_error(&ctx, e))?,
            ),
        };
        Ok(Self { inner })
    }

    /// A transaction on `conn`, a PostgreSQL connection of the caller's own (a
    /// [`crate::Session`]'s), writing to `store`'s tables.
    pub(crate) async fn begin_on(
        store: &'db PgStore,
        conn: &'db mut sqlx::PgConnection,
    ) -> Result<Self> {
        let tx = sqlx::Connection::begin(conn).await.map_err(|e| {
            outbox_postgres::map_sqlx_error(
                &format!(
                    "beginning a transaction on schema `{}`",
                    store.schema().as_str()
                ),
                e,
            )
        })?;
        Ok(Self {
            inner: Inner::Postgres(store, tx),
        })
    }

    /// A transaction on `conn`, a MySQL connection of the caller's own (a [`crate::Session`]'s),
    /// writing to `store`'s tables.
    pub(crate) async fn begin_on_mysql(
        store: &'db MysqlStore,
        conn: &'db mut sqlx::MySqlConnection,
    ) -> Result<Self> {
        let tx = sqlx::Connection::begin(conn).await.map_err(|e| {
            outbox_mysql::map_sqlx_error(
                &format!(
                    "beginning a transaction on database `{}`",
                    store.schema().as_str()
                ),
                e,
            )
        })?;
        Ok(Self {
            inner: Inner::Mysql(store, tx),
        })
    }

    /// The sqlx transaction itself, typed by backend.
    pub fn sqlx(&mut self) -> SqlxTransaction<'_, 'db> {
        match &mut self.inner {
            Inner::Postgres(_, tx) => SqlxTransaction::Postgres(tx),
            Inner::Sqlite(_, tx) => SqlxTransaction::Sqlite(tx),
            Inner::Mysql(_, tx) => SqlxTransaction::Mysql(tx),
        }
    }

    /// Adds `message` to the outbox in this transaction, through the backend's writer (see the
    /// type's ordering note). Returns its id.
    pub async fn enqueue(&mut self, message: &NewMessage) -> Result<Uuid> {
        match &mut self.inner {
            Inner::Postgres(s, tx) => s.writer().enqueue(tx, message).await,
            Inner::Sqlite(s, tx) => s.writer().enqueue(tx, message).await,
            Inner::Mysql(s, tx) => outbox_mysql::enqueue(tx, s.schema(), message).await,
        }
    }

    /// Adds `messages` to the outbox in this transaction, in one statement, keeping their order.
    pub async fn enqueue_many(&mut self, messages: &[NewMessage]) -> Result<()> {
        match &mut self.inner {
            Inner::Postgres(s, tx) => s.writer().enqueue_many(tx, messages).await,
            Inner::Sqlite(s, tx) => s.writer().enqueue_many(tx, messages).await,
            Inner::Mysql(s, tx) => outbox_mysql::enqueue_many(tx, s.schema(), messages).await,
        }
    }

    /// CDC mode's table-less writer (PostgreSQL): writes `message` into the WAL in this
    /// transaction through `{schema}.outbox_emit`, published by the CDC relay iff the
    /// transaction commits, in commit order with the table's rows. Fails (and with it the
    /// transaction) while the relay group has no valid slot. Returns its id. Other backends have
    /// no CDC mode: a configuration error.
    pub async fn emit(&mut self, message: &NewMessage) -> Result<Uuid> {
        match &mut self.inner {
            Inner::Postgres(s, tx) => {
                outbox_postgres::Emitter::new(s.schema())
                    .emit(tx, message)
                    .await
            }
            Inner::Sqlite(..) | Inner::Mysql(..) => Err(outbox_core::Error::config(
                "emit writes a logical message for PostgreSQL's CDC relay; this database has \
                 no CDC mode",
            )),
        }
    }

    /// Runs one statement in this transaction; returns the rows affected. `$n` parameters and
    /// `{schema}` as in [`Database::execute`].
    pub async fn execute(&mut self, sql: &str, params: &[Param]) -> Result<u64> {
        let ctx = "running a statement in a business transaction";
        match &mut self.inner {
            Inner::Postgres(s, tx) => {
                sqlx::query_with(&s.schema().render(sql), sql::pg_arguments(params)?)
                    .execute(&mut **tx)
                    .await
                    .map(|r| r.rows_affected())
                    .map_err(|e| outbox_postgres::map_sqlx_error(ctx, e))
            }
            Inner::Sqlite(_, tx) => {
                sqlx::query_with(&sql::render_sqlite(sql), sql::sqlite_arguments(params)?)
                    .execute(&mut **tx)
                    .await
                    .map(|r| r.rows_affected())
                    .map_err(|e| outbox_sqlite::map_sqlx_error(ctx, e))
            }
            Inner::Mysql(s, tx) => {
                let (text, order) = sql::render_mysql(sql, s.schema().as_str());
                sqlx::query_with(&text, sql::mysql_arguments(params, &order)?)
                    .execute(&mut **tx)
                    .await
                    .map(|r| r.rows_affected())
                    .map_err(|e| outbox_mysql::map_sqlx_error(ctx, e))
            }
        }
    }

    /// The one row a statement returns in this transaction (`SELECT`, or `… RETURNING`).
    pub async fn fetch_one<T: Row>(&mut self, sql: &str, params: &[Param]) -> Result<T> {
        let ctx = "querying in a business transaction";
        match &mut self.inner {
            Inner::Postgres(s, tx) => {
                sqlx::query_as_with(&s.schema().render(sql), sql::pg_arguments(params)?)
                    .fetch_one(&mut **tx)
                    .await
                    .map_err(|e| outbox_postgres::map_sqlx_error(ctx, e))
            }
            Inner::Sqlite(_, tx) => {
                sqlx::query_as_with(&sql::render_sqlite(sql), sql::sqlite_arguments(params)?)
                    .fetch_one(&mut **tx)
                    .await
                    .map_err(|e| outbox_sqlite::map_sqlx_error(ctx, e))
            }
            Inner::Mysql(s, tx) => {
                let (text, order) = sql::render_mysql(sql, s.schema().as_str());
                sqlx::query_as_with(&text, sql::mysql_arguments(params, &order)?)
                    .fetch_one(&mut **tx)
                    .await
                    .map_err(|e| outbox_mysql::map_sqlx_error(ctx, e))
            }
        }
    }

    /// Commits: the rows and messages exist from now on, together.
    pub async fn commit(self) -> Result<()> {
        let ctx = "committing a business transaction";
        match self.inner {
            Inner::Postgres(_, tx) => tx
                .commit()
                .await
                .map_err(|e| outbox_postgres::map_sqlx_error(ctx, e)),
            Inner::Sqlite(_, tx) => tx
                .commit()
                .await
                .map_err(|e| outbox_sqlite::map_sqlx_error(ctx, e)),
            Inner::Mysql(_, tx) => tx
                .commit()
                .await
                .map_err(|e| outbox_mysql::map_sqlx_error(ctx, e)),
        }
    }

    /// Rolls back: none of the rows or messages exist.
    pub async fn rollback(self) -> Result<()> {
        let ctx = "rolling back a business transaction";
        match self.inner {
            Inner::Postgres(_, tx) => tx
                .rollback()
                .await
                .map_err(|e| outbox_postgres::map_sqlx_error(ctx, e)),
            Inner::Sqlite(_, tx) => tx
                .rollback()
                .await
                .map_err(|e| outbox_sqlite::map_sqlx_error(ctx, e)),
            Inner::Mysql(_, tx) => tx
                .rollback()
                .await
                .map_err(|e| outbox_mysql::map_sqlx_error(ctx, e)),
        }
    }
}
