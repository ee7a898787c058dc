//! The shared store conformance suite against a second table set in one SQLite file: the
//! `outbox` tables are migrated and hold rows of their own, and the store under test serves
//! the `inbox_queue` tables beside them (as the inbox's processing queue does). Every case
//! must pass as on the default tables, and the `outbox` rows must be left alone.

use std::sync::Arc;

use outbox_core::{NewMessage, Store};
use outbox_sqlite::{connect_pool, migrate, migrate_tables, SqliteStore, Tables};
use outbox_testkit::conformance::Fixture;

async fn fresh_store() -> Fixture {
    let dir = std::env::temp_dir().join(outbox_testkit::unique_name("sqlite_prefixed"));
    std::fs::create_dir_all(&dir).expect("create a temporary directory");
    let url = format!("sqlite://{}", dir.join("outbox.db").display());
    let pool = connect_pool(&url).await.expect("open the SQLite file");
    migrate(&pool).await.expect("migrate the outbox");
    let outbox = SqliteStore::new(pool.clone());
    let bystander = NewMessage::new("app", "k", "untouched", serde_json::json!({}));
    outbox
        .insert(std::slice::from_ref(&bystander))
        .await
        .expect("an outbox row");
    let tables = Tables::new("inbox_queue").expect("a valid prefix");
    assert_eq!(
        migrate_tables(&pool, &tables)
            .await
            .expect("migrate the queue"),
        vec![1, 2, 3, 4]
    );
    let store: Arc<dyn Store> = Arc::new(SqliteStore::with_tables(pool.clone(), tables));
    Fixture {
        store,
        teardown: Box::pin(async move {
            let s = outbox.stats().await.expect("outbox stats");
            assert_eq!(
                (s.pending, s.published, s.failed),
                (1, 0, 0),
                "the outbox beside the queue was touched"
            );
            pool.close().await;
            let _ = std::fs::remove_dir_all(&dir);
        }),
    }
}

outbox_testkit::store_conformance_suite!(fresh_store);
