//! [`InboxDatabase`]: an inbox opened from a database URL, for the `outbox` commands (`inbox`,
//! `migrate --inbox`, `status --inbox`, `failed --inbox`, `redrive --inbox`) and tools.
//!
//! It goes through `outbox-db` like every command: the inbox tables are a [`Database`], the
//! processing queue its [`sibling`](Database::sibling). [`places`] is the one place that knows
//! how an inbox is laid out on each backend.

use std::sync::Arc;
use std::time::Duration;

use outbox_core::{Result, Store};
use outbox_db::{Backend, Database, SqlxBackend};

use crate::daemon::InboxDb;
use crate::retention::Purged;
use crate::tables::InboxSchema;

/// Where an inbox's two parts live on `backend`: (its tables, its processing queue), as
/// [`SqlxBackend`] places. PostgreSQL: the schemas of `schema`; MySQL: the databases of the
/// same names. SQLite: one file, with the
/// queue's outbox tables under the prefix [`crate::sqlite::QUEUE_PREFIX`] beside the
/// application's `outbox` tables.
pub(crate) fn places(backend: Backend, schema: &InboxSchema) -> (&str, &str) {
    match backend {
        Backend::Sqlite => (SQLITE_OUTBOX, crate::sqlite::QUEUE_PREFIX),
        _ => (schema.tables().as_str(), schema.queue().as_str()),
    }
}

/// The application's own outbox table set in a SQLite file, beside which the inbox tables are
/// made (statements on the inbox tables name them without a prefix).
const SQLITE_OUTBOX: &str = "outbox";

/// An opened inbox: its tables, its processing queue, and their names.
#[derive(Debug, Clone)]
pub struct InboxDatabase {
    tables: Database,
    queue: Database,
    schema: InboxSchema,
}

impl InboxDatabase {
    /// Opens the database `url` names, with at most `pool_size` connections:
    /// `postgres://…` with the inbox tables in schema `schema` and the queue in
    /// `<schema>_inbox`; `mysql://…/db` with the tables in database `db` (or `schema`, when
    /// given instead of the default `public`) and the queue in database `<db>_inbox`; or
    /// `sqlite://path`, where `schema` is ignored. Nothing is created but an empty SQLite
    /// file; see [`InboxDatabase::migrate`].
    pub async fn open(url: &str, schema: &str, pool_size: u32) -> Result<Self> {
        // The names are checked before anything connects (on MySQL, by `outbox_db::open`).
        let schema = match Backend::of(url)? {
            // SQLite has no schemas; the PostgreSQL names are never used.
            Backend::Sqlite => InboxSchema::default(),
            Backend::Mysql => {
                let tables = outbox_db::open(url, schema, pool_size).await?;
                let schema = InboxSchema::new(tables.schema())?;
                return Self::from_database(tables, schema);
            }
            _ => InboxSchema::new(schema)?,
        };
        let tables = outbox_db::open(url, schema.tables().as_str(), pool_size).await?;
        Self::from_database(tables, schema)
    }

    /// The inbox in `schema` of the database `pool` connects to (sharing that pool).
    pub fn from_pool<DB: SqlxBackend>(pool: sqlx::Pool<DB>, schema: InboxSchema) -> Result<Self> {
        let (tables, _) = places(DB::BACKEND, &schema);
        Self::from_database(DB::database(pool, tables)?, schema)
    }

    fn from_database(tables: Database, schema: InboxSchema) -> Result<Self> {
        let (_, queue) = places(tables.backend(), &schema);
        Ok(Self {
            queue: tables.sibling(queue)?,
            tables,
            schema,
        })
    }

    /// Creates or upgrades the processing queue (the outbox migrations), then the inbox
    /// tables, each in one transaction serialised against other migrators. Safe to run
    /// concurrently and repeatedly. Returns the inbox versions applied now.
    pub async fn migrate(&self) -> Result<Vec<i32>> {
        self.queue.migrate().await?;
        let lock = format!("outbox-inbox-migrate:{}", self.schema.tables().as_str());
        let migrations = outbox_db::Migrations {
            ledger: "inbox_migrations",
            lock: &lock,
            postgres: crate::POSTGRES_MIGRATIONS,
            sqlite: crate::SQLITE_MIGRATIONS,
            mysql: crate::MYSQL_MIGRATIONS,
        };
        let schema = &self.schema;
        self.tables
            .apply_migrations(&migrations, &|sql| schema.render_queue(sql))
            .await
    }

    /// The processing queue as an outbox store: `status`, `failed` and `redrive` of the inbox
    /// go through it, exactly as for an outbox.
    pub fn queue(&self) -> Arc<dyn Store> {
        self.queue.store()
    }

    /// The database of the inbox tables (statements on it fill `{schema}` with their place).
    pub fn tables(&self) -> &Database {
        &self.tables
    }

    /// The names of the inbox's schemas (PostgreSQL; the defaults on SQLite).
    pub fn schema(&self) -> &InboxSchema {
        &self.schema
    }

    /// Where the inbox lives, for messages.
    pub fn place(&self) -> String {
        match self.tables.backend() {
            Backend::Sqlite => format!("inbox in {}", self.tables.place()),
            _ => format!(
                "inbox in {} (processing queue in {})",
                self.tables.place(),
                self.queue.place()
            ),
        }
    }

    /// What the ingest daemon writes through.
    pub fn daemon(&self) -> Result<InboxDb> {
        Ok(InboxDb::new(self.clone()))
    }

    /// Deletes claimed inbox rows, claims and idempotency keys older than `older_than`.
    pub async fn purge(&self, older_than: Duration) -> Result<Purged> {
        crate::retention::purge(&self.tables, older_than).await
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

    /// Drops the processing queue's schema (PostgreSQL) or database (MySQL) with everything in
    /// it, and closes the pool: for scratch inboxes (`outbox verify`), never an inbox in use.
    /// SQLite keeps the queue in the application's file, which this refuses to remove.
    pub async fn destroy_queue(self) -> Result<()> {
        if self.queue.backend() == Backend::Sqlite {
            return Err(outbox_core::Error::config(
                "the SQLite inbox's queue lives in the application's file: nothing to drop alone",
            ));
        }
        self.queue.destroy().await
    }

    /// Whether the inbox tables and the queue exist (a `Schema` error names the fix
    /// otherwise).
    pub async fn check(&self) -> Result<()> {
        self.tables
            .fetch_all::<(i64,)>(include_str!("../queries/check.sql"), &[])
            .await?;
        self.queue().stats().await.map(drop)
    }
}
