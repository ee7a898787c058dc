//! The transactional writer and `migrate` against the real PostgreSQL: the testkit's writer
//! suite (atomicity, per-key commit order, the raw insert, migrations idempotent and racing, a
//! dropped call), and what only PostgreSQL's writer promises (different keys never wait).

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use outbox_core::{NewMessage, Store};
use outbox_postgres::{connect_pool, migrate, PgStore, Schema, Writer};
use outbox_testkit::writer_suite::WriterBackend;
use sqlx::{PgPool, Postgres, Transaction};

fn url() -> String {
    std::env::var("OUTBOX_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://root@127.0.0.1:5432/test".into())
}

/// A migrated outbox in a schema of its own.
struct Pg {
    pool: PgPool,
    schema: Schema,
    writer: Writer,
}

async fn drop_schema(pool: &PgPool, schema: &Schema) {
    sqlx::raw_sql(&schema.render("DROP SCHEMA {schema} CASCADE"))
        .execute(pool)
        .await
        .unwrap();
}

impl WriterBackend for Pg {
    type Tx = Transaction<'static, Postgres>;

    fn versions() -> Vec<i32> {
        (1..=outbox_postgres::SCHEMA_VERSION).collect()
    }

    async fn start() -> Self {
        let pool = connect_pool(&url(), 4).await.unwrap();
        let schema = Schema::new(&outbox_testkit::unique_name("w")).unwrap();
        migrate(&pool, &schema).await.unwrap();
        let writer = Writer::new(&schema);
        Self {
            pool,
            schema,
            writer,
        }
    }

    async fn teardown(self) {
        drop_schema(&self.pool, &self.schema).await;
    }

    async fn begin(&self) -> Self::Tx {
        self.pool.begin().await.unwrap()
    }

    async fn enqueue(
        &self,
        tx: &mut Self::Tx,
        message: &NewMessage,
    ) -> outbox_core::Result<uuid::Uuid> {
        self.writer.enqueue(tx, message).await
    }

    async fn commit(tx: Self::Tx) {
        tx.commit().await.unwrap();
    }

    async fn rollback(tx: Self::Tx) {
        tx.rollback().await.unwrap();
    }

    async fn ids(&self) -> Vec<uuid::Uuid> {
        sqlx::query_scalar(
            &self
                .schema
                .render("SELECT id FROM {schema}.outbox ORDER BY seq"),
        )
        .fetch_all(&self.pool)
        .await
        .unwrap()
    }

    async fn execute(&self, sql: &str) {
        sqlx::raw_sql(&self.schema.render(sql))
            .execute(&self.pool)
            .await
            .unwrap();
    }

    fn store(&self) -> Arc<dyn Store> {
        Arc::new(PgStore::new(self.pool.clone(), self.schema.clone()))
    }

    async fn migrate(&self) -> Vec<i32> {
        migrate(&self.pool, &self.schema).await.unwrap()
    }

    async fn migrate_racing(&self) -> (Vec<i32>, Vec<i32>) {
        let other = Schema::new(&outbox_testkit::unique_name("w")).unwrap();
        let second = connect_pool(&url(), 2).await.unwrap();
        let (a, b) = tokio::join!(migrate(&self.pool, &other), migrate(&second, &other));
        second.close().await;
        drop_schema(&self.pool, &other).await;
        (a.unwrap(), b.unwrap())
    }
}

outbox_testkit::writer_suite!(Pg);

/// PostgreSQL's writer locks the key only: a transaction holding one key does not hold back
/// another's (SQLite has one writer for the whole file; MySQL's counters are per partition,
/// tested in its own `writer.rs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn different_keys_do_not_wait_for_each_other() {
    let b = Pg::start().await;
    let mut t1 = b.begin().await;
    b.enqueue(
        &mut t1,
        &NewMessage::new("acct", "x", "e", serde_json::json!({})),
    )
    .await
    .unwrap();
    let mut t2 = b.begin().await;
    tokio::time::timeout(
        Duration::from_secs(5),
        b.enqueue(
            &mut t2,
            &NewMessage::new("acct", "y", "e", serde_json::json!({})),
        ),
    )
    .await
    .expect("another key must not block")
    .unwrap();
    t2.commit().await.unwrap();
    t1.commit().await.unwrap();
    b.teardown().await;
}
