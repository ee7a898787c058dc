//! [`InboxDatabase`]: an inbox opened from a database URL, for the `outbox` commands (`inbox`,
//! `migrate --inbox`, `status --inbox`, `failed --inbox`, `redrive --inbox`) and tools.

use std::sync::Arc;
use std::time::Duration;

use outbox_core::{Result, Store};
use outbox_db::Backend;
use sqlx::{PgPool, SqlitePool};

use crate::daemon::InboxDb;
use crate::retention::Purged;
use crate::tables::InboxSchema;

/// An opened inbox: its pool, and where its tables and processing queue live.
#[derive(Debug, Clone)]
pub enum InboxDatabase {
    /// PostgreSQL: tables in `schema.tables()`, queue in `schema.queue()`.
    Postgres {
        /// Connections (set up like the relay's).
        pool: PgPool,
        /// The schemas.
        schema: InboxSchema,
        /// The URL, to open the daemon's own connection.
        url: String,
    },
    /// SQLite: the tables and the `inbox_queue` tables in one file.
    Sqlite {
        /// Connections to the file.
        pool: SqlitePool,
    },
}

impl InboxDatabase {
    /// Opens the database `url` names (`postgres://…` with the inbox tables in `schema` and
    /// the queue in `<schema>_inbox`, or `sqlite://path`), with at most `pool_size`
    /// connections. Nothing is created but an empty SQLite file; see [`InboxDatabase::migrate`].
    pub async fn open(url: &str, schema: &str, pool_size: u32) -> Result<Self> {
        match Backend::of(url)? {
            Backend::Postgres => {
                let schema = InboxSchema::new(schema)?;
                let pool = outbox_postgres::connect_pool(url, pool_size.max(1)).await?;
                Ok(Self::Postgres {
                    pool,
                    schema,
                    url: url.to_string(),
                })
            }
            _ => {
                let pool = outbox_sqlite::connect_pool_sized(url, pool_size).await?;
                Ok(Self::Sqlite { pool })
            }
        }
    }

    /// Creates or upgrades the inbox tables and the processing queue.
    pub async fn migrate(&self) -> Result<Vec<i32>> {
        match self {
            Self::Postgres { pool, schema, .. } => crate::migrate_postgres(pool, schema).await,
            Self::Sqlite { pool } => crate::migrate_sqlite(pool).await,
        }
    }

    /// The processing queue as an outbox store: `status`, `failed` and `redrive` of the inbox
    /// go through it, exactly as for an outbox.
    pub fn queue(&self) -> Arc<dyn Store> {
        match self {
            Self::Postgres { pool, schema, .. } => Arc::new(outbox_postgres::PgStore::new(
                pool.clone(),
                schema.queue().clone(),
            )),
            Self::Sqlite { pool } => Arc::new(outbox_sqlite::SqliteStore::with_tables(
                pool.clone(),
                crate::sqlite::queue_tables(),
            )),
        }
    }

    /// Where the inbox lives, for messages.
    pub fn place(&self) -> String {
        match self {
            Self::Postgres { schema, .. } => format!(
                "inbox in schema `{}` (processing queue in `{}`)",
                schema.tables().as_str(),
                schema.queue().as_str()
            ),
            Self::Sqlite { pool } => format!(
                "inbox in database file {}",
                pool.connect_options().get_filename().display()
            ),
        }
    }

    /// What the ingest daemon writes through.
    pub fn daemon(&self) -> Result<InboxDb> {
        match self {
            Self::Postgres { schema, url, .. } => Ok(InboxDb::Postgres {
                options: Box::new(outbox_postgres::connect_options(url)?),
                schema: schema.clone(),
            }),
            Self::Sqlite { pool } => Ok(InboxDb::Sqlite(pool.clone())),
        }
    }

    /// Deletes claimed inbox rows, claims and idempotency keys older than `older_than`.
    pub async fn purge(&self, older_than: Duration) -> Result<Purged> {
        match self {
            Self::Postgres { pool, schema, .. } => {
                crate::retention::purge_postgres(pool, schema, older_than).await
            }
            Self::Sqlite { pool } => crate::retention::purge_sqlite(pool, older_than).await,
        }
    }

    /// Housekeeping once: the queue's storage ahead of the writers and its retention (the
    /// engine's `maintain`), then the inbox rows, claims and keys past `retention`. The
    /// processor does it as well; the daemon does it too, so an inbox read only with SQL (no
    /// processor) keeps its queue's segments ahead of the inserts.
    pub async fn maintain(
        &self,
        retention: Duration,
    ) -> Result<(outbox_core::Maintenance, Purged)> {
        let m = self.queue().maintain(retention).await?;
        let p = self.purge(retention).await?;
        Ok((m, p))
    }

    /// Whether the inbox tables exist (a `Schema` error names the fix otherwise).
    pub async fn check(&self) -> Result<()> {
        let probe = match self {
            Self::Postgres { pool, schema, .. } => {
                sqlx::query(&schema.render("SELECT 1 FROM {schema}.inbox_messages LIMIT 1"))
                    .fetch_optional(pool)
                    .await
                    .map(drop)
                    .map_err(|e| outbox_postgres::map_sqlx_error("reading the inbox", e))
            }
            Self::Sqlite { pool } => sqlx::query("SELECT 1 FROM inbox_messages LIMIT 1")
                .fetch_optional(pool)
                .await
                .map(drop)
                .map_err(|e| outbox_sqlite::map_sqlx_error("reading the inbox", e)),
        };
        probe?;
        self.queue().stats().await.map(drop)
    }
}
