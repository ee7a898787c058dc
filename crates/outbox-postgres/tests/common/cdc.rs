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
                drop_now(&pool, &names).await;
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

/// Ends the session reading `names.slot`, if any, and drops the slot, the publication and the
/// schema, without waiting for the session to end on its own.
async fn drop_now(pool: &PgPool, names: &CdcNames) {
    for _ in 0..50 {
        let _ = sqlx::query(
            "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots \
             WHERE slot_name = $1 AND active_pid IS NOT NULL",
        )
        .bind(&names.slot)
        .execute(pool)
        .await;
        if drop_cdc(pool, names).await.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    teardown(pool, &names.schema).await;
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

/// Waits for one of [`SLOT_LOCKS`] and returns the session holding it and the lock's number: the
/// lock is released when the connection closes (dropped, or the process ended).
pub async fn slot_lock() -> (PgConnection, usize) {
    let mut conn = PgConnection::connect(&database_url())
        .await
        .expect("PostgreSQL must be running for these tests");
    let until = Instant::now() + Duration::from_secs(180);
    loop {
        for (n, id) in SLOT_LOCKS.into_iter().enumerate() {
            let got: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
                .bind(id)
                .fetch_one(&mut conn)
                .await
                .unwrap();
            if got {
                return (conn, n);
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

/// The schema tag of a case holding lock `n` of [`SLOT_LOCKS`]: its slot is named after it, so
/// [`sweep_stale`] knows a slot only that lock's holder makes.
pub fn locked_tag(prefix: &str, n: usize) -> String {
    format!("{prefix}{n}")
}

/// Drops what a case holding the same lock left behind (its process was killed, say by
/// nextest's timeout, so its guard never ran): slots named after `tag`, with their publication
/// and schema. Only the lock's holder makes such slots, and the caller holds it now.
pub async fn sweep_stale(pool: &PgPool, tag: &str) {
    let slots: Vec<String> = sqlx::query_scalar(
        "SELECT slot_name::text FROM pg_replication_slots WHERE slot_name LIKE $1",
    )
    .bind(format!("outbox\\_{tag}\\_%\\_relay"))
    .fetch_all(pool)
    .await
    .unwrap();
    for slot in slots {
        let schema = &slot["outbox_".len()..slot.len() - "_relay".len()];
        let schema = Schema::new(schema).unwrap();
        eprintln!("dropping the stale test slot `{slot}`");
        drop_now(pool, &CdcNames::new(&schema, "relay").unwrap()).await;
    }
}

/// Waits (10 s at most) until the server has sent the reader of `slot` all WAL flushed now, and
/// a moment more for the reader to decode it: what was committed before the call is then in the
/// stream's hands. A claim hands out again, first and key by key, what an earlier claim handed
/// out and nobody completed, so a test that checks the order across keys claims once, after
/// this, rather than again and again while the stream arrives.
pub async fn wait_streamed(pool: &PgPool, slot: &str) {
    let flushed: Option<String> = sqlx::query_scalar("SELECT pg_current_wal_flush_lsn()::text")
        .fetch_one(pool)
        .await
        .unwrap();
    let target = flushed.as_deref().and_then(parse_lsn).unwrap();
    let until = Instant::now() + Duration::from_secs(10);
    while Instant::now() < until {
        let sent: Option<Option<String>> = sqlx::query_scalar(
            "SELECT r.sent_lsn::text FROM pg_stat_replication r \
             JOIN pg_replication_slots s ON s.active_pid = r.pid WHERE s.slot_name = $1",
        )
        .bind(slot)
        .fetch_optional(pool)
        .await
        .unwrap();
        if sent
            .flatten()
            .as_deref()
            .and_then(parse_lsn)
            .is_some_and(|sent| sent >= target)
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
}

/// `16/B374D848` as a number.
fn parse_lsn(text: &str) -> Option<u64> {
    let (hi, lo) = text.split_once('/')?;
    Some((u64::from_str_radix(hi, 16).ok()? << 32) | u64::from_str_radix(lo, 16).ok()?)
}
