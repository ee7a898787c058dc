//! Shared helpers: a PostgreSQL inbox in schemas of its own (random suffix) on the machine's
//! server, a SQLite inbox in a file of its own, and waiting.

#![allow(dead_code, clippy::unwrap_used)] // each test binary uses a different subset

use std::time::{Duration, Instant};

use outbox_inbox::InboxSchema;
use sqlx::{PgPool, SqlitePool};

pub fn database_url() -> String {
    std::env::var("OUTBOX_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://root@127.0.0.1:5432/test".into())
}

pub fn nats_url() -> String {
    std::env::var("OUTBOX_TEST_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into())
}

pub fn redis_url() -> String {
    std::env::var("OUTBOX_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

/// A migrated PostgreSQL inbox in `<name>` and `<name>_inbox`, with a table `effects` for
/// handlers to write to.
pub struct Pg {
    pub pool: PgPool,
    pub schema: InboxSchema,
    pub name: String,
}

impl Pg {
    pub async fn new() -> Self {
        let name = outbox_testkit::unique_name("inbox");
        let pool = outbox_postgres::connect_pool(&database_url(), 16)
            .await
            .expect("PostgreSQL must be running");
        let schema = InboxSchema::new(&name).unwrap();
        assert_eq!(
            outbox_inbox::migrate_postgres(&pool, &schema)
                .await
                .unwrap(),
            vec![1]
        );
        assert!(outbox_inbox::migrate_postgres(&pool, &schema)
            .await
            .unwrap()
            .is_empty());
        sqlx::raw_sql(&format!(
            "CREATE TABLE {name}.effects (
                 n          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                 message_id uuid   NOT NULL,
                 key        text   NOT NULL,
                 value      bigint NOT NULL)"
        ))
        .execute(&pool)
        .await
        .unwrap();
        Self { pool, schema, name }
    }

    /// `(message_id, key, value)` of every effect, in the order they were applied.
    pub async fn effects(&self) -> Vec<(uuid::Uuid, String, i64)> {
        sqlx::query_as(&format!(
            "SELECT message_id, key, value FROM {}.effects ORDER BY n",
            self.name
        ))
        .fetch_all(&self.pool)
        .await
        .unwrap()
    }

    pub async fn scalar(&self, sql: &str) -> i64 {
        sqlx::query_scalar(
            &sql.replace("{schema}", &self.name)
                .replace("{queue}", self.schema.queue().as_str()),
        )
        .fetch_one(&self.pool)
        .await
        .unwrap()
    }

    pub async fn drop_all(self) {
        let _ = sqlx::raw_sql(&format!(
            "DROP SCHEMA IF EXISTS {0} CASCADE; DROP SCHEMA IF EXISTS {0}_inbox CASCADE",
            self.name
        ))
        .execute(&self.pool)
        .await;
    }
}

/// A migrated SQLite inbox in a file of its own, with the same `effects` table.
pub struct Lite {
    pub pool: SqlitePool,
    pub dir: std::path::PathBuf,
    pub url: String,
}

impl Lite {
    pub async fn new() -> Self {
        let dir = std::env::temp_dir().join(outbox_testkit::unique_name("inbox_sqlite"));
        std::fs::create_dir_all(&dir).unwrap();
        let url = format!("sqlite://{}", dir.join("inbox.db").display());
        let pool = outbox_sqlite::connect_pool(&url).await.unwrap();
        assert_eq!(outbox_inbox::migrate_sqlite(&pool).await.unwrap(), vec![1]);
        assert!(outbox_inbox::migrate_sqlite(&pool)
            .await
            .unwrap()
            .is_empty());
        sqlx::raw_sql(
            "CREATE TABLE effects (
                 n          INTEGER PRIMARY KEY AUTOINCREMENT,
                 message_id TEXT    NOT NULL,
                 key        TEXT    NOT NULL,
                 value      INTEGER NOT NULL)",
        )
        .execute(&pool)
        .await
        .unwrap();
        Self { pool, dir, url }
    }

    pub async fn effects(&self) -> Vec<(uuid::Uuid, String, i64)> {
        let rows: Vec<(String, String, i64)> =
            sqlx::query_as("SELECT message_id, key, value FROM effects ORDER BY n")
                .fetch_all(&self.pool)
                .await
                .unwrap();
        rows.into_iter()
            .map(|(id, k, v)| (id.parse().unwrap(), k, v))
            .collect()
    }

    pub async fn scalar(&self, sql: &str) -> i64 {
        sqlx::query_scalar(sql).fetch_one(&self.pool).await.unwrap()
    }

    pub async fn drop_all(self) {
        self.pool.close().await;
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Polls `check` every 20 ms until it is true, or panics after `limit` naming `what`.
pub async fn wait_for<F, Fut>(limit: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    while !check().await {
        assert!(
            Instant::now() < deadline,
            "timed out after {limit:?}: {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
