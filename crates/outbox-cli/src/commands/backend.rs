//! Which database a URL names, behind one type: PostgreSQL (`postgres://`) or SQLite
//! (`sqlite://path`, the embedded default).

use std::sync::Arc;

use outbox_core::{Error, ErrorKind, Store};
use outbox_postgres::{PgStore, Schema};
use outbox_sqlite::SqliteStore;

use crate::config::DbSettings;

/// An opened outbox database.
pub enum Backend {
    /// PostgreSQL, one schema.
    Postgres(Box<PgStore>),
    /// SQLite, one file.
    Sqlite(SqliteStore),
}

impl Backend {
    /// Opens the database `db.url` names, with at most `pool_size` connections.
    pub async fn open(db: &DbSettings, pool_size: u32) -> Result<Self, Error> {
        let scheme = db.url.split_once(':').map(|(s, _)| s).unwrap_or("");
        match scheme {
            "postgres" | "postgresql" => {
                let schema = Schema::new(&db.schema)?;
                let pool = outbox_postgres::connect_pool(&db.url, pool_size).await?;
                Ok(Self::Postgres(Box::new(PgStore::new(pool, schema))))
            }
            "sqlite" => {
                let pool = outbox_sqlite::connect_pool(&db.url).await?;
                Ok(Self::Sqlite(SqliteStore::new(pool)))
            }
            _ => Err(Error::new(
                ErrorKind::Config,
                format!(
                    "database URL `{}`: unsupported scheme `{scheme}`; use postgres://… or sqlite://path",
                    outbox_core::redact::url(&db.url)
                ),
            )),
        }
    }

    /// Creates or upgrades the tables; returns the migration versions applied now.
    pub async fn migrate(&self) -> Result<Vec<i32>, Error> {
        match self {
            Self::Postgres(s) => outbox_postgres::migrate(s.pool(), s.schema()).await,
            Self::Sqlite(s) => outbox_sqlite::migrate(s.pool()).await,
        }
    }

    /// The store, for the relay and `status`.
    pub fn store(&self) -> Arc<dyn Store> {
        match self {
            Self::Postgres(s) => Arc::new(PgStore::new(s.pool().clone(), s.schema().clone())),
            Self::Sqlite(s) => Arc::new(SqliteStore::new(s.pool().clone())),
        }
    }

    /// Where the tables live, for messages: `schema \`x\`` or `file path`.
    pub fn place(&self, db: &DbSettings) -> String {
        match self {
            Self::Postgres(_) => format!("schema `{}`", db.schema),
            Self::Sqlite(_) => format!("database {}", db.url),
        }
    }
}
