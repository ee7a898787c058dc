//! A synchronous standby that stops: on the pair `scripts/pg-ha.sh` runs (a primary and its
//! synchronous streaming standby, `OUTBOX_TEST_HA_URL`), commits wait for the standby, and
//! neither relay mode publishes any of them while they wait; once the standby is back, every
//! one is delivered. A message published for a commit the standby never had would be a phantom
//! after a failover.
//!
//! The test stops the pair's standby, so it is `disruptive_` (run alone, after the others).

#![allow(clippy::unwrap_used)]

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::msg;
use outbox_core::{ClaimLimits, MemberId, Message, OnFailed, Outcome, Store};
use outbox_postgres::cdc::setup::{drop_cdc, migrate_cdc};
use outbox_postgres::cdc::{CdcNames, CdcStore};
use outbox_postgres::{migrate, PgStore, Schema, Writer};
use sqlx::PgPool;

/// The pair's primary, as a multi-host URL that follows it.
fn ha_url() -> String {
    std::env::var("OUTBOX_TEST_HA_URL").unwrap_or_else(|_| pg_ha(&["url"]).trim().to_string())
}

fn pg_ha(args: &[&str]) -> String {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/pg-ha.sh");
    let out = Command::new(&script).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{} {args:?}: {}",
        script.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Starts the standby again when the test ends, passed or not.
struct StandbyBack;

impl Drop for StandbyBack {
    fn drop(&mut self) {
        let _ = pg_ha(&["start-standby"]);
    }
}

async fn write(pool: &PgPool, schema: &Schema, key: &str, n: u32) {
    let mut tx = pool.begin().await.unwrap();
    Writer::new(schema)
        .enqueue(&mut tx, &msg(key, n))
        .await
        .unwrap();
    tx.commit().await.unwrap();
}

/// Claims and publishes, as a relay's worker does, for `within`, or until `n` were published.
async fn relay_for(
    store: &dyn Store,
    m: &MemberId,
    parts: &[i32],
    n: usize,
    within: Duration,
) -> Vec<Message> {
    let mut got = Vec::new();
    let until = Instant::now() + within;
    while got.len() < n && Instant::now() < until {
        // Within a deadline, as the relay calls its store: a claim may wait on a lock a
        // commit waiting for the standby holds.
        let claim = store.claim(m, parts, ClaimLimits::rows(1000), OnFailed::Block);
        let batch = match tokio::time::timeout(Duration::from_secs(5), claim).await {
            Ok(Ok(batch)) => batch,
            _ => Vec::new(),
        };
        if batch.is_empty() {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        }
        let outcomes: Vec<Outcome> = batch
            .iter()
            .map(|x| Outcome::Published { seq: x.seq })
            .collect();
        tokio::time::timeout(Duration::from_secs(30), store.complete(m, &outcomes))
            .await
            .expect("a completion within 30 s")
            .unwrap();
        got.extend(batch);
    }
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn disruptive_a_stopped_synchronous_standby_holds_every_commit_from_both_relay_modes() {
    // A run killed half-way (a timeout) leaves the standby stopped: every commit would wait.
    pg_ha(&["start-standby"]);
    let url = ha_url();
    let pool = outbox_postgres::connect_pool(&url, 60).await.unwrap();
    let synchronous: String =
        sqlx::query_scalar("SELECT current_setting('synchronous_standby_names')")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert!(
        !synchronous.is_empty(),
        "the pair's primary names a synchronous standby"
    );

    // Slots an earlier run of this test left when it failed (each keeps WAL, and the pair's
    // servers allow ten): the test runs alone, so an inactive one is nobody's.
    sqlx::query(
        "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots \
         WHERE slot_name LIKE 'outbox\\_sync\\_cdc\\_%' AND NOT active",
    )
    .execute(&pool)
    .await
    .unwrap();
    // One schema relayed by polling, one by CDC.
    let polled = Schema::new(&outbox_testkit::unique_name("sync_poll")).unwrap();
    let streamed = Schema::new(&outbox_testkit::unique_name("sync_cdc")).unwrap();
    migrate(&pool, &polled).await.unwrap();
    migrate(&pool, &streamed).await.unwrap();
    let names = CdcNames::new(&streamed, "relay").unwrap();
    migrate_cdc(&pool, &names).await.unwrap();
    let polling = Arc::new(PgStore::new(pool.clone(), polled.clone()));
    let m = MemberId::random("sync-standby");
    let parts = polling
        .rebalance(&m, Duration::from_secs(3600))
        .await
        .unwrap();
    let cdc = CdcStore::new(pool.clone(), &url, names.clone())
        .await
        .unwrap();
    // Both relays run before the standby stops: what they hand out later is what the wait held.
    assert!(
        relay_for(&*polling, &m, &parts, 1, Duration::from_millis(500))
            .await
            .is_empty()
    );
    assert!(relay_for(&cdc, &m, &[], 1, Duration::from_millis(500))
        .await
        .is_empty());

    pg_ha(&["stop-standby"]);
    let back = StandbyBack;
    const N: u32 = 20;
    let mut writers = Vec::new();
    for n in 0..N {
        for schema in [&polled, &streamed] {
            // A key each: writers of one key queue on its lock behind the first waiting commit.
            let (pool, schema) = (pool.clone(), schema.clone());
            writers.push(tokio::spawn(async move {
                write(&pool, &schema, &format!("k{n}"), n).await
            }));
        }
    }
    // The commits are in the primary's WAL and wait for the standby (before the relays claim:
    // a claim's lock on the sequence waits for them, and later writers would queue behind it).
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        if waiting >= 2 * i64::from(N) {
            break;
        }
        assert!(
            Instant::now() < until,
            "{waiting} commits wait for the standby, not {}",
            2 * N
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        writers.iter().all(|w| !w.is_finished()),
        "a commit returned while the synchronous standby was stopped"
    );
    let early_polled = relay_for(&*polling, &m, &parts, 1, Duration::from_secs(5)).await;
    let early_streamed = relay_for(&cdc, &m, &[], 1, Duration::from_secs(5)).await;
    assert!(
        early_polled.is_empty(),
        "polling published {} messages of commits the standby had not acknowledged",
        early_polled.len()
    );
    assert!(
        early_streamed.is_empty(),
        "CDC published {} messages of commits the standby had not acknowledged",
        early_streamed.len()
    );

    drop(back);
    for w in writers {
        tokio::time::timeout(Duration::from_secs(60), w)
            .await
            .expect("the commits return once the standby is back")
            .unwrap();
    }
    let polled_all = relay_for(&*polling, &m, &parts, N as usize, Duration::from_secs(60)).await;
    let streamed_all = relay_for(&cdc, &m, &[], N as usize, Duration::from_secs(60)).await;
    assert_eq!(
        polled_all.len(),
        N as usize,
        "every commit delivered by polling"
    );
    assert_eq!(
        streamed_all.len(),
        N as usize,
        "every commit delivered by CDC"
    );

    drop(cdc);
    for _ in 0..50 {
        if drop_cdc(&pool, &names).await.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for schema in [&polled, &streamed] {
        let _ = sqlx::raw_sql(&schema.render("DROP SCHEMA {schema} CASCADE"))
            .execute(&pool)
            .await;
    }
}
