//! The MySQL writer and its positions, against the real MariaDB of this machine, each test in
//! a database of its own: the testkit's writer suite (atomicity, per-key commit order, the raw
//! insert, migrations idempotent and racing, a dropped call), and what only MySQL's writer does
//! (per-partition positions with no gap, counters taken in partition order).

#![allow(clippy::unwrap_used)] // tests

use std::sync::Arc;
use std::time::Duration;

use outbox_core::{NewMessage, Store};
use outbox_mysql::{enqueue, enqueue_many, migrate, MysqlStore, Schema};
use outbox_testkit::writer_suite::WriterBackend;
use sqlx::{MySql, MySqlPool, Transaction};

mod common;
use common::server_url;

/// A migrated outbox in a database of its own.
struct Db {
    pool: MySqlPool,
    schema: Schema,
}

impl Db {
    async fn start() -> Self {
        let (pool, schema) = common::migrated_outbox(&server_url(), 24).await;
        Self { pool, schema }
    }

    fn sql(&self, sql: &str) -> String {
        self.schema.render(sql)
    }

    /// `(part, part_seq, aggregate_id)` of every row, by partition and position.
    async fn positions(&self) -> Vec<(i16, i64, String)> {
        sqlx::query_as(&self.sql(
            "SELECT part, part_seq, CAST(aggregate_id AS CHAR) FROM {schema}.outbox ORDER BY part, part_seq",
        ))
        .fetch_all(&self.pool)
        .await
        .unwrap()
    }

    /// The partition of `key`, as the trigger computes it.
    async fn partition(&self, key: &str) -> i64 {
        sqlx::query_scalar("SELECT CAST(CRC32(?) % 64 AS SIGNED)")
            .bind(key)
            .fetch_one(&self.pool)
            .await
            .unwrap()
    }

    async fn drop(self) {
        sqlx::raw_sql(&self.sql("DROP DATABASE {schema}"))
            .execute(&self.pool)
            .await
            .unwrap();
        self.pool.close().await;
    }
}

/// Every partition's positions are 1, 2, …, n: no gap, no repeat.
fn assert_gapless(rows: &[(i16, i64, String)]) {
    let mut expected = std::collections::HashMap::new();
    for (part, seq, _) in rows {
        let next = expected.entry(*part).or_insert(1i64);
        assert_eq!(*seq, *next, "partition {part}: {rows:?}");
        *next += 1;
    }
}

fn msg(key: &str, n: i64) -> NewMessage {
    NewMessage::new("order", key, "order.placed", serde_json::json!({ "n": n }))
}

impl WriterBackend for Db {
    type Tx = Transaction<'static, MySql>;

    fn versions() -> Vec<i32> {
        (1..=outbox_mysql::SCHEMA_VERSION).collect()
    }

    async fn start() -> Self {
        Db::start().await
    }

    async fn teardown(self) {
        self.drop().await;
    }

    async fn begin(&self) -> Self::Tx {
        self.pool.begin().await.unwrap()
    }

    async fn enqueue(
        &self,
        tx: &mut Self::Tx,
        message: &NewMessage,
    ) -> outbox_core::Result<uuid::Uuid> {
        enqueue(tx, &self.schema, message).await
    }

    async fn commit(tx: Self::Tx) {
        tx.commit().await.unwrap();
    }

    async fn rollback(tx: Self::Tx) {
        tx.rollback().await.unwrap();
    }

    async fn ids(&self) -> Vec<uuid::Uuid> {
        let ids: Vec<String> = sqlx::query_scalar(
            &self.sql("SELECT CAST(id AS CHAR) FROM {schema}.outbox ORDER BY part, part_seq"),
        )
        .fetch_all(&self.pool)
        .await
        .unwrap();
        ids.iter().map(|id| id.parse().unwrap()).collect()
    }

    async fn execute(&self, sql: &str) {
        sqlx::raw_sql(&self.sql(sql))
            .execute(&self.pool)
            .await
            .unwrap();
    }

    fn store(&self) -> Arc<dyn Store> {
        Arc::new(MysqlStore::new(self.pool.clone(), self.schema.clone()))
    }

    async fn migrate(&self) -> Vec<i32> {
        migrate(&self.pool, &self.schema).await.unwrap()
    }

    async fn migrate_racing(&self) -> (Vec<i32>, Vec<i32>) {
        let other = Schema::new(&outbox_testkit::unique_name("outbox")).unwrap();
        let (a, b) = tokio::join!(migrate(&self.pool, &other), migrate(&self.pool, &other));
        common::drop_db(&self.pool, &other).await;
        (a.unwrap(), b.unwrap())
    }
}

outbox_testkit::writer_suite!(Db);

/// A fresh migration makes one position counter per partition (the suite checks that racing
/// migrators apply each version once).
#[tokio::test]
async fn a_migration_makes_one_counter_per_partition() {
    let db = Db::start().await;
    let parts: i64 = sqlx::query_scalar(&db.sql("SELECT COUNT(*) FROM {schema}.outbox_part_seq"))
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(parts, i64::from(outbox_mysql::PARTITIONS));
    db.drop().await;
}

#[tokio::test]
async fn messages_exist_with_their_transaction_and_a_rollback_gives_its_positions_back() {
    let db = Db::start().await;
    let kept = msg("k1", 1);
    let mut tx = db.pool.begin().await.unwrap();
    assert_eq!(enqueue(&mut tx, &db.schema, &kept).await.unwrap(), kept.id);
    tx.commit().await.unwrap();

    let mut tx = db.pool.begin().await.unwrap();
    enqueue_many(&mut tx, &db.schema, &[msg("k1", 2), msg("k1", 3)])
        .await
        .unwrap();
    tx.rollback().await.unwrap();

    let mut later = msg("k1", 4);
    later.headers.insert("trace".into(), "abc".into());
    later.topic = Some("orders.eu".into());
    let mut tx = db.pool.begin().await.unwrap();
    enqueue(&mut tx, &db.schema, &later).await.unwrap();
    tx.commit().await.unwrap();

    let rows: Vec<(String, String, String, Option<String>, i64)> = sqlx::query_as(&db.sql(
        "SELECT CAST(id AS CHAR), CAST(payload AS CHAR), CAST(headers AS CHAR), CAST(topic AS CHAR), part_seq \
         FROM {schema}.outbox ORDER BY part_seq",
    ))
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_eq!(rows[0].0, kept.id.to_string());
    assert_eq!(rows[0].4, 1);
    assert_eq!(rows[1].0, later.id.to_string());
    assert_eq!(rows[1].4, 2, "the rolled-back positions were given back");
    let payload: serde_json::Value = serde_json::from_str(&rows[1].1).unwrap();
    assert_eq!(payload, serde_json::json!({ "n": 4 }));
    let headers: serde_json::Value = serde_json::from_str(&rows[1].2).unwrap();
    assert_eq!(headers, serde_json::json!({ "trace": "abc" }));
    assert_eq!(rows[1].3.as_deref(), Some("orders.eu"));
    db.drop().await;
}

/// What the trigger gives the plain insert on MySQL: the key's partition (CRC32, as documented),
/// the first position, empty headers (the suite checks that the row is relayed).
#[tokio::test]
async fn the_plain_four_column_insert_of_another_language_gets_an_id_a_partition_and_a_position() {
    let db = Db::start().await;
    sqlx::query(&db.sql(
        "INSERT INTO {schema}.outbox (aggregate_type, aggregate_id, event_type, payload) \
         VALUES ('order', 'raw-1', 'order.placed', '{\"n\": 1}')",
    ))
    .execute(&db.pool)
    .await
    .unwrap();
    let (id, part, part_seq, headers): (String, i16, i64, String) = sqlx::query_as(&db.sql(
        "SELECT CAST(id AS CHAR), part, part_seq, CAST(headers AS CHAR) FROM {schema}.outbox",
    ))
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(uuid::Uuid::parse_str(&id).is_ok(), "{id}");
    assert_eq!(i64::from(part), db.partition("raw-1").await);
    assert_eq!(part_seq, 1);
    assert_eq!(headers, "{}");
    db.drop().await;
}

/// Sixteen writers over ten keys, a fifth of their transactions rolled back, while a reader
/// checks at every read what a relay relies on: each partition's committed positions are
/// 1..n, so a row it has not seen can only come after the last one it saw.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_never_sees_a_hole_in_a_partition_while_writers_commit_and_roll_back() {
    let db = Db::start().await;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let (pool, sql, stop) = (
            db.pool.clone(),
            db.sql("SELECT part, COUNT(*), CAST(MAX(part_seq) AS SIGNED) FROM {schema}.outbox GROUP BY part"),
            stop.clone(),
        );
        tokio::spawn(async move {
            let mut conn = pool.acquire().await.unwrap();
            sqlx::query("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
                .execute(&mut *conn)
                .await
                .unwrap();
            let mut reads = 0u32;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let rows: Vec<(i16, i64, i64)> =
                    sqlx::query_as(&sql).fetch_all(&mut *conn).await.unwrap();
                for (part, count, max) in rows {
                    assert_eq!(
                        count, max,
                        "partition {part} has a hole: {count} rows, last {max}"
                    );
                }
                reads += 1;
            }
            reads
        })
    };
    let mut writers = Vec::new();
    for w in 0..16 {
        let (pool, schema) = (db.pool.clone(), db.schema.clone());
        writers.push(tokio::spawn(async move {
            let mut committed = 0u64;
            for i in 0..40 {
                let mut tx: sqlx::Transaction<'_, MySql> = pool.begin().await.unwrap();
                let key = format!("key-{}", fastrand::u8(..10));
                enqueue(&mut tx, &schema, &msg(&key, w * 1000 + i))
                    .await
                    .unwrap();
                if fastrand::u8(..5) == 0 {
                    tx.rollback().await.unwrap();
                } else {
                    tx.commit().await.unwrap();
                    committed += 1;
                }
            }
            committed
        }));
    }
    let mut committed = 0;
    for w in writers {
        committed += w.await.unwrap();
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(reader.await.unwrap() > 0);
    let rows = db.positions().await;
    assert_eq!(rows.len() as u64, committed);
    assert_gapless(&rows);
    db.drop().await;
}

/// A writer that holds its transaction makes the writers of its partition wait, and only
/// those: this is what "enqueue last" in the docs is about.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_writer_holds_back_its_partition_only() {
    let db = Db::start().await;
    let held_key = "held";
    let part = db.partition(held_key).await;
    let (mut same, mut other) = (None, None);
    for i in 0.. {
        let k = format!("k{i}");
        let p = db.partition(&k).await;
        if p == part && same.is_none() {
            same = Some(k);
        } else if p != part && other.is_none() {
            other = Some(k);
        }
        if same.is_some() && other.is_some() {
            break;
        }
    }
    let (same, other) = (same.unwrap(), other.unwrap());

    let mut held = db.pool.begin().await.unwrap();
    enqueue(&mut held, &db.schema, &msg(held_key, 1))
        .await
        .unwrap();

    // Another partition goes through at once.
    let mut tx = db.pool.begin().await.unwrap();
    tokio::time::timeout(
        Duration::from_secs(5),
        enqueue(&mut tx, &db.schema, &msg(&other, 1)),
    )
    .await
    .expect("another partition is not held")
    .unwrap();
    tx.commit().await.unwrap();

    // The same partition waits until the held transaction ends.
    let (connection, connection_id) = tokio::sync::oneshot::channel::<u64>();
    let waiting = {
        let (pool, schema) = (db.pool.clone(), db.schema.clone());
        tokio::spawn(async move {
            let mut tx = pool.begin().await.unwrap();
            let id: u64 = sqlx::query_scalar("SELECT CONNECTION_ID()")
                .fetch_one(&mut *tx)
                .await
                .unwrap();
            connection.send(id).unwrap();
            enqueue(&mut tx, &schema, &msg(&same, 1)).await.unwrap();
            tx.commit().await.unwrap();
        })
    };
    let connection_id = connection_id.await.unwrap();
    // The server says that very writer waits for a lock (not merely that it is slow).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let waits: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM information_schema.INNODB_TRX \
             WHERE trx_state = 'LOCK WAIT' AND trx_mysql_thread_id = ?",
        )
        .bind(connection_id)
        .fetch_one(&db.pool)
        .await
        .unwrap();
        if waits > 0 {
            break;
        }
        assert!(
            !waiting.is_finished(),
            "a writer of the held partition went through"
        );
        // INNODB_TRX is a cache; under a loaded server it may not show the wait in time. A
        // writer still not through after ten seconds of the other's hold has waited anyway.
        if std::time::Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        !waiting.is_finished(),
        "a writer of the held partition went through"
    );
    held.commit().await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .unwrap()
        .unwrap();

    let rows = db.positions().await;
    assert_gapless(&rows);
    let in_part: Vec<&str> = rows
        .iter()
        .filter(|r| i64::from(r.0) == part)
        .map(|r| r.2.as_str())
        .collect();
    assert_eq!(
        in_part[0], held_key,
        "the held writer committed first, so it is first"
    );
    db.drop().await;
}

/// Two keys in different partitions, written in opposite orders by transactions that overlap:
/// the writer takes the counters in partition order, so neither is chosen as a deadlock victim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_over_the_same_keys_in_opposite_orders_never_deadlock() {
    let db = Db::start().await;
    let a = "order-a".to_string();
    let mut b = None;
    for i in 0.. {
        let k = format!("order-b{i}");
        if db.partition(&k).await != db.partition(&a).await {
            b = Some(k);
            break;
        }
    }
    let b = b.unwrap();
    let mut tasks = Vec::new();
    for flip in [false, true] {
        let (pool, schema, a, b) = (db.pool.clone(), db.schema.clone(), a.clone(), b.clone());
        tasks.push(tokio::spawn(async move {
            for i in 0..40 {
                let batch = if flip {
                    [msg(&b, i), msg(&a, i)]
                } else {
                    [msg(&a, i), msg(&b, i)]
                };
                let mut tx = pool.begin().await.unwrap();
                enqueue_many(&mut tx, &schema, &batch).await.unwrap();
                // Hold the counters a moment, so the two transactions overlap.
                tokio::time::sleep(Duration::from_millis(2)).await;
                tx.commit().await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let rows = db.positions().await;
    assert_eq!(rows.len(), 160);
    assert_gapless(&rows);
    db.drop().await;
}

/// Every version run again whole (as after an interruption) keeps the rows and the counters, and
/// an insert that finds no counter row fails instead of taking a stale position.
#[tokio::test]
async fn the_migration_runs_again_whole_without_harm_and_a_row_never_goes_unpositioned() {
    let db = Db::start().await;
    let mut tx = db.pool.begin().await.unwrap();
    enqueue(&mut tx, &db.schema, &msg("k", 1)).await.unwrap();
    tx.commit().await.unwrap();
    sqlx::query(&db.sql("DELETE FROM {schema}.outbox_migrations"))
        .execute(&db.pool)
        .await
        .unwrap();
    assert_eq!(
        migrate(&db.pool, &db.schema).await.unwrap(),
        vec![1, 2, 3, 4]
    );
    let mut tx = db.pool.begin().await.unwrap();
    enqueue(&mut tx, &db.schema, &msg("k", 2)).await.unwrap();
    tx.commit().await.unwrap();
    let rows = db.positions().await;
    assert_eq!(rows.iter().map(|r| r.1).collect::<Vec<_>>(), vec![1, 2]);

    sqlx::query(&db.sql("DELETE FROM {schema}.outbox_part_seq WHERE part = ?"))
        .bind(db.partition("k").await)
        .execute(&db.pool)
        .await
        .unwrap();
    let mut tx = db.pool.begin().await.unwrap();
    let e = enqueue(&mut tx, &db.schema, &msg("k", 3))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("no position counter"), "{e}");
    drop(tx);
    assert_eq!(db.positions().await.len(), 2);
    db.drop().await;
}

/// The interleaving the ordered counters are for, forced step by step: a transaction holding
/// the lower partition's counter, then a batch over both keys listed higher first, then the
/// first transaction writing the higher key. Taken in the batch's order, the counters deadlock
/// (InnoDB rolls one back); taken in partition order, the batch waits holding nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_listing_a_higher_partition_first_waits_instead_of_deadlocking() {
    let db = Db::start().await;
    let mut keys: Vec<(i64, String)> = Vec::new();
    for i in 0.. {
        let k = format!("order-{i}");
        let p = db.partition(&k).await;
        if keys.iter().all(|(q, _)| *q != p) {
            keys.push((p, k));
        }
        if keys.len() == 2 {
            break;
        }
    }
    keys.sort();
    let (low, high) = (keys[0].1.clone(), keys[1].1.clone());

    let mut first = db.pool.begin().await.unwrap();
    enqueue(&mut first, &db.schema, &msg(&low, 1))
        .await
        .unwrap();
    let (connection, connection_id) = tokio::sync::oneshot::channel::<u64>();
    let batch = {
        let (pool, schema, low, high) = (
            db.pool.clone(),
            db.schema.clone(),
            low.clone(),
            high.clone(),
        );
        tokio::spawn(async move {
            let mut tx = pool.begin().await.unwrap();
            let id: u64 = sqlx::query_scalar("SELECT CONNECTION_ID()")
                .fetch_one(&mut *tx)
                .await
                .unwrap();
            connection.send(id).unwrap();
            enqueue_many(&mut tx, &schema, &[msg(&high, 2), msg(&low, 2)]).await?;
            tx.commit()
                .await
                .map_err(|e| outbox_mysql::map_sqlx_error("commit", e))
        })
    };
    let connection_id = connection_id.await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let waits: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM information_schema.INNODB_TRX \
             WHERE trx_state = 'LOCK WAIT' AND trx_mysql_thread_id = ?",
        )
        .bind(connection_id)
        .fetch_one(&db.pool)
        .await
        .unwrap();
        if waits > 0 {
            break;
        }
        // INNODB_TRX is a cache; under a loaded server (the whole suite at once) it may not show
        // the wait in time. A batch still not through after ten seconds is waiting anyway: it
        // cannot finish while `first` holds the lower counter, unless it failed.
        if std::time::Instant::now() >= deadline {
            assert!(!batch.is_finished(), "the batch never waited");
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    enqueue(&mut first, &db.schema, &msg(&high, 1))
        .await
        .expect("the batch holds no counter while it waits, so this is no deadlock");
    first.commit().await.unwrap();
    batch
        .await
        .unwrap()
        .expect("the batch goes through once the first commits");
    let rows = db.positions().await;
    assert_eq!(rows.len(), 4);
    assert_gapless(&rows);
    db.drop().await;
}
