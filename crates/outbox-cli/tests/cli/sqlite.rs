//! The embedded default on real processes: SQLite store, `file:` sink, `outbox demo`.
//! No server is involved in these tests.

#![allow(clippy::unwrap_used)]

use crate::common;
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use outbox_core::Store;

fn outbox(cwd: &Path) -> Command {
    common::outbox_command(cwd)
}

fn scratch() -> PathBuf {
    let d = std::env::temp_dir().join(outbox_testkit::unique_name("sqlite_cli"));
    std::fs::create_dir_all(&d).unwrap();
    d
}

async fn store(db: &Path) -> outbox_sqlite::SqliteStore {
    let pool = outbox_sqlite::connect_pool(&format!("sqlite://{}", db.display()))
        .await
        .unwrap();
    outbox_sqlite::migrate(&pool).await.unwrap();
    outbox_sqlite::SqliteStore::new(pool)
}

fn relay(dir: &Path, db: &Path, out: &Path, extra: &[&str]) -> Child {
    outbox(dir)
        .args([
            "relay",
            "--database-url",
            &format!("sqlite://{}", db.display()),
        ])
        .args([
            "--sink",
            &format!("file:{}", out.display()),
            "--poll-interval",
            "50ms",
        ])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap()
}

/// The complete lines of the sink's file (a relay may be writing the last one right now).
fn lines(out: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(out).unwrap_or_default();
    let complete = &text[..text.rfind('\n').map_or(0, |i| i + 1)];
    complete
        .lines()
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn sigterm_and_wait(child: &mut Child) -> std::process::ExitStatus {
    common::sigterm(child);
    common::wait_exit(child, Duration::from_secs(20))
}

async fn wait_drained(s: &outbox_sqlite::SqliteStore, limit: Duration) {
    let deadline = Instant::now() + limit;
    while s.stats().await.unwrap().pending > 0 {
        assert!(
            Instant::now() < deadline,
            "not drained: {:?}",
            s.stats().await.unwrap()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn minimal_sql_insert_on_sqlite_reaches_the_file_sink() {
    let dir = scratch();
    let db = dir.join("app.db");
    let out = dir.join("events.jsonl");
    let o = outbox(&dir)
        .args([
            "migrate",
            "--database-url",
            &format!("sqlite://{}", db.display()),
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let s = store(&db).await;
    sqlx::query("INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES (?, ?, ?, ?)")
        .bind("payment")
        .bind("p-1")
        .bind("payment.created")
        .bind(r#"{"amount_cents": 990}"#)
        .execute(s.pool())
        .await
        .unwrap();
    let mut child = relay(&dir, &db, &out, &[]);
    wait_drained(&s, Duration::from_secs(20)).await;
    assert!(sigterm_and_wait(&mut child).success());
    let got = lines(&out);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0]["payload"]["amount_cents"], 990);
    assert_eq!(got[0]["key"], "p-1");
    assert_eq!(got[0]["destination"], "payment.payment.created");
    let id: String = sqlx::query_scalar("SELECT id FROM outbox")
        .fetch_one(s.pool())
        .await
        .unwrap();
    assert_eq!(got[0]["id"], id.as_str());
    assert_eq!(got[0]["headers"]["outbox-message-id"], id.as_str());
    std::fs::remove_dir_all(&dir).ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_killed_with_sigkill_on_sqlite_loses_nothing_and_the_file_holds_every_message() {
    let dir = scratch();
    let db = dir.join("app.db");
    let out = dir.join("events.jsonl");
    let s = store(&db).await;
    let (keys, per_key) = (50usize, 100usize);
    let msgs = common::interleaved(&common::keys("o", keys), 0..per_key);
    for chunk in msgs.chunks(500) {
        s.insert(chunk).await.unwrap();
    }
    let flags = ["--lease", "2s", "--batch-size", "50", "--workers", "1"];
    let mut a = relay(&dir, &db, &out, &flags);
    let deadline = Instant::now() + Duration::from_secs(60);
    while lines(&out).len() < 500 {
        assert!(Instant::now() < deadline, "the first relay wrote nothing");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    a.kill().unwrap();
    a.wait().unwrap();
    assert!(
        s.stats().await.unwrap().pending > 0,
        "finished before the kill; nothing tested"
    );
    let mut b = relay(&dir, &db, &out, &flags);
    wait_drained(&s, Duration::from_secs(120)).await;
    assert!(sigterm_and_wait(&mut b).success());

    let got = lines(&out);
    let ids: HashSet<String> = got
        .iter()
        .map(|l| l["id"].as_str().unwrap().to_string())
        .collect();
    for m in &msgs {
        assert!(ids.contains(&m.id.to_string()), "message {} lost", m.id);
    }
    // First deliveries of each key are in order; a redelivered tail repeats, never reorders.
    let d = got.iter().map(|l| {
        (
            l["id"].as_str().unwrap().to_string(),
            l["key"].as_str().unwrap().to_string(),
            l["payload"]["n"].as_u64().unwrap(),
        )
    });
    assert!(common::assert_key_order(d)
        .values()
        .all(|&n| n as usize == per_key));
    std::fs::remove_dir_all(&dir).ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_url_without_a_path_uses_outbox_db_in_the_working_directory() {
    let dir = scratch();
    let o = outbox(&dir)
        .args(["migrate", "--database-url", "sqlite://"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(dir.join("outbox.db").exists());
    let o = outbox(&dir)
        .args(["status", "--database-url", "sqlite://", "--format", "json"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["pending"], 0);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn demo_runs_with_no_server_and_loses_nothing() {
    let dir = scratch();
    let o = outbox(&dir)
        .args(["demo", "--dir", "demo", "--outage-seconds", "2"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "demo failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let lost = stdout
        .lines()
        .find(|l| l.trim_start().starts_with("lost"))
        .expect("a `lost` line");
    assert_eq!(lost.split_whitespace().nth(1), Some("0"), "{stdout}");
    assert!(stdout.contains("events published for them: 0"), "{stdout}");
    let ledger = stdout
        .lines()
        .find(|l| l.trim_start().starts_with("ledger") && l.contains("applied"))
        .expect("a `ledger` summary line");
    assert!(
        ledger.contains("inbox processor") && ledger.contains("= committed total"),
        "{stdout}"
    );
    assert!(dir.join("demo/events.jsonl").exists() && dir.join("demo/payments.db").exists());
    std::fs::remove_dir_all(&dir).ok();
}
