//! What the MariaDB test files share: the server's URL and the messages they write.

#![allow(dead_code, clippy::unwrap_used)] // each test file uses its part

use outbox_core::{Message, NewMessage};
use outbox_mysql::{migrate, Schema};
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
