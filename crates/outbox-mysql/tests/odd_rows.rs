//! Rows that do not hold what the SQL contract says, on both routes, against real MariaDB
//! servers (this machine's, and the one with the row binlog on 127.0.0.1:3307): an `id` that is
//! not a UUID (a ULID) and a zero `created_at` (MariaDB's default `sql_mode` stores one). Each
//! such row ends `failed` alone with its column named, its key's later messages wait behind it,
//! and every other key keeps flowing. Since migration 4 the server refuses such rows; these are
//! written as rows from before it were (`check_constraint_checks = 0`).

#![allow(clippy::unwrap_used)] // tests

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use outbox_core::{ClaimLimits, MemberId, OnFailed, Outcome, Store};
use outbox_mysql::binlog::route;
use outbox_mysql::{MysqlStore, Schema};
use sqlx::MySqlPool;

mod common;

fn binlog_url() -> String {
    std::env::var("OUTBOX_TEST_MYSQL_BINLOG_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3307/test".into())
}

/// `key`'s row carrying `n`, as a plain insert writes it; `id` and `created_at` as given
/// (`None`: the defaults).
async fn insert(
    conn: &mut sqlx::MySqlConnection,
    schema: &Schema,
    key: &str,
    n: u64,
    id: Option<&str>,
    created_at: Option<&str>,
) -> i64 {
    sqlx::query(&schema.render(
        "INSERT INTO {schema}.outbox (id, aggregate_type, aggregate_id, event_type, payload, created_at) \
         VALUES (COALESCE(?, CAST(UUID() AS CHAR)), 'order', ?, 'placed', JSON_OBJECT('n', ?), \
         COALESCE(?, UTC_TIMESTAMP(6)))",
    ))
    .bind(id)
    .bind(key)
    .bind(n)
    .bind(created_at)
    .execute(&mut *conn)
    .await
    .unwrap()
    .last_insert_id() as i64
}

/// Writes the odd rows and the good ones, relays until every good key's messages went out
/// (published as they come), and checks what ended `failed` and what waited.
async fn odd_rows_fail_alone(store: Arc<MysqlStore>, pool: &MySqlPool, schema: &Schema) {
    let mut conn = pool.acquire().await.unwrap();
    // Migration 4's checks refuse these now; rows from before it are what this is about.
    for (id, at) in [
        ("01HZX3K9QW7N2M5R8T1V4Y6B0C", "2026-12-06 10:00:00"),
        (
            "5f0c2a8e-3b1d-4c7e-9a2f-1d3e5b7c9a0b",
            "0000-00-00 00:00:00",
        ),
        (
            "5f0c2a8e-3b1d-4c7e-9a2f-1d3e5b7c9a0b",
            "2026-00-10 00:00:00",
        ),
    ] {
        let refused = sqlx::query(&schema.render(
            "INSERT INTO {schema}.outbox (id, aggregate_type, aggregate_id, event_type, payload, created_at) \
             VALUES (?, 'order', 'x', 'placed', '{}', ?)",
        ))
        .bind(id)
        .bind(at)
        .execute(&mut *conn)
        .await;
        assert!(refused.is_err(), "migration 4 refuses id {id} at {at}");
    }
    sqlx::raw_sql("SET SESSION check_constraint_checks = 0")
        .execute(&mut *conn)
        .await
        .unwrap();
    let ulid = insert(
        &mut conn,
        schema,
        "odd-id",
        1,
        Some("01HZX3K9QW7N2M5R8T1V4Y6B0C"),
        None,
    )
    .await;
    let zero = insert(
        &mut conn,
        schema,
        "odd-date",
        2,
        None,
        Some("0000-00-00 00:00:00"),
    )
    .await;
    // The odd keys' next messages, and other keys before and after.
    let behind = insert(&mut conn, schema, "odd-id", 3, None, None).await;
    let mut good = BTreeSet::new();
    for n in 10..40u64 {
        let seq = insert(&mut conn, schema, &format!("good-{}", n % 7), n, None, None).await;
        good.insert(seq);
    }
    drop(conn);

    let member = MemberId::random("odd");
    let until = Instant::now() + Duration::from_secs(30);
    let mut published = BTreeSet::new();
    while !good.is_subset(&published) {
        assert!(
            Instant::now() < until,
            "the good keys stopped: {} of {} published",
            good.intersection(&published).count(),
            good.len()
        );
        let parts = store
            .rebalance(&member, Duration::from_secs(30))
            .await
            .unwrap();
        let batch = store
            .claim(&member, &parts, ClaimLimits::rows(7), OnFailed::Block)
            .await
            .expect("a claim succeeds whatever the rows hold");
        if batch.is_empty() {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        }
        let outcomes: Vec<Outcome> = batch
            .iter()
            .map(|m| Outcome::Published { seq: m.seq })
            .collect();
        store.complete(&member, &outcomes).await.unwrap();
        published.extend(batch.iter().map(|m| m.seq));
    }
    assert!(!published.contains(&ulid) && !published.contains(&zero));
    assert!(
        !published.contains(&behind),
        "a key's later message waits behind its failed one"
    );
    let failed = store.failed(10).await.unwrap();
    let error_of = |seq: i64| {
        failed
            .iter()
            .find(|f| f.seq == seq)
            .and_then(|f| f.last_error.clone())
            .unwrap_or_else(|| panic!("row {seq} is not failed: {failed:?}"))
    };
    let e = error_of(ulid);
    assert!(
        e.contains("`id`") && e.contains("01HZX3K9QW7N2M5R8T1V4Y6B0C"),
        "{e}"
    );
    let e = error_of(zero);
    assert!(e.contains("`created_at`"), "{e}");
    store.release(&member).await.unwrap();
}

#[tokio::test]
async fn odd_rows_fail_alone_with_their_column_named_on_the_trigger_route() {
    outbox_testkit::init_test_log();
    let (pool, schema) = common::migrated_outbox(&common::server_url(), 8).await;
    let store = Arc::new(MysqlStore::new(pool.clone(), schema.clone()));
    odd_rows_fail_alone(store, &pool, &schema).await;
    sqlx::raw_sql(&schema.render("DROP DATABASE {schema}"))
        .execute(&pool)
        .await
        .unwrap();
}

#[tokio::test]
async fn odd_rows_fail_alone_with_their_column_named_on_the_binlog_route() {
    outbox_testkit::init_test_log();
    let (pool, schema) = common::migrated_outbox(&binlog_url(), 8).await;
    route::enable(&pool, &schema).await.unwrap();
    let store = Arc::new(MysqlStore::binlog(pool.clone(), schema.clone(), &binlog_url()).unwrap());
    odd_rows_fail_alone(store.clone(), &pool, &schema).await;
    store.sequencer().unwrap().stop().await;
    sqlx::raw_sql(&schema.render("DROP DATABASE {schema}"))
        .execute(&pool)
        .await
        .unwrap();
}
