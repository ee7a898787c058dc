//! [`Migrations`]: tables another crate keeps beside an outbox (the inbox's), created and
//! upgraded by the same runners as the outbox's own, on any backend.

use outbox_core::Result;

use crate::database::Database;
use crate::sql;

/// One crate's migrations for every backend, applied by [`Database::apply_migrations`].
///
/// Each list is `(version, name, SQL)` in order; the SQL may hold several `;`-separated
/// statements and uses `{schema}` for the schema of the database it is applied to (PostgreSQL;
/// the database on MySQL; `main` on SQLite), plus whatever the caller's `render` fills in.
#[derive(Debug, Clone, Copy)]
pub struct Migrations<'a> {
    /// The table recording applied versions, beside the tables (a fixed name of the caller's,
    /// never user input), e.g. `inbox_migrations`.
    pub ledger: &'a str,
    /// The name migrators of these tables serialise on (PostgreSQL: a transaction-level
    /// advisory lock on its hash; MySQL: `GET_LOCK` on it and the database's name; SQLite:
    /// `BEGIN IMMEDIATE` serialises every writer).
    pub lock: &'a str,
    /// PostgreSQL's migrations.
    pub postgres: &'a [(i32, &'a str, &'a str)],
    /// SQLite's migrations.
    pub sqlite: &'a [(i32, &'a str, &'a str)],
    /// MySQL's migrations. MySQL commits DDL as it goes, so these run one by one, not in one
    /// transaction: each must be safe to run again whole.
    pub mysql: &'a [(i32, &'a str, &'a str)],
}

impl Database {
    /// Applies the `migrations` this database lacks, in order, in one transaction, recording
    /// each in the ledger; `render` fills the caller's own placeholders first. Safe to run
    /// concurrently (migrators wait for each other) and repeatedly. Upgrades run without a
    /// statement timeout. Returns the versions applied now (empty when up to date).
    pub async fn apply_migrations(
        &self,
        migrations: &Migrations<'_>,
        render: &(dyn Fn(&str) -> String + Sync),
    ) -> Result<Vec<i32>> {
        let ctx = |what: &str| {
            format!(
                "migrating `{}` in {}: {what}",
                migrations.ledger,
                self.place()
            )
        };
        match self {
            Self::Postgres(s) => {
                let err = |what: &str, e| outbox_postgres::map_sqlx_error(&ctx(what), e);
                let mut tx = s.pool().begin().await.map_err(|e| err("begin", e))?;
                sqlx::raw_sql("SET LOCAL statement_timeout = 0")
                    .execute(&mut *tx)
                    .await
                    .map_err(|e| err("settings", e))?;
                sqlx::query("SELECT pg_advisory_xact_lock(hashtext($1))")
                    .bind(migrations.lock)
                    .execute(&mut *tx)
                    .await
                    .map_err(|e| err("lock", e))?;
                let applied = outbox_postgres::apply_pending(
                    &mut tx,
                    s.schema(),
                    migrations.ledger,
                    migrations.postgres,
                    |text| s.schema().render(&render(text)),
                    &ctx,
                )
                .await?;
                tx.commit().await.map_err(|e| err("commit", e))?;
                Ok(applied)
            }
            Self::Sqlite(s) => {
                let err = |what: &str, e| outbox_sqlite::map_sqlx_error(&ctx(what), e);
                let mut tx = outbox_sqlite::begin_immediate(s.pool())
                    .await
                    .map_err(|e| err("begin", e))?;
                let applied = outbox_sqlite::apply_pending(
                    &mut tx,
                    migrations.ledger,
                    migrations.sqlite,
                    |text| sql::render_sqlite(&render(text)),
                    &ctx,
                )
                .await?;
                tx.commit().await.map_err(|e| err("commit", e))?;
                Ok(applied)
            }
            Self::Mysql(s) => {
                outbox_mysql::apply_migrations(
                    s.pool(),
                    s.schema(),
                    migrations.ledger,
                    migrations.lock,
                    migrations.mysql,
                    &|text| s.schema().render(&render(text)),
                )
                .await
            }
        }
    }
}
