//! Idempotent, versioned migrations of one SQLite database, serialised by `BEGIN IMMEDIATE`.

use outbox_core::Result;
use sqlx::SqlitePool;

use crate::error::map_sqlx_error;
use crate::tables::Tables;

/// Every migration, in order: (version, name, SQL).
pub const MIGRATIONS: &[(i32, &str, &str)] = &[
    (1, "outbox", include_str!("../migrations/0001_outbox.sql")),
    (
        2,
        "member health",
        include_str!("../migrations/0002_member_health.sql"),
    ),
    (
        3,
        "deferred",
        include_str!("../migrations/0003_deferred.sql"),
    ),
    (
        4,
        "redrive audit",
        include_str!("../migrations/0004_redrive_audit.sql"),
    ),
];

/// The schema version this crate's relay and writer need: the last of [`MIGRATIONS`].
pub const SCHEMA_VERSION: i32 = 4;

const MIGRATIONS_TABLE: &str = include_str!("../queries/migrations_table.sql");
const SCHEMA_VERSION_SQL: &str = include_str!("../queries/schema_version.sql");
const MIGRATIONS_LEDGER: &str = include_str!("../queries/migrations_ledger.sql");
const MIGRATIONS_APPLIED: &str = include_str!("../queries/migrations_applied.sql");
const MIGRATIONS_RECORD: &str = include_str!("../queries/migrations_record.sql");

/// Checks that the database file `path` holds the outbox tables at exactly this crate's
/// version; the error says what to do (run `outbox migrate` on that file).
pub async fn check_schema(pool: &SqlitePool, path: &std::path::Path) -> Result<()> {
    let place = format!("database file {}", path.display());
    let migrate = format!("outbox migrate --database-url sqlite://{}", path.display());
    let ctx = |e| map_sqlx_error(&format!("checking {place}"), e);
    let ledger: bool = sqlx::query_scalar(MIGRATIONS_TABLE)
        .fetch_one(pool)
        .await
        .map_err(ctx)?;
    if !ledger {
        return Err(outbox_core::Error::new(
            outbox_core::ErrorKind::Schema,
            format!("{place} has no outbox tables: run {migrate}"),
        ));
    }
    let version: Option<i32> = sqlx::query_scalar(SCHEMA_VERSION_SQL)
        .fetch_one(pool)
        .await
        .map_err(ctx)?;
    match version.unwrap_or(0) {
        v if v < SCHEMA_VERSION => Err(outbox_core::Error::new(
            outbox_core::ErrorKind::Schema,
            format!(
                "{place} holds outbox tables of version {v}; this relay needs version \
                 {SCHEMA_VERSION}: run {migrate}"
            ),
        )),
        v if v > SCHEMA_VERSION => Err(outbox_core::Error::new(
            outbox_core::ErrorKind::Schema,
            format!(
                "{place} holds outbox tables of version {v}, newer than this relay knows \
                 ({SCHEMA_VERSION}): run the newer relay"
            ),
        )),
        _ => Ok(()),
    }
}

/// Applies, in `tx` (begun with `BEGIN IMMEDIATE`, which serialises migrators), the
/// `migrations` that the ledger table `ledger` has not recorded yet, in order, recording each as
/// it goes; creates the ledger first. `render` fills the SQL's placeholders; `ledger` is a
/// table name of the caller's, never user input. The one runner of every SQLite table set (the
/// outbox's, the inbox's), as `outbox_postgres::apply_pending` is on PostgreSQL.
pub async fn apply_pending(
    tx: &mut sqlx::SqliteConnection,
    ledger: &str,
    migrations: &[(i32, &str, &str)],
    render: impl Fn(&str) -> String,
    ctx: &dyn Fn(&str) -> String,
) -> Result<Vec<i32>> {
    let with_ledger = |sql: &str| sql.replace("{ledger}", ledger);
    sqlx::raw_sql(&with_ledger(MIGRATIONS_LEDGER))
        .execute(&mut *tx)
        .await
        .map_err(|e| map_sqlx_error(&ctx(&format!("creating {ledger}")), e))?;
    let done: Vec<i32> = sqlx::query_scalar(&with_ledger(MIGRATIONS_APPLIED))
        .fetch_all(&mut *tx)
        .await
        .map_err(|e| map_sqlx_error(&ctx("reading applied versions"), e))?;
    let mut applied = Vec::new();
    for (version, name, sql) in migrations {
        if done.contains(version) {
            continue;
        }
        sqlx::raw_sql(&render(sql))
            .execute(&mut *tx)
            .await
            .map_err(|e| map_sqlx_error(&ctx(&format!("applying {version} {name}")), e))?;
        sqlx::query(&with_ledger(MIGRATIONS_RECORD))
            .bind(version)
            .bind(name)
            .execute(&mut *tx)
            .await
            .map_err(|e| map_sqlx_error(&ctx("recording the version"), e))?;
        applied.push(*version);
    }
    Ok(applied)
}

/// Applies the migrations the database lacks, all in one transaction, and records them in
/// `outbox_migrations`. Safe to run concurrently (from several processes too) and repeatedly:
/// the transaction starts with `BEGIN IMMEDIATE`, so a second migrator waits for the first
/// (up to the busy timeout) and then finds nothing left to do. Returns the versions applied now
/// (empty when the database was up to date).
pub async fn migrate(pool: &SqlitePool) -> Result<Vec<i32>> {
    migrate_tables(pool, &Tables::default()).await
}

/// [`migrate`] for the table set `tables` (its own `<prefix>_migrations` records the versions),
/// so several outbox table sets can live in one file.
pub async fn migrate_tables(pool: &SqlitePool, tables: &Tables) -> Result<Vec<i32>> {
    let ctx = |what: &str| format!("migrating the SQLite outbox `{}`: {what}", tables.prefix());
    let mut tx = crate::begin_immediate(pool)
        .await
        .map_err(|e| map_sqlx_error(&ctx("begin"), e))?;
    let applied = apply_pending(
        &mut tx,
        &tables.render("outbox_migrations"),
        MIGRATIONS,
        |sql| tables.render(sql),
        &ctx,
    )
    .await?;
    tx.commit()
        .await
        .map_err(|e| map_sqlx_error(&ctx("commit"), e))?;
    Ok(applied)
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    async fn fresh_pool() -> (SqlitePool, std::path::PathBuf) {
        let dir =
            std::env::temp_dir().join(format!("outbox-sqlite-unit-{:016x}", fastrand::u64(..)));
        std::fs::create_dir_all(&dir).unwrap();
        let url = format!("sqlite://{}", dir.join("outbox.db").display());
        let pool = crate::connect_pool(&url).await.unwrap();
        assert_eq!(migrate(&pool).await.unwrap(), vec![1, 2, 3, 4]);
        (pool, dir)
    }

    async fn drop_pool(pool: SqlitePool, dir: std::path::PathBuf) {
        pool.close().await;
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// A name and a maker of the i-th key of that shape.
    type KeyShape = (&'static str, fn(u32) -> String);

    async fn partitions_of(pool: &SqlitePool, keys: &[String]) -> HashSet<i64> {
        let mut tx = pool.begin().await.unwrap();
        for k in keys {
            sqlx::query(
                "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
                 VALUES ('t', ?1, 'e', '{}')",
            )
            .bind(k)
            .execute(&mut *tx)
            .await
            .unwrap();
        }
        let parts: Vec<i64> = sqlx::query_scalar(
            "SELECT partition FROM outbox WHERE aggregate_id IN (SELECT value FROM json_each(?1))",
        )
        .bind(serde_json::to_string(keys).unwrap())
        .fetch_all(&mut *tx)
        .await
        .unwrap();
        tx.rollback().await.unwrap();
        assert!(parts.iter().all(|p| (0..64).contains(p)), "{parts:?}");
        parts.into_iter().collect()
    }

    /// The crude SQL hash spreads typical keys: 200 keys of one shape reach at least 30 of the
    /// 64 partitions, and a key always lands in the same partition.
    #[tokio::test]
    async fn typical_keys_spread_over_many_partitions() {
        let (pool, dir) = fresh_pool().await;
        let shapes: [KeyShape; 6] = [
            ("order-N", |i| format!("order-{i}")),
            ("p-N", |i| format!("p-{i}")),
            ("N", |i| i.to_string()),
            ("uuid", |_| {
                uuid::Uuid::from_u128(fastrand::u128(..)).to_string()
            }),
            ("uuidv7", |_| uuid::Uuid::now_v7().to_string()),
            ("ORD-00000N-EU", |i| format!("ORD-{i:06}-EU")),
        ];
        for (shape, make) in shapes {
            let keys: Vec<String> = (1..=200).map(make).collect();
            let hit = partitions_of(&pool, &keys).await;
            assert!(hit.len() >= 30, "{shape}: only {} partitions", hit.len());
        }
        let once = partitions_of(&pool, &["p-17".to_string()]).await;
        let again = partitions_of(&pool, &["p-17".to_string()]).await;
        assert_eq!(once, again);
        drop_pool(pool, dir).await;
    }

    #[tokio::test]
    async fn migrate_twice_applies_nothing_the_second_time() {
        let (pool, dir) = fresh_pool().await;
        assert!(migrate(&pool).await.unwrap().is_empty());
        let n: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox_partitions")
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(n, 64);
        drop_pool(pool, dir).await;
    }
}
