//! CDC setup shared by the CDC test binaries (`cdc.rs`, `cdc_conformance.rs`): a migrated
//! schema with its publication and slot, the guard that drops them when a test panics, the
//! cleanup after a passing one, and a lock that bounds how many slots these tests hold at once.

use std::time::{Duration, Instant};

use outbox_postgres::cdc::setup::{drop_cdc, migrate_cdc};
use outbox_postgres::cdc::{CdcNames, CdcStore};
use outbox_postgres::Schema;
use sqlx::{Connection, PgConnection, PgPool};

use super::{database_url, setup, teardown};

pub async fn cdc(tag: &str) -> (PgPool, Schema, CdcNames, SlotGuard) {
    let (pool, schema, _) = setup(tag).await;
    let (names, guard) = make_slot(&pool, &schema).await;
    (pool, schema, names, guard)
}

/// What `outbox migrate --cdc` does for `schema` (group `relay`): the slot starts now.
pub async fn make_slot(pool: &PgPool, schema: &Schema) -> (CdcNames, SlotGuard) {
    let names = CdcNames::new(schema, "relay").unwrap();
    migrate_cdc(pool, &names).await.unwrap();
    let guard = SlotGuard(names.clone());
    (names, guard)
}

/// Drops a test's slot, publication and schema when the test panics before its `cleanup`: a
/// slot left behind keeps every WAL segment written after it, on the developer's disk, for
/// good. On a thread and runtime of its own (the test's runtime is unwinding), and it ends the
/// session still holding the slot instead of waiting for it.
pub struct SlotGuard(pub CdcNames);

impl Drop for SlotGuard {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        let names = self.0.clone();
        let dropped = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?;
            rt.block_on(async {
                let pool = PgPool::connect(&database_url()).await.ok()?;
                for _ in 0..50 {
                    let _ = sqlx::query(
                        "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots \
                         WHERE slot_name = $1 AND active_pid IS NOT NULL",
                    )
                    .bind(&names.slot)
                    .execute(&pool)
                    .await;
                    if drop_cdc(&pool, &names).await.is_ok() {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                teardown(&pool, &names.schema).await;
                Some(())
            })
        })
        .join();
        if !matches!(dropped, Ok(Some(()))) {
            eprintln!(
                "could not drop the test slot `{}`; drop it by hand: SELECT \
                 pg_drop_replication_slot('{}')",
                self.0.slot, self.0.slot
            );
        }
    }
}

pub async fn cleanup(pool: &PgPool, schema: &Schema, names: &CdcNames) {
    // The slot is free once the store's session ended; that takes a moment after a drop.
    for _ in 0..50 {
        if drop_cdc(pool, names).await.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    teardown(pool, schema).await;
}

pub async fn store(pool: &PgPool, names: &CdcNames, url: &str) -> CdcStore {
    CdcStore::new(pool.clone(), url, names.clone())
        .await
        .unwrap()
}

/// Session advisory locks of which a test holds one while it holds a slot: the server allows
/// few replication slots (`max_replication_slots`), shared with every other test, and nextest
/// runs each test in a process of its own, so no in-process limit would hold.
const SLOT_LOCKS: [i64; 3] = [0x0CDC_0001, 0x0CDC_0002, 0x0CDC_0003];

/// Waits for one of [`SLOT_LOCKS`] and returns the session holding it: the lock is released
/// when the connection closes (dropped, or the process ended).
pub async fn slot_lock() -> PgConnection {
    let mut conn = PgConnection::connect(&database_url())
        .await
        .expect("PostgreSQL must be running for these tests");
    let until = Instant::now() + Duration::from_secs(180);
    loop {
        for id in SLOT_LOCKS {
            let got: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
                .bind(id)
                .fetch_one(&mut conn)
                .await
                .unwrap();
            if got {
                return conn;
            }
        }
        assert!(
            Instant::now() < until,
            "no slot lock free after three minutes"
        );
        tokio::time::sleep(
            Duration::from_millis(100) + Duration::from_millis(fastrand::u64(..100)),
        )
        .await;
    }
}
