//! What the MariaDB test files share: the server's URL and the messages they write.

#![allow(dead_code, clippy::unwrap_used)] // each test file uses its part

use outbox_core::{Message, NewMessage};

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
