//! The transactional writer against the real PostgreSQL: atomicity and per-key commit order.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use outbox_core::NewMessage;
use outbox_postgres::{connect_pool, migrate, Schema, Writer};
use sqlx::PgPool;

async fn setup() -> (PgPool, Schema) {
    let url = std::env::var("OUTBOX_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://root@127.0.0.1:5432/test".into());
    let pool = connect_pool(&url, 4).await.unwrap();
    let schema = Schema::new(&outbox_testkit::unique_name("w")).unwrap();
    migrate(&pool, &schema).await.unwrap();
    (pool, schema)
}

async fn teardown(pool: &PgPool, schema: &Schema) {
    sqlx::raw_sql(&schema.render("DROP SCHEMA {schema} CASCADE"))
        .execute(pool)
        .await
        .unwrap();
}

#[tokio::test]
async fn rolled_back_enqueue_leaves_no_row_and_committed_one_stays() {
    let (pool, schema) = setup().await;
    let w = Writer::new(&schema);
    let mut tx = pool.begin().await.unwrap();
    w.enqueue(
        &mut tx,
        &NewMessage::new("a", "1", "e", serde_json::json!({})),
    )
    .await
    .unwrap();
    tx.rollback().await.unwrap();
    let mut tx = pool.begin().await.unwrap();
    let id = w
        .enqueue(
            &mut tx,
            &NewMessage::new("a", "2", "e", serde_json::json!({})),
        )
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let ids: Vec<uuid::Uuid> = sqlx::query_scalar(&schema.render("SELECT id FROM {schema}.outbox"))
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(ids, vec![id]);
    teardown(&pool, &schema).await;
}

/// Two transactions writing the same key: the one that commits first gets the smaller `seq`,
/// even though the other one started its insert first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn same_key_transactions_get_sequences_in_commit_order() {
    let (pool, schema) = setup().await;
    let w = Writer::new(&schema);
    let first = NewMessage::new("acct", "k", "debited", serde_json::json!({"n": 1}));
    let second = NewMessage::new("acct", "k", "debited", serde_json::json!({"n": 2}));
    // Built so that insert order and commit order would differ: t1 inserts first, t2 inserts
    // and commits while t1 is open, then t1 commits. The key lock makes t2's insert wait until
    // t1 committed, so t2 draws the larger seq. t1 raises a flag just before it commits: t2's
    // insert must return only after that (without the lock it returns at once, and t2 commits
    // first holding the larger seq, so seq order would not be commit order).
    let t1_committing = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut t1 = pool.begin().await.unwrap();
    w.enqueue(&mut t1, &first).await.unwrap();
    let (pool2, w2, second2, flag) = (
        pool.clone(),
        w.clone(),
        second.clone(),
        t1_committing.clone(),
    );
    let t2 = tokio::spawn(async move {
        let mut t2 = pool2.begin().await.unwrap();
        w2.enqueue(&mut t2, &second2).await.unwrap();
        let waited = flag.load(std::sync::atomic::Ordering::SeqCst);
        t2.commit().await.unwrap();
        waited
    });
    // Room for t2 to go first, if anything let it.
    tokio::time::sleep(Duration::from_millis(300)).await;
    t1_committing.store(true, std::sync::atomic::Ordering::SeqCst);
    t1.commit().await.unwrap();
    assert!(
        t2.await.unwrap(),
        "the second writer of a key waits for the first to commit"
    );
    let order: Vec<uuid::Uuid> =
        sqlx::query_scalar(&schema.render("SELECT id FROM {schema}.outbox ORDER BY seq"))
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(
        order,
        vec![first.id, second.id],
        "seq order must be commit order"
    );
    teardown(&pool, &schema).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn different_keys_do_not_wait_for_each_other() {
    let (pool, schema) = setup().await;
    let w = Writer::new(&schema);
    let mut t1 = pool.begin().await.unwrap();
    w.enqueue(
        &mut t1,
        &NewMessage::new("acct", "x", "e", serde_json::json!({})),
    )
    .await
    .unwrap();
    let mut t2 = pool.begin().await.unwrap();
    tokio::time::timeout(
        Duration::from_secs(5),
        w.enqueue(
            &mut t2,
            &NewMessage::new("acct", "y", "e", serde_json::json!({})),
        ),
    )
    .await
    .expect("another key must not block")
    .unwrap();
    t2.commit().await.unwrap();
    t1.commit().await.unwrap();
    teardown(&pool, &schema).await;
}

#[tokio::test]
async fn migrate_is_idempotent() {
    let (pool, schema) = setup().await;
    assert!(migrate(&pool, &schema).await.unwrap().is_empty());
    teardown(&pool, &schema).await;
}
