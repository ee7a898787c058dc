//! `outbox status` beyond the counts: each partition's owner, epoch, backlog and position, what
//! pins retention (a transaction held open elsewhere), the backlog by route and by type, and
//! `--watch` (one JSON object per refresh, ended by SIGINT or SIGTERM with exit 0).

#![allow(clippy::unwrap_used)]

use crate::common;
use std::io::{BufRead as _, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{database_url, outbox_command, wait_exit};
use outbox_core::status::{RetentionPin, StatusDetail};
use outbox_core::Store as _;
use outbox_postgres::{connect_pool, migrate, PgStore, Schema};
use serde_json::Value;
use sqlx::{Connection as _, PgConnection, PgPool};

/// A migrated outbox in a schema of its own.
/// `n` messages `order.placed` of order `o-1` (one key, one partition).
fn placed_orders(n: i32) -> Vec<outbox_core::NewMessage> {
    (0..n)
        .map(|i| {
            outbox_core::NewMessage::new(
                "order",
                "o-1",
                "order.placed",
                serde_json::json!({ "n": i }),
            )
        })
        .collect()
}

async fn outbox_schema() -> (PgPool, Schema) {
    let pool = connect_pool(&database_url(), 4).await.unwrap();
    let schema = Schema::new(&outbox_testkit::unique_name("st")).unwrap();
    migrate(&pool, &schema).await.unwrap();
    (pool, schema)
}

async fn drop_schema(pool: &PgPool, schema: &Schema) {
    let _ = sqlx::raw_sql(&schema.render("DROP SCHEMA {schema} CASCADE"))
        .execute(pool)
        .await;
}

/// The relay partition of ordering key `key` (the generated column's expression).
async fn partition_of(pool: &PgPool, key: &str) -> i64 {
    sqlx::query_scalar("SELECT ((hashtext($1) & 2147483647) % 64)::int8")
        .bind(key)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// `outbox status --format json` in `dir` (where an `outbox.toml` may name routes).
fn status_json(dir: &std::path::Path, schema: &Schema) -> Value {
    let o = outbox_command(dir)
        .args([
            "status",
            "--database-url",
            &database_url(),
            "--schema",
            schema.as_str(),
            "--format",
            "json",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

/// The oldest transaction id running in the cluster, if any.
async fn oldest_running(pool: &PgPool) -> Option<i64> {
    sqlx::query_scalar(
        "SELECT CASE WHEN pg_snapshot_xmin(s) < pg_snapshot_xmax(s)
                THEN pg_snapshot_xmin(s)::text::int8 END FROM pg_current_snapshot() AS s",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

fn partition(v: &Value, p: i64) -> &Value {
    let all = v["partitions"].as_array().unwrap();
    all.iter().find(|x| x["partition"] == p).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_json_shows_partitions_the_transaction_pinning_retention_and_routes() {
    let (pool, schema) = outbox_schema().await;
    let store = PgStore::new(pool.clone(), schema.clone());

    // A transaction elsewhere holds a transaction id and stays open.
    let mut held = PgConnection::connect(&database_url()).await.unwrap();
    sqlx::raw_sql("BEGIN").execute(&mut held).await.unwrap();
    let (held_xid, held_pid): (i64, i32) =
        sqlx::query_as("SELECT pg_current_xact_id()::text::int8, pg_backend_pid()")
            .fetch_one(&mut held)
            .await
            .unwrap();

    // A relay runs while it is open: every position it records stops at the held id.
    let dir = std::env::temp_dir().join(outbox_testkit::unique_name("status"));
    std::fs::create_dir_all(&dir).unwrap();
    let mut relay = outbox_command(&dir)
        .args([
            "relay",
            "--database-url",
            &database_url(),
            "--schema",
            schema.as_str(),
            "--sink",
            "file:relay.jsonl",
            "--poll-interval",
            "20ms",
        ])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    // Every position taken after the held transaction got its id (so at or below that id).
    let pinned = |d: &StatusDetail| {
        d.partitions.len() == 64
            && d.partitions.iter().all(|p| {
                p.epoch >= 1 && p.position.as_ref().is_some_and(|x| x.done_xmax > held_xid)
            })
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while !pinned(&store.status_detail().await.unwrap()) {
        assert!(
            Instant::now() < deadline,
            "the relay never recorded every partition's position"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    common::sigterm(&relay);
    assert!(wait_exit(&mut relay, Duration::from_secs(30)).success());

    // Then a known backlog: five `order` rows of one key, one `payment` row (with a topic) of a
    // key in another partition, at least a second old when status reads them.
    let order_partition = partition_of(&pool, "o-1").await;
    let mut n = 0;
    let pay_key = loop {
        let key = format!("p-{n}");
        if partition_of(&pool, &key).await != order_partition {
            break key;
        }
        n += 1;
    };
    let pay_partition = partition_of(&pool, &pay_key).await;
    let orders = placed_orders(5);
    store.insert(&orders).await.unwrap();
    store
        .insert(&[outbox_core::NewMessage::new(
            "payment",
            pay_key.as_str(),
            "payment.created",
            serde_json::json!({}),
        )
        .topic("pay")])
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await;

    // The relay's routing rules as `outbox status` reads them: `[[relay.routes]]` of outbox.toml.
    std::fs::write(
        dir.join("outbox.toml"),
        "[[relay.routes]]\nname = \"payments\"\nevent_type = \"payment.*\"\nsink = \"stdout:\"\n",
    )
    .unwrap();
    // Transaction ids are the cluster's: another test's transaction, older than ours, may be
    // running too, and is then rightly named instead.
    let ours_oldest = oldest_running(&pool).await == Some(held_xid);
    let v = status_json(&dir, &schema);
    let ours_oldest = ours_oldest && oldest_running(&pool).await == Some(held_xid);
    assert_eq!(v["pending"], 6, "{v}");
    assert_eq!(v["published"], 0);

    // Partitions: all 64, with owner (none: the relay gave them back), epoch and position.
    assert_eq!(v["partitions"].as_array().unwrap().len(), 64);
    let p = partition(&v, order_partition);
    assert_eq!(p["pending"], 5, "{p}");
    assert!(
        p["oldest_pending_age_seconds"].as_f64().unwrap() >= 1.0,
        "{p}"
    );
    assert!(p["owner"].is_null(), "released on SIGTERM: {p}");
    assert!(p["epoch"].as_i64().unwrap() >= 1, "{p}");
    assert!(
        p["position"]["done_xmin"].as_i64().unwrap() <= held_xid,
        "{p}"
    );
    assert!(p["position"]["done_at"].is_string(), "{p}");
    assert_eq!(partition(&v, pay_partition)["pending"], 1);
    let elsewhere: i64 = v["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|x| x["partition"] != order_partition && x["partition"] != pay_partition)
        .map(|x| x["pending"].as_i64().unwrap())
        .sum();
    assert_eq!(elsewhere, 0);

    // Retention: the horizon stops at the held transaction, which is named with its session.
    let r = &v["retention"];
    assert!(r["segments"].as_i64().unwrap() >= 1, "{r}");
    assert!(r["oldest_segment"]["name"].is_string(), "{r}");
    assert!(r["kept_because"].is_string(), "{r}");
    assert_eq!(r["pinned_by"]["kind"], "transaction", "{r}");
    if ours_oldest {
        assert_eq!(r["horizon"], held_xid, "{r}");
        assert_eq!(r["pinned_by"]["xid"], held_xid, "{r}");
        assert_eq!(r["pinned_by"]["pid"], held_pid, "{r}");
        assert!(
            r["pinned_by"]["age_seconds"].as_f64().unwrap() >= 1.0,
            "{r}"
        );
    } else {
        assert!(r["pinned_by"]["xid"].as_i64().unwrap() < held_xid, "{r}");
    }

    // The backlog by route (first matching rule, then the default sink) and by type.
    let routes = v["routes"].as_array().unwrap();
    assert_eq!(routes.len(), 2, "{routes:?}");
    assert_eq!(
        (&routes[0]["route"], &routes[0]["pending"]),
        (&"payments".into(), &1.into())
    );
    assert_eq!(
        (&routes[1]["route"], &routes[1]["pending"]),
        (&"default".into(), &5.into())
    );
    assert!(routes[1]["oldest_pending_age_seconds"].as_f64().unwrap() >= 1.0);
    let types = v["pending_by_type"].as_array().unwrap();
    assert!(
        types
            .iter()
            .any(|t| t["event_type"] == "order.placed" && t["pending"] == 5),
        "{types:?}"
    );
    assert!(
        types
            .iter()
            .any(|t| t["event_type"] == "payment.created" && t["topic"] == "pay"),
        "{types:?}"
    );

    // The text view says the same in words.
    let o = outbox_command(&dir)
        .args([
            "status",
            "--database-url",
            &database_url(),
            "--schema",
            schema.as_str(),
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("pinned by         transaction "), "{text}");
    assert!(text.contains("pending by route"), "{text}");

    // Once it ends, the oldest position is what holds the horizon (unless another transaction
    // at or below it still runs).
    sqlx::raw_sql("COMMIT").execute(&mut held).await.unwrap();
    let after = store.status_detail().await.unwrap().retention.unwrap();
    let horizon = after.horizon.unwrap();
    if oldest_running(&pool).await.is_none_or(|x| x > horizon) {
        assert!(
            matches!(after.pinned_by, Some(RetentionPin::Partition { .. })),
            "{after:?}"
        );
    }

    drop_schema(&pool, &schema).await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_prints_one_json_object_per_refresh_until_sigint_or_sigterm() {
    let (pool, schema) = outbox_schema().await;
    let store = PgStore::new(pool.clone(), schema.clone());
    store
        .insert(&[outbox_core::NewMessage::new(
            "order",
            "o-1",
            "order.placed",
            serde_json::json!({}),
        )])
        .await
        .unwrap();
    let mut pending = 1;
    for signal in ["-INT", "-TERM"] {
        let mut child = outbox_command(&std::env::temp_dir())
            .args([
                "status",
                "--database-url",
                &database_url(),
                "--schema",
                schema.as_str(),
                "--watch",
                "200ms",
                "--format",
                "json",
            ])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut seen: Vec<Value> = Vec::new();
        while seen.len() < 2 {
            let line = lines.next().expect("watch ended early").unwrap();
            seen.push(serde_json::from_str(&line).unwrap());
        }
        for v in &seen {
            assert_eq!(v["pending"], pending, "{v}");
            assert_eq!(v["partitions"].as_array().unwrap().len(), 64, "{v}");
        }
        assert_ne!(seen[0]["at"], seen[1]["at"], "each line is a new refresh");
        // A refresh reads the database again: a row written now shows up in a later line.
        store.insert(&placed_orders(1)).await.unwrap();
        pending += 1;
        loop {
            let line = lines.next().expect("watch ended early").unwrap();
            let v: Value = serde_json::from_str(&line).unwrap();
            if v["pending"] == pending {
                break;
            }
            assert_eq!(v["pending"], pending - 1, "{v}");
        }
        let ok = Command::new("kill")
            .args([signal, &child.id().to_string()])
            .status()
            .unwrap();
        assert!(ok.success());
        let status = wait_exit(&mut child, Duration::from_secs(10));
        assert_eq!(status.code(), Some(0), "{signal}: {status:?}");
        // Whatever it printed before it stopped is whole JSON lines.
        for line in lines {
            serde_json::from_str::<Value>(&line.unwrap()).unwrap();
        }
    }
    drop_schema(&pool, &schema).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_status_shows_partitions_and_the_backlog_by_type_without_retention() {
    let dir = std::env::temp_dir().join(outbox_testkit::unique_name("status_sqlite"));
    std::fs::create_dir_all(&dir).unwrap();
    let url = format!("sqlite://{}", dir.join("outbox.db").display());
    let pool = outbox_sqlite::connect_pool(&url).await.unwrap();
    outbox_sqlite::migrate(&pool).await.unwrap();
    let store = outbox_sqlite::SqliteStore::new(pool.clone());
    let orders = placed_orders(3);
    store.insert(&orders).await.unwrap();
    let part: i64 = sqlx::query_scalar("SELECT partition FROM outbox LIMIT 1")
        .fetch_one(&pool)
        .await
        .unwrap();
    let o = outbox_command(&dir)
        .args(["status", "--database-url", &url, "--format", "json"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["partitions"].as_array().unwrap().len(), 64, "{v}");
    let p = partition(&v, part);
    assert_eq!(p["pending"], 3, "{p}");
    assert!(p["position"].is_null(), "SQLite marks rows: {p}");
    assert!(v["retention"].is_null(), "SQLite has no horizon: {v}");
    assert_eq!(v["routes"][0]["route"], "default");
    assert_eq!(v["routes"][0]["pending"], 3);
    assert_eq!(v["pending_by_type"][0]["event_type"], "order.placed");
    let _ = std::fs::remove_dir_all(&dir);
}
