//! [`Session`]: a connection of its own holding a named lock for as long as it lives, so one
//! process at a time does a job (the inbox daemon's source) and hands it over when it dies.

use outbox_core::Result;
use sqlx::{ConnectOptions, MySqlConnection, PgConnection};

use crate::database::Database;
use crate::transaction::Transaction;

/// A connection holding a named lock, from [`Database::lock_session`]. Work done through
/// [`Session::begin`] runs on that very connection: if it is lost, the lock went with it and
/// the work fails too, so a process never goes on working after another one took over.
pub struct Session {
    db: Database,
    conn: Held,
}

/// The connection holding the lock.
enum Held {
    /// A session-level advisory lock.
    Postgres(PgConnection),
    /// A `GET_LOCK` named lock.
    Mysql(MySqlConnection),
    /// SQLite: no lock, no connection of its own.
    Nothing,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("place", &self.db.place())
            .finish_non_exhaustive()
    }
}

impl Database {
    /// Takes the lock `name` on a new connection of its own, without waiting: `None` when
    /// another session holds it. PostgreSQL: a session-level advisory lock on the hash of
    /// `name` (`hashtextextended(name, 0)`), released when the connection ends, whether the
    /// process exits, crashes or loses its network. MySQL: `GET_LOCK` on the name (hashed to fit
    /// its 64 characters), released the same way. SQLite has no such lock: every caller gets
    /// a session, and the file's one-writer-at-a-time rule is what serialises them.
    pub async fn lock_session(&self, name: &str) -> Result<Option<Session>> {
        match self {
            Self::Postgres(s) => {
                let err =
                    |what: &str, e| outbox_postgres::map_sqlx_error(&format!("{what} `{name}`"), e);
                let mut conn = s
                    .pool()
                    .connect_options()
                    .connect()
                    .await
                    .map_err(|e| err("connecting to take the lock", e))?;
                let got: bool =
                    sqlx::query_scalar("SELECT pg_try_advisory_lock(hashtextextended($1, 0))")
                        .bind(name)
                        .fetch_one(&mut conn)
                        .await
                        .map_err(|e| err("taking the lock", e))?;
                Ok(got.then(|| Session {
                    db: self.clone(),
                    conn: Held::Postgres(conn),
                }))
            }
            Self::Mysql(s) => {
                let err =
                    |what: &str, e| outbox_mysql::map_sqlx_error(&format!("{what} `{name}`"), e);
                let mut conn = s
                    .pool()
                    .connect_options()
                    .connect()
                    .await
                    .map_err(|e| err("connecting to take the lock", e))?;
                // As the pool's sessions run: the work done here reads committed rows.
                sqlx::query("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
                    .execute(&mut conn)
                    .await
                    .map_err(|e| err("setting up the session for", e))?;
                let got: Option<i64> =
                    sqlx::query_scalar("SELECT GET_LOCK(CONCAT('outbox:', SHA1(?)), 0)")
                        .bind(name)
                        .fetch_one(&mut conn)
                        .await
                        .map_err(|e| err("taking the lock", e))?;
                Ok((got == Some(1)).then(|| Session {
                    db: self.clone(),
                    conn: Held::Mysql(conn),
                }))
            }
            Self::Sqlite(_) => Ok(Some(Session {
                db: self.clone(),
                conn: Held::Nothing,
            })),
        }
    }
}

impl Session {
    /// Whether the session still holds its lock: its connection answers a `SELECT 1` within
    /// five seconds (a lost connection took the lock with it). Always true on SQLite.
    pub async fn alive(&mut self) -> bool {
        let limit = std::time::Duration::from_secs(5);
        match &mut self.conn {
            Held::Postgres(conn) => matches!(
                tokio::time::timeout(limit, sqlx::query("SELECT 1").execute(conn)).await,
                Ok(Ok(_))
            ),
            Held::Mysql(conn) => matches!(
                tokio::time::timeout(limit, sqlx::query("SELECT 1").execute(conn)).await,
                Ok(Ok(_))
            ),
            Held::Nothing => true,
        }
    }

    /// Begins a business transaction on the session's connection (SQLite: on the pool, as
    /// [`Database::begin`] does).
    pub async fn begin(&mut self) -> Result<Transaction<'_>> {
        match (&self.db, &mut self.conn) {
            (Database::Postgres(s), Held::Postgres(conn)) => Transaction::begin_on(s, conn).await,
            (Database::Mysql(s), Held::Mysql(conn)) => Transaction::begin_on_mysql(s, conn).await,
            (db, _) => db.begin().await,
        }
    }
}
