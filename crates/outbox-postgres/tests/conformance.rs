//! The shared store conformance suite, run against the real PostgreSQL on this machine; each
//! case in a schema of its own, dropped afterwards.

use std::sync::Arc;

use outbox_core::Store;
use outbox_postgres::{connect_pool, migrate, PgStore, Schema};
use outbox_testkit::conformance::Fixture;

fn database_url() -> String {
    std::env::var("OUTBOX_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://root@127.0.0.1:5432/test".into())
}

async fn fresh_store() -> Fixture {
    let pool = connect_pool(&database_url(), 4)
        .await
        .expect("PostgreSQL must be running for these tests");
    let schema = Schema::new(&outbox_testkit::unique_name("conf")).expect("valid schema");
    migrate(&pool, &schema).await.expect("migrate");
    let store: Arc<dyn Store> = Arc::new(PgStore::new(pool.clone(), schema.clone()));
    Fixture {
        store,
        teardown: Box::pin(async move {
            let _ = sqlx::raw_sql(&schema.render("DROP SCHEMA {schema} CASCADE"))
                .execute(&pool)
                .await;
        }),
    }
}

outbox_testkit::store_conformance_suite!(fresh_store);
