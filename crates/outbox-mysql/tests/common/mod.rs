//! What the MariaDB test files share: the server's URL and the messages they write.

#![allow(dead_code, clippy::unwrap_used)] // each test file uses its part

use std::time::{Duration, Instant};

use outbox_core::{ClaimLimits, MemberId, Message, NewMessage, OnFailed, Outcome, Store};
use outbox_mysql::binlog::route;
use outbox_mysql::{migrate, MysqlStore, Schema};
use sqlx::mysql::MySqlPoolOptions;
use sqlx::MySqlPool;

/// The test server (`OUTBOX_TEST_MYSQL_URL`, default this machine's MariaDB).
pub fn server_url() -> String {
    std::env::var("OUTBOX_TEST_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into())
}

/// A message of `key` whose payload carries its number `n`.
pub fn msg(key: &str, n: u64) -> NewMessage {
    NewMessage::new("order", key, "placed", serde_json::json!({ "n": n }))
}

/// The number a [`msg`] carries.
pub fn n_of(m: &Message) -> u64 {
    serde_json::from_slice::<serde_json::Value>(&m.payload).unwrap()["n"]
        .as_u64()
        .unwrap()
}

/// A pool of at most `max_connections` to `url` and an outbox migrated in a database of its own
/// (a random name), so tests run in parallel.
pub async fn migrated_outbox(url: &str, max_connections: u32) -> (MySqlPool, Schema) {
    let pool = MySqlPoolOptions::new()
        .max_connections(max_connections)
        .connect(url)
        .await
        .unwrap_or_else(|e| {
            panic!("MariaDB at {url} must be running (scripts/services.sh starts it): {e}")
        });
    let schema = Schema::new(&outbox_testkit::unique_name("outbox")).unwrap();
    assert_eq!(migrate(&pool, &schema).await.unwrap(), vec![1, 2, 3, 4]);
    (pool, schema)
}

/// [`migrated_outbox`] with the binlog route switched on (`url` a server with the row binlog).
pub async fn routed_outbox(url: &str) -> (MySqlPool, Schema) {
    outbox_testkit::init_test_log();
    let (pool, schema) = migrated_outbox(url, 8).await;
    route::enable(&pool, &schema).await.unwrap();
    (pool, schema)
}

/// Drops a test's database (its sessions should have ended first).
pub async fn drop_db(pool: &MySqlPool, schema: &Schema) {
    let _ = sqlx::raw_sql(&schema.render("DROP DATABASE {schema}"))
        .execute(pool)
        .await;
}

/// Everything the store hands out until it has `want` messages (published as they come), or
/// panics after 30 s.
pub async fn drain(store: &MysqlStore, want: usize) -> Vec<Message> {
    let member = MemberId::random("drain");
    let until = Instant::now() + Duration::from_secs(30);
    let mut got = Vec::new();
    while got.len() < want {
        assert!(
            Instant::now() < until,
            "only {} of {want} messages came",
            got.len()
        );
        let parts = store
            .rebalance(&member, Duration::from_secs(30))
            .await
            .unwrap();
        let batch = store
            .claim(&member, &parts, ClaimLimits::rows(1_000), OnFailed::Block)
            .await
            .unwrap();
        if batch.is_empty() {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        }
        let outcomes: Vec<Outcome> = batch
            .iter()
            .map(|m| Outcome::Published { seq: m.seq })
            .collect();
        store.complete(&member, &outcomes).await.unwrap();
        got.extend(batch);
    }
    store.release(&member).await.unwrap();
    got
}
