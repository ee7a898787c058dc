//! [`Session`]: a connection of its own holding a named lock for as long as it lives, so one
//! process at a time does a job (the inbox daemon's source) and hands it over when it dies.

use outbox_core::Result;
use sqlx::{ConnectOptions, PgConnection};

use crate::database::Database;
use crate::transaction::Transaction;

/// A connection holding a named lock, from [`Database::lock_session`]. Work done through
/// [`Session::begin`] runs on that very connection: if it is lost, the lock went with it and
/// the work fails too, so a process never goes on working after another one took over.
pub struct Session {
    db: Database,
    /// PostgreSQL: the connection holding a session-level advisory lock. `None` on SQLite.
    conn: Option<PgConnection>,
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
    /// process exits, crashes or loses its network. SQLite has no such lock: every caller gets
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
                    conn: Some(conn),
                }))
            }
            Self::Sqlite(_) => Ok(Some(Session {
                db: self.clone(),
                conn: None,
            })),
        }
    }
}

impl Session {
    /// Whether the session still holds its lock: its connection answers a `SELECT 1` within
    /// five seconds (a lost connection took the lock with it). Always true on SQLite.
    pub async fn alive(&mut self) -> bool {
        let Some(conn) = self.conn.as_mut() else {
            return true;
        };
        matches!(
            tokio::time::timeout(
                std::time::Duration::from_secs(5),
                sqlx::query("SELECT 1").execute(conn)
            )
            .await,
            Ok(Ok(_))
        )
    }

    /// Begins a business transaction on the session's connection (SQLite: on the pool, as
    /// [`Database::begin`] does).
    pub async fn begin(&mut self) -> Result<Transaction<'_>> {
        match (&self.db, &mut self.conn) {
            (Database::Postgres(s), Some(conn)) => Transaction::begin_on(s, conn).await,
            (db, _) => db.begin().await,
        }
    }
}
