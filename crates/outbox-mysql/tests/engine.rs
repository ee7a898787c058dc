//! What only InnoDB does to the store, against the real MariaDB of this machine, each test in a
//! database of its own: a writer's transaction in progress across claims, a rollback, a
//! `REPEATABLE READ` snapshot held open beside the relay, and skewed keys after `ANALYZE TABLE`.

#![allow(clippy::unwrap_used)] // tests

use std::collections::HashMap;
use std::time::Duration;

use outbox_core::{ClaimLimits, MemberId, NewMessage, OnFailed, Outcome, Store};
use outbox_mysql::{connect_pool, enqueue, enqueue_many, migrate, MysqlStore, Schema};
use sqlx::{Connection, MySqlConnection};

mod common;
use common::{msg, n_of, server_url};

struct Db {
    store: MysqlStore,
    member: MemberId,
    parts: Vec<i32>,
}

impl Db {
    async fn start() -> Self {
        let pool = connect_pool(&server_url(), 8).await.unwrap();
        let schema = Schema::new(&outbox_testkit::unique_name("eng")).unwrap();
        migrate(&pool, &schema).await.unwrap();
        let store = MysqlStore::new(pool, schema);
        let member = MemberId::random("engine");
        let parts = store
            .rebalance(&member, Duration::from_secs(60))
            .await
            .unwrap();
        assert_eq!(parts.len(), 64);
        Self {
            store,
            member,
            parts,
        }
    }

    /// Claims once and records every message as published; returns them.
    async fn drain_once(&self, rows: usize) -> Vec<outbox_core::Message> {
        let got = self
            .store
            .claim(
                &self.member,
                &self.parts,
                ClaimLimits::rows(rows),
                OnFailed::Block,
            )
            .await
            .unwrap();
        if !got.is_empty() {
            let outcomes: Vec<_> = got
                .iter()
                .map(|m| Outcome::Published { seq: m.seq })
                .collect();
            assert_eq!(
                self.store.complete(&self.member, &outcomes).await.unwrap(),
                got.len() as u64
            );
        }
        got
    }

    /// A connection of its own (the default `REPEATABLE READ`, as an application's).
    async fn app_connection(&self) -> MySqlConnection {
        MySqlConnection::connect(&server_url()).await.unwrap()
    }

    fn sql(&self, sql: &str) -> String {
        self.store.schema().render(sql)
    }

    async fn drop(self) {
        sqlx::raw_sql(&self.sql("DROP DATABASE {schema}"))
            .execute(self.store.pool())
            .await
            .unwrap();
    }
}

/// A writer's transaction still open across claims: other partitions flow past it, its row is
/// invisible and is not skipped, and it goes out once the transaction commits.
#[tokio::test]
async fn a_transaction_in_progress_across_claims_is_neither_skipped_nor_waited_for() {
    let db = Db::start().await;
    let mut open = db.store.pool().begin().await.unwrap();
    enqueue(&mut open, db.store.schema(), &msg("slow", 1))
        .await
        .unwrap();
    // Keys in other partitions commit meanwhile (a key hashing with `slow` would wait for it).
    let slow_part = crc_part("slow");
    let others: Vec<String> = (0..200)
        .map(|i| format!("fast-{i}"))
        .filter(|k| crc_part(k) != slow_part)
        .take(20)
        .collect();
    for (i, k) in others.iter().enumerate() {
        let mut tx = db.store.pool().begin().await.unwrap();
        enqueue(&mut tx, db.store.schema(), &msg(k, i as u64))
            .await
            .unwrap();
        tx.commit().await.unwrap();
    }
    let first = db.drain_once(1000).await;
    assert_eq!(first.len(), others.len());
    assert!(first.iter().all(|m| m.aggregate_id != "slow"));
    assert!(db.drain_once(1000).await.is_empty(), "nothing else visible");
    open.commit().await.unwrap();
    let late = db.drain_once(1000).await;
    assert_eq!(
        late.iter()
            .map(|m| m.aggregate_id.as_str())
            .collect::<Vec<_>>(),
        vec!["slow"]
    );
    let s = db.store.stats().await.unwrap();
    assert_eq!((s.pending, s.published), (0, others.len() as i64 + 1));
    db.drop().await;
}

/// A rolled-back message is never handed out, and the next one of its partition is (its
/// position was given back, so there is no gap to wait at).
#[tokio::test]
async fn a_rolled_back_message_is_never_handed_out_and_leaves_no_gap() {
    let db = Db::start().await;
    let mut tx = db.store.pool().begin().await.unwrap();
    enqueue(&mut tx, db.store.schema(), &msg("k", 1))
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    assert!(db.drain_once(100).await.is_empty());
    db.store.insert(&[msg("k", 2)]).await.unwrap();
    let got = db.drain_once(100).await;
    assert_eq!(got.iter().map(n_of).collect::<Vec<_>>(), vec![2]);
    db.drop().await;
}

/// An application session holding a `REPEATABLE READ` snapshot (InnoDB's default isolation, a
/// forgotten transaction) does not hide new messages from the relay, whose sessions read
/// committed rows.
#[tokio::test]
async fn a_held_repeatable_read_snapshot_hides_nothing_from_the_relay() {
    let db = Db::start().await;
    let mut app = db.app_connection().await;
    let isolation: String = sqlx::query_scalar("SELECT CAST(@@tx_isolation AS CHAR)")
        .fetch_one(&mut app)
        .await
        .unwrap();
    assert_eq!(isolation, "REPEATABLE-READ");
    sqlx::raw_sql("START TRANSACTION WITH CONSISTENT SNAPSHOT")
        .execute(&mut app)
        .await
        .unwrap();
    let before: i64 = sqlx::query_scalar(&db.sql("SELECT COUNT(*) FROM {schema}.outbox"))
        .fetch_one(&mut app)
        .await
        .unwrap();
    assert_eq!(before, 0);
    let msgs: Vec<_> = (0..300).map(|i| msg(&format!("k{}", i % 30), i)).collect();
    db.store.insert(&msgs).await.unwrap();
    let mut delivered = 0;
    for _ in 0..10 {
        delivered += db.drain_once(100).await.len();
    }
    assert_eq!(delivered, 300);
    // The snapshot still sees the table as it was: it really was held.
    let during: i64 = sqlx::query_scalar(&db.sql("SELECT COUNT(*) FROM {schema}.outbox"))
        .fetch_one(&mut app)
        .await
        .unwrap();
    assert_eq!(during, 0);
    sqlx::raw_sql("ROLLBACK").execute(&mut app).await.unwrap();
    db.drop().await;
}

/// One hot key, ten keys and a thousand keys, statistics refreshed with `ANALYZE TABLE`: the
/// window read stays an index range on `(part, part_seq)`, and every key drains in order.
#[tokio::test]
async fn skewed_keys_after_analyze_drain_in_order_on_the_position_index() {
    let db = Db::start().await;
    for keys in [1usize, 10, 1000] {
        let msgs: Vec<_> = (0..3000u64)
            .map(|i| msg(&format!("k{keys}-{}", i as usize % keys), i))
            .collect();
        let mut tx = db.store.pool().begin().await.unwrap();
        enqueue_many(&mut tx, db.store.schema(), &msgs)
            .await
            .unwrap();
        tx.commit().await.unwrap();
    }
    sqlx::raw_sql(&db.sql("ANALYZE TABLE {schema}.outbox"))
        .execute(db.store.pool())
        .await
        .unwrap();
    // The statement's shape, as the claim builds it for two partitions.
    let rows = sqlx::query(&db.sql(
        "EXPLAIN SELECT o.seq FROM {schema}.outbox AS o \
         WHERE (o.part = 3 AND o.part_seq BETWEEN 1 AND 500) \
            OR (o.part = 9 AND o.part_seq BETWEEN 40 AND 540)",
    ))
    .fetch_all(db.store.pool())
    .await
    .unwrap();
    let plan: Vec<(Option<String>, Option<String>)> = rows
        .iter()
        .map(|r| {
            use sqlx::Row;
            (
                r.try_get::<Option<String>, _>("type").unwrap(),
                r.try_get::<Option<String>, _>("key").unwrap(),
            )
        })
        .collect();
    assert_eq!(
        plan,
        vec![(Some("range".into()), Some("outbox_part_seq".into()))]
    );
    let mut last: HashMap<String, u64> = HashMap::new();
    let mut total = 0;
    loop {
        let got = db.drain_once(1000).await;
        if got.is_empty() {
            break;
        }
        for m in &got {
            let n = n_of(m);
            if let Some(prev) = last.insert(m.aggregate_id.clone(), n) {
                assert!(prev < n, "key {} went {prev} then {n}", m.aggregate_id);
            }
        }
        total += got.len();
    }
    assert_eq!(total, 9000);
    db.drop().await;
}

/// The partition the trigger gives `key`.
fn crc_part(key: &str) -> u32 {
    crc32(key.as_bytes()) % 64
}

/// CRC-32 (IEEE), as MySQL's `CRC32()`.
fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// A claim's byte bound is shared round-robin among the partitions, not spent in seq order: with
/// room for four payloads, two keys in two partitions, each with a backlog, get two each, the
/// first of every partition before the second of any. Spent in seq order, the key written first
/// would take all four while the other waits a claim.
#[tokio::test]
async fn the_byte_bound_goes_round_robin_over_the_partitions() {
    let db = Db::start().await;
    let pad = "x".repeat(1000);
    let big = |key: &str, n: u64| {
        NewMessage::new(
            "order",
            key,
            "placed",
            serde_json::json!({ "n": n, "pad": pad }),
        )
    };
    let first: Vec<_> = (1..=10).map(|n| big("alpha", n)).collect();
    let second: Vec<_> = (1..=10).map(|n| big("bravo", n)).collect();
    db.store.insert(&first).await.unwrap();
    db.store.insert(&second).await.unwrap();
    let parts: i64 =
        sqlx::query_scalar(&db.sql("SELECT COUNT(DISTINCT part) FROM {schema}.outbox"))
            .fetch_one(db.store.pool())
            .await
            .unwrap();
    assert_eq!(parts, 2, "the two keys hash to two partitions");
    let size = first[0].payload.to_string().len();
    let got = db
        .store
        .claim(
            &db.member,
            &db.parts,
            ClaimLimits {
                rows: 100,
                bytes: size * 4 + size / 2,
            },
            OnFailed::Block,
        )
        .await
        .unwrap();
    let taken: Vec<(String, u64)> = got
        .iter()
        .map(|m| (m.aggregate_id.clone(), n_of(m)))
        .collect();
    let mut per_key: HashMap<&str, Vec<u64>> = HashMap::new();
    for (k, n) in &taken {
        per_key.entry(k.as_str()).or_default().push(*n);
    }
    assert_eq!(
        (per_key.get("alpha"), per_key.get("bravo")),
        (Some(&vec![1, 2]), Some(&vec![1, 2])),
        "{taken:?}"
    );
    db.drop().await;
}

/// The relay drops a store call that outlives its deadline, wherever it stands. sqlx sends
/// `BEGIN` and only then counts the transaction as open, so a call dropped in between would
/// return its connection to the pool inside a transaction nobody ends: every later statement
/// on it would run there, uncommitted, holding its locks (a `DROP DATABASE` or a maintenance
/// `ALTER TABLE` then waits for them for good). Calls dropped at every point leave none.
#[tokio::test]
async fn a_call_dropped_at_any_point_leaves_no_transaction_open_on_the_pool() {
    let pool = connect_pool(&server_url(), 1).await.unwrap();
    let schema = Schema::new(&outbox_testkit::unique_name("eng")).unwrap();
    migrate(&pool, &schema).await.unwrap();
    let store = MysqlStore::new(pool.clone(), schema.clone());
    let member = MemberId::random("drop");
    let parts = store
        .rebalance(&member, Duration::from_secs(60))
        .await
        .unwrap();
    for round in 0..200u64 {
        store.insert(&[msg("k", round)]).await.unwrap();
        let got = store
            .claim(&member, &parts, ClaimLimits::rows(10), OnFailed::Block)
            .await
            .unwrap();
        let outcomes: Vec<Outcome> = got
            .iter()
            .map(|m| Outcome::Published { seq: m.seq })
            .collect();
        // Dropped after a few polls, a little later each round.
        let cut = Duration::from_micros(round * 5);
        let _ = tokio::time::timeout(cut, store.complete(&member, &outcomes)).await;
        let _ = tokio::time::timeout(cut, store.rebalance(&member, Duration::from_secs(60))).await;
        store.complete(&member, &outcomes).await.unwrap();
        // The pool's one connection, once it is back.
        let open: i64 = sqlx::query_scalar("SELECT CAST(@@in_transaction AS SIGNED)")
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(
            open, 0,
            "round {round}: a transaction was left open on the pool"
        );
    }
    sqlx::raw_sql(&schema.render("DROP DATABASE {schema}"))
        .execute(&pool)
        .await
        .unwrap();
}
