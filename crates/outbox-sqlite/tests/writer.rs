//! The transactional writer and the schema against real SQLite files: the testkit's writer
//! suite (atomicity, per-key commit order, the raw insert, migrations idempotent and racing, a
//! dropped call), run with immediate and with deferred transactions; and what only SQLite does:
//! ids and creation times minted in SQL, the table's own checks, duplicate ids, large batches,
//! an unmigrated file, and partition ownership shared by several processes (pools) on one file.

#![allow(clippy::unwrap_used)]

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use outbox_core::{ClaimLimits, ErrorKind, MemberId, NewMessage, Store};
use outbox_sqlite::{connect_pool, migrate, SqliteStore, Writer, PARTITIONS};
use outbox_testkit::writer_suite::WriterBackend;
use sqlx::{SqlitePool, Transaction};

/// A URL of a database file in a fresh temporary directory (the file does not exist yet).
fn fresh_url() -> (String, PathBuf) {
    let dir = std::env::temp_dir().join(outbox_testkit::unique_name("sqlite"));
    std::fs::create_dir_all(&dir).unwrap();
    (format!("sqlite://{}", dir.join("outbox.db").display()), dir)
}

async fn setup() -> (SqlitePool, PathBuf) {
    let (url, dir) = fresh_url();
    let pool = connect_pool(&url).await.unwrap();
    assert_eq!(migrate(&pool).await.unwrap(), vec![1, 2, 3, 4]);
    (pool, dir)
}

async fn teardown(pool: SqlitePool, dir: PathBuf) {
    pool.close().await;
    std::fs::remove_dir_all(dir).unwrap();
}

async fn ids_in_seq_order(pool: &SqlitePool) -> Vec<uuid::Uuid> {
    sqlx::query_scalar::<_, String>("SELECT id FROM outbox ORDER BY seq")
        .fetch_all(pool)
        .await
        .unwrap()
        .iter()
        .map(|s| s.parse().unwrap())
        .collect()
}

/// A migrated outbox in a file of its own; `IMMEDIATE` transactions take the write lock at
/// `BEGIN` (`BEGIN IMMEDIATE`, as `outbox_sqlite::enqueue`'s docs advise), the others at their
/// first write (`pool.begin()`).
struct Sqlite<const IMMEDIATE: bool> {
    pool: SqlitePool,
    dir: PathBuf,
}

impl<const IMMEDIATE: bool> WriterBackend for Sqlite<IMMEDIATE> {
    type Tx = Transaction<'static, sqlx::Sqlite>;

    fn versions() -> Vec<i32> {
        (1..=outbox_sqlite::SCHEMA_VERSION).collect()
    }

    async fn start() -> Self {
        let (pool, dir) = setup().await;
        Self { pool, dir }
    }

    async fn teardown(self) {
        teardown(self.pool, self.dir).await;
    }

    async fn begin(&self) -> Self::Tx {
        if IMMEDIATE {
            self.pool.begin_with("BEGIN IMMEDIATE").await.unwrap()
        } else {
            self.pool.begin().await.unwrap()
        }
    }

    async fn enqueue(
        &self,
        tx: &mut Self::Tx,
        message: &NewMessage,
    ) -> outbox_core::Result<uuid::Uuid> {
        Writer::new().enqueue(tx, message).await
    }

    async fn commit(tx: Self::Tx) {
        tx.commit().await.unwrap();
    }

    async fn rollback(tx: Self::Tx) {
        tx.rollback().await.unwrap();
    }

    async fn ids(&self) -> Vec<uuid::Uuid> {
        ids_in_seq_order(&self.pool).await
    }

    async fn execute(&self, sql: &str) {
        sqlx::raw_sql(&sql.replace("{schema}.", ""))
            .execute(&self.pool)
            .await
            .unwrap();
    }

    fn store(&self) -> Arc<dyn Store> {
        Arc::new(SqliteStore::new(self.pool.clone()))
    }

    async fn migrate(&self) -> Vec<i32> {
        migrate(&self.pool).await.unwrap()
    }

    /// Two processes migrating one new file at once: the first connection creates the file and
    /// switches it to WAL; the race is in migrate.
    async fn migrate_racing(&self) -> (Vec<i32>, Vec<i32>) {
        let (url, dir) = fresh_url();
        let a = connect_pool(&url).await.unwrap();
        let b = connect_pool(&url).await.unwrap();
        let (ra, rb) = tokio::join!(migrate(&a), migrate(&b));
        b.close().await;
        teardown(a, dir).await;
        (ra.unwrap(), rb.unwrap())
    }
}

outbox_testkit::writer_suite!(immediate, Sqlite<true>);
outbox_testkit::writer_suite!(deferred, Sqlite<false>);

/// The minimal insert any language can run gets a UUIDv7 id, a partition and a creation time
/// from SQL, and the relay can claim the row.
#[tokio::test]
async fn minimal_raw_insert_gets_uuid_v7_partition_and_created_at() {
    let (pool, dir) = setup().await;
    let before = Utc::now();
    sqlx::query(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
         VALUES (?, ?, ?, ?)",
    )
    .bind("order")
    .bind("order-42")
    .bind("order.placed")
    .bind(r#"{"total": 42,  "note": "spaces kept"}"#)
    .execute(&pool)
    .await
    .unwrap();
    let after = Utc::now();
    let (id, partition, created_at, headers, state): (String, i64, String, String, String) =
        sqlx::query_as("SELECT id, partition, created_at, headers, state FROM outbox")
            .fetch_one(&pool)
            .await
            .unwrap();
    let uuid = uuid::Uuid::parse_str(&id).unwrap();
    assert_eq!(id, uuid.hyphenated().to_string(), "lower-case 8-4-4-4-12");
    assert_eq!(uuid.get_version_num(), 7);
    assert_eq!(uuid.get_variant(), uuid::Variant::RFC4122);
    let (secs, nanos) = uuid.get_timestamp().unwrap().to_unix();
    let minted = DateTime::from_timestamp(secs as i64, nanos).unwrap();
    let slack = chrono::Duration::milliseconds(2);
    assert!(
        minted >= before - slack && minted <= after + slack,
        "{minted} not in [{before}, {after}]"
    );
    assert!((0..PARTITIONS as i64).contains(&partition));
    assert!(
        created_at.ends_with('Z') && created_at.len() == 24,
        "{created_at}"
    );
    let created = DateTime::parse_from_rfc3339(&created_at).unwrap();
    assert!(created >= before - slack && created <= after + slack);
    assert_eq!((headers.as_str(), state.as_str()), ("{}", "pending"));

    // Ids minted in one millisecond still differ (random bits).
    sqlx::query(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload)
         SELECT 't', 'k' || value, 'e', '1' FROM json_each('[1,2,3,4,5,6,7,8,9,10]')",
    )
    .execute(&pool)
    .await
    .unwrap();
    let distinct: i64 = sqlx::query_scalar("SELECT count(DISTINCT id) FROM outbox")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(distinct, 11);

    // The relay sees the raw row, payload byte for byte.
    let store = SqliteStore::new(pool.clone());
    let m = MemberId::random("raw");
    let parts = store.rebalance(&m, Duration::from_secs(30)).await.unwrap();
    let got = store
        .claim(
            &m,
            &parts,
            ClaimLimits::rows(100),
            outbox_core::OnFailed::Block,
        )
        .await
        .unwrap();
    assert_eq!(got[0].id, uuid);
    assert_eq!(got[0].payload, r#"{"total": 42,  "note": "spaces kept"}"#);
    assert_eq!(got[0].created_at, created.with_timezone(&Utc));
    teardown(pool, dir).await;
}

/// The table rejects what would break the relay later: invalid JSON, odd ids, unknown states.
#[tokio::test]
async fn table_rejects_invalid_json_ids_and_states() {
    let (pool, dir) = setup().await;
    for (id, payload) in [
        ("0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b", "{not json"),
        ("0190A1B2-C3D4-7E5F-8A9B-0C1D2E3F4A5B", "{}"),
        ("not-a-uuid", "{}"),
    ] {
        let err = sqlx::query(
            "INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload)
             VALUES (?, 't', 'k', 'e', ?)",
        )
        .bind(id)
        .bind(payload)
        .execute(&pool)
        .await
        .unwrap_err();
        assert!(err.to_string().contains("CHECK"), "{id} {payload}: {err}");
    }
    let err = sqlx::query(
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, state)
         VALUES ('t', 'k', 'e', '{}', 'sent')",
    )
    .execute(&pool)
    .await
    .unwrap_err();
    assert!(err.to_string().contains("CHECK"), "{err}");
    teardown(pool, dir).await;
}

#[tokio::test]
async fn duplicate_message_id_is_a_unique_violation() {
    let (pool, dir) = setup().await;
    let w = Writer::new();
    let m = NewMessage::new("a", "1", "e", serde_json::json!({}));
    let mut tx = pool.begin().await.unwrap();
    w.enqueue(&mut tx, &m).await.unwrap();
    let err = w.enqueue(&mut tx, &m).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::UniqueViolation);
    drop(tx);
    teardown(pool, dir).await;
}

/// One call writes any number of rows in order (no bound-parameter limit), with headers,
/// topics and payloads kept as written.
#[tokio::test]
async fn enqueue_many_keeps_order_and_content_of_a_large_batch() {
    let (pool, dir) = setup().await;
    let msgs: Vec<_> = (0..2000)
        .map(|i| {
            NewMessage::new(
                "acct",
                format!("k{}", i % 7),
                "e",
                serde_json::json!({ "n": i, "text": "ünïcödé \"quoted\"\n" }),
            )
            .header("traceparent", format!("00-{i:032x}-{i:016x}-01"))
        })
        .collect();
    let mut msgs = msgs;
    msgs[3] = msgs[3].clone().topic("special.topic");
    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await.unwrap();
    outbox_sqlite::enqueue_many(&mut tx, &msgs).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(
        ids_in_seq_order(&pool).await,
        msgs.iter().map(|m| m.id).collect::<Vec<_>>()
    );
    let rows: Vec<(String, String, Option<String>)> =
        sqlx::query_as("SELECT payload, headers, topic FROM outbox ORDER BY seq LIMIT 5")
            .fetch_all(&pool)
            .await
            .unwrap();
    for (m, (payload, headers, topic)) in msgs.iter().zip(&rows) {
        assert_eq!(payload, &m.payload.to_string());
        assert_eq!(
            headers,
            &serde_json::Value::Object(m.headers.clone()).to_string()
        );
        assert_eq!(topic, &m.topic);
    }
    assert_eq!(rows[3].2.as_deref(), Some("special.topic"));
    teardown(pool, dir).await;
}

/// A store on a file nobody migrated says so, with the fix.
#[tokio::test]
async fn unmigrated_database_is_a_schema_error() {
    let (url, dir) = fresh_url();
    let pool = connect_pool(&url).await.unwrap();
    let store = SqliteStore::new(pool.clone());
    let err = store.stats().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Schema);
    assert!(err.to_string().contains("outbox migrate"), "{err}");
    teardown(pool, dir).await;
}

/// Several members in two processes (two pools on one file) rebalance at the same moments: in
/// every round their partition sets are disjoint, and they converge to fair shares covering
/// every partition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_in_two_processes_never_share_a_partition() {
    let (url, dir) = fresh_url();
    let first = connect_pool(&url).await.unwrap();
    migrate(&first).await.unwrap();
    let second = connect_pool(&url).await.unwrap();
    let stores: Vec<Arc<dyn Store>> = vec![
        Arc::new(SqliteStore::new(first.clone())),
        Arc::new(SqliteStore::new(second.clone())),
    ];
    let members: Vec<(Arc<dyn Store>, MemberId)> = (0..6)
        .map(|i| {
            (
                stores[i % 2].clone(),
                MemberId::random(&format!("p{}-m{i}", i % 2)),
            )
        })
        .collect();
    let lease = Duration::from_secs(30);
    let mut last = Vec::new();
    for round in 0..8 {
        let tasks: Vec<_> = members
            .iter()
            .map(|(store, m)| {
                let (store, m) = (store.clone(), m.clone());
                tokio::spawn(async move { store.rebalance(&m, lease).await.unwrap() })
            })
            .collect();
        let mut owned = Vec::new();
        for t in tasks {
            owned.push(t.await.unwrap());
        }
        let all: Vec<i32> = owned.iter().flatten().copied().collect();
        let distinct: HashSet<i32> = all.iter().copied().collect();
        assert_eq!(
            all.len(),
            distinct.len(),
            "round {round}: a partition has two owners: {owned:?}"
        );
        last = owned;
    }
    let fair = PARTITIONS.div_ceil(members.len());
    assert!(
        last.iter().all(|o| !o.is_empty() && o.len() <= fair),
        "unfair split {:?}",
        last.iter().map(Vec::len).collect::<Vec<_>>()
    );
    assert_eq!(last.iter().map(Vec::len).sum::<usize>(), PARTITIONS);
    // The database agrees with what the members were told.
    for (i, (store, m)) in members.iter().enumerate() {
        assert_eq!(store.renew(m, lease).await.unwrap(), last[i].len());
    }
    let s = stores[1].stats().await.unwrap();
    assert_eq!(s.members.len(), members.len());
    assert_eq!(
        s.members.iter().map(|m| m.partitions).sum::<i64>(),
        PARTITIONS as i64
    );
    second.close().await;
    teardown(first, dir).await;
}
