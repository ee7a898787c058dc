//! The shared store conformance suite, run against the real MariaDB on this machine; each case
//! in a database of its own, dropped afterwards.

use std::sync::Arc;

use outbox_core::Store;
use outbox_mysql::{connect_pool, migrate, MysqlStore, Schema};
use outbox_testkit::conformance::Fixture;

mod common;
use common::server_url;

async fn fresh_store() -> Fixture {
    let pool = connect_pool(&server_url(), 4)
        .await
        .expect("MariaDB must be running for these tests (scripts/services.sh checks it)");
    let schema = Schema::new(&outbox_testkit::unique_name("conf")).expect("valid database name");
    migrate(&pool, &schema).await.expect("migrate");
    let store: Arc<dyn Store> = Arc::new(MysqlStore::new(pool.clone(), schema.clone()));
    Fixture {
        store,
        teardown: Box::pin(async move {
            let _ = sqlx::raw_sql(&schema.render("DROP DATABASE {schema}"))
                .execute(&pool)
                .await;
        }),
    }
}

outbox_testkit::store_conformance_suite!(fresh_store);
