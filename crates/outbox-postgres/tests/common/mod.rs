//! Helpers shared by the PostgreSQL engine tests: a migrated schema of its own per test, a
//! message maker, and a drain that claims and publishes everything claimable.

// Each test binary uses some of these.
#![allow(dead_code)]

pub mod cdc;

use std::sync::Arc;

use outbox_core::{ClaimLimits, MemberId, NewMessage, OnFailed, Outcome, Store};
use outbox_postgres::{connect_pool, migrate, PgStore, Schema};
use sqlx::PgPool;

pub fn database_url() -> String {
    std::env::var("OUTBOX_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://root@127.0.0.1:5432/test".into())
}

pub async fn setup(tag: &str) -> (PgPool, Schema, Arc<PgStore>) {
    let pool = connect_pool(&database_url(), 6)
        .await
        .expect("PostgreSQL must be running for these tests");
    let schema = Schema::new(&outbox_testkit::unique_name(tag)).unwrap();
    migrate(&pool, &schema).await.unwrap();
    let store = Arc::new(PgStore::new(pool.clone(), schema.clone()));
    (pool, schema, store)
}

pub async fn teardown(pool: &PgPool, schema: &Schema) {
    let _ = sqlx::raw_sql(&schema.render("DROP SCHEMA {schema} CASCADE"))
        .execute(pool)
        .await;
}

pub fn msg(key: &str, n: u32) -> NewMessage {
    NewMessage::new("order", key, "placed", serde_json::json!({ "n": n }))
}

/// Claims everything claimable and publishes it, returning the ids in claim order. Stops after
/// two empty claims in a row: an empty claim may have closed a window read to its end, and the
/// next one opens the window after it.
pub async fn drain(store: &Arc<PgStore>, m: &MemberId, parts: &[i32]) -> Vec<uuid::Uuid> {
    let mut ids = Vec::new();
    let mut empty = 0;
    loop {
        let got = store
            .claim(m, parts, ClaimLimits::rows(1000), OnFailed::Block)
            .await
            .unwrap();
        if got.is_empty() {
            // A claim that stepped over all it may of rows not yet committed reads on next time.
            if store.more_to_read(m) {
                continue;
            }
            empty += 1;
            if empty == 2 {
                return ids;
            }
            continue;
        }
        empty = 0;
        let outcomes: Vec<_> = got
            .iter()
            .map(|r| Outcome::Published { seq: r.seq })
            .collect();
        store.complete(m, &outcomes).await.unwrap();
        ids.extend(got.iter().map(|r| r.id));
    }
}

/// Publishes `got` and records it.
pub async fn publish_all(store: &Arc<PgStore>, m: &MemberId, got: &[outbox_core::Message]) {
    let outcomes: Vec<_> = got
        .iter()
        .map(|r| Outcome::Published { seq: r.seq })
        .collect();
    store.complete(m, &outcomes).await.unwrap();
}

/// The buffers a claim of `rows` per partition reads, from EXPLAIN (ANALYZE, BUFFERS) of the
/// very statement the store runs for member `m`, with its settings (the generic plan a relay
/// settles on).
pub async fn claim_buffers(store: &PgStore, m: &MemberId, parts: &[i32], rows: usize) -> i64 {
    let plan = store.explain_claim(m, parts, rows, true).await.unwrap();
    let root = &plan[0]["Plan"];
    root["Shared Hit Blocks"].as_i64().unwrap_or(0)
        + root["Shared Read Blocks"].as_i64().unwrap_or(0)
}
