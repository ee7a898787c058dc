//! The shared store conformance suite against SQLite; each case in a fresh database file of
//! its own, in a unique temporary directory.

use std::sync::Arc;

use outbox_core::Store;
use outbox_sqlite::{connect_pool, migrate, SqliteStore};
use outbox_testkit::conformance::Fixture;

async fn fresh_store() -> Fixture {
    let dir = std::env::temp_dir().join(outbox_testkit::unique_name("sqlite"));
    std::fs::create_dir_all(&dir).expect("create a temporary directory");
    let url = format!("sqlite://{}", dir.join("outbox.db").display());
    let pool = connect_pool(&url).await.expect("open the SQLite file");
    migrate(&pool).await.expect("migrate");
    let store: Arc<dyn Store> = Arc::new(SqliteStore::new(pool.clone()));
    Fixture {
        store,
        teardown: Box::pin(async move {
            pool.close().await;
            let _ = std::fs::remove_dir_all(&dir);
        }),
    }
}

outbox_testkit::store_conformance_suite!(fresh_store);
