//! CDC mode against the real PostgreSQL (wal_level=logical): what the stream hands out, what it
//! confirms, and what a restarted relay reads again. Each test has its own schema, publication
//! and slot, dropped at the end.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use common::cdc::{cdc, cleanup, make_slot, store, wait_streamed};
use common::{database_url, msg, setup, teardown};
use outbox_core::{ClaimLimits, MemberId, Message, OnFailed, Outcome, Store};
use outbox_postgres::cdc::setup::migrate_cdc;
use outbox_postgres::cdc::{CdcNames, CdcStore};
use outbox_postgres::{Emitter, Schema, Writer};
use sqlx::PgPool;

fn member() -> MemberId {
    MemberId::random("cdc-test")
}

/// Claims until the outstanding batch holds `n` messages or `within` passed, and returns it
/// uncompleted (the caller decides the outcomes). A claim hands out again, first, what the last
/// one handed out and nobody completed, so the last non-empty claim is the whole batch. Errors
/// (a slot still held by an old session) count as empty claims.
async fn claim_n(s: &CdcStore, n: usize, within: Duration) -> Vec<Message> {
    let m = member();
    let mut got = Vec::new();
    let until = Instant::now() + within;
    while got.len() < n && Instant::now() < until {
        let batch = s
            .claim(&m, &[], ClaimLimits::rows(10_000), OnFailed::Block)
            .await
            .unwrap_or_default();
        if batch.is_empty() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        } else {
            got = batch;
        }
    }
    got
}

/// Claims and publishes batch after batch, as the relay's worker does, until `n` messages were
/// published or `within` passed; returns them in the order handed out.
async fn drain_n(s: &CdcStore, n: usize, within: Duration) -> Vec<Message> {
    let m = member();
    let mut all = Vec::new();
    let until = Instant::now() + within;
    while all.len() < n && Instant::now() < until {
        let batch = s
            .claim(&m, &[], ClaimLimits::rows(1000), OnFailed::Block)
            .await
            .unwrap_or_default();
        if batch.is_empty() {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        }
        publish(s, &batch).await;
        all.extend(batch);
    }
    all
}

/// Claims and publishes until the numbers handed out so far satisfy `done`, failing the test
/// past `within`: for a message that may come after redeliveries of earlier ones.
async fn drain_until(
    s: &CdcStore,
    within: Duration,
    done: impl Fn(&[u64]) -> bool,
) -> Vec<Message> {
    let until = Instant::now() + within;
    let mut got = Vec::new();
    while !done(&numbers(&got)) {
        assert!(
            Instant::now() < until,
            "not yet after {within:?}: {:?}",
            numbers(&got)
        );
        got.extend(drain_n(s, 1, Duration::from_secs(1)).await);
    }
    got
}

async fn publish(s: &CdcStore, got: &[Message]) {
    let outcomes: Vec<Outcome> = got
        .iter()
        .map(|m| Outcome::Published { seq: m.seq })
        .collect();
    s.complete(&member(), &outcomes).await.unwrap();
}

async fn write(pool: &PgPool, schema: &Schema, key: &str, range: std::ops::Range<u32>) {
    let mut tx = pool.begin().await.unwrap();
    let w = Writer::new(schema);
    for n in range {
        w.enqueue(&mut tx, &msg(key, n)).await.unwrap();
    }
    tx.commit().await.unwrap();
}

fn numbers(got: &[Message]) -> Vec<u64> {
    got.iter()
        .map(|m| {
            let v: serde_json::Value = serde_json::from_slice(&m.payload).unwrap();
            v["n"].as_u64().unwrap()
        })
        .collect()
}

async fn slot_confirmed(pool: &PgPool, slot: &str) -> u64 {
    let lsn: String = sqlx::query_scalar(
        "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1",
    )
    .bind(slot)
    .fetch_one(pool)
    .await
    .unwrap();
    pgwire_lsn(&lsn)
}

fn pgwire_lsn(text: &str) -> u64 {
    let (hi, lo) = text.split_once('/').unwrap();
    (u64::from_str_radix(hi, 16).unwrap() << 32) | u64::from_str_radix(lo, 16).unwrap()
}

/// Waits until the server has what the store confirmed (feedback goes every 200 ms).
async fn wait_confirmed(pool: &PgPool, s: &CdcStore, slot: &str) {
    let want = s.confirmed().await;
    assert!(want > 0, "the store confirmed nothing");
    let until = Instant::now() + Duration::from_secs(10);
    while slot_confirmed(pool, slot).await < want {
        assert!(Instant::now() < until, "feedback did not reach the server");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_restarted_relay_gets_exactly_the_transactions_after_the_confirmed_position() {
    let (pool, schema, names, _guard) = cdc("cdc_restart").await;
    let url = database_url();
    let s = store(&pool, &names, &url).await;
    // Connect first: the stream starts at the slot's position.
    assert!(claim_n(&s, 1, Duration::from_millis(300)).await.is_empty());
    write(&pool, &schema, "a", 0..3).await;
    write(&pool, &schema, "b", 3..6).await;
    write(&pool, &schema, "a", 6..9).await;
    // All three in the stream first: a claim again after a partial one hands its batch out
    // again key by key, which is not the order this checks.
    wait_streamed(&pool, &names.slot).await;
    let got = claim_n(&s, 9, Duration::from_secs(10)).await;
    assert_eq!(numbers(&got), (0..9).collect::<Vec<_>>());
    // The first two transactions published, and one message of the third: the third is not
    // confirmed, whatever was published of it.
    publish(&s, &got[..7]).await;
    wait_confirmed(&pool, &s, &names.slot).await;
    s.release(&member()).await.unwrap();
    drop(s);
    let again = store(&pool, &names, &url).await;
    // The old session may hold the slot for a moment: claim_n retries.
    let got = drain_n(&again, 3, Duration::from_secs(10)).await;
    // Nothing more arrives.
    assert!(claim_n(&again, 1, Duration::from_millis(500))
        .await
        .is_empty());
    assert_eq!(numbers(&got), vec![6, 7, 8]);
    again.release(&member()).await.unwrap();
    drop(again);
    cleanup(&pool, &schema, &names).await;
}

#[tokio::test]
async fn a_rolled_back_transaction_is_never_published_and_emit_writes_no_row() {
    let (pool, schema, names, _guard) = cdc("cdc_rollback").await;
    let s = store(&pool, &names, &database_url()).await;
    assert!(claim_n(&s, 1, Duration::from_millis(300)).await.is_empty());
    write(&pool, &schema, "k", 0..1).await;
    let mut tx = pool.begin().await.unwrap();
    Writer::new(&schema)
        .enqueue(&mut tx, &msg("k", 1))
        .await
        .unwrap();
    Emitter::new(&schema)
        .emit(&mut tx, &msg("k", 2))
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    let mut tx = pool.begin().await.unwrap();
    let emitted = msg("k", 3);
    Emitter::new(&schema).emit(&mut tx, &emitted).await.unwrap();
    tx.commit().await.unwrap();
    write(&pool, &schema, "k", 4..5).await;
    let got = claim_n(&s, 3, Duration::from_secs(10)).await;
    got.iter().for_each(|m| assert_eq!(m.aggregate_id, "k"));
    assert_eq!(
        numbers(&got),
        vec![0, 3, 4],
        "commit order, no rolled-back message"
    );
    assert_eq!(got[1].id, emitted.id, "an emitted message keeps its id");
    publish(&s, &got).await;
    assert!(claim_n(&s, 1, Duration::from_millis(500)).await.is_empty());
    let rows: i64 = sqlx::query_scalar(&schema.render("SELECT count(*) FROM {schema}.outbox"))
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(rows, 2, "emit wrote no row");
    s.release(&member()).await.unwrap();
    drop(s);
    cleanup(&pool, &schema, &names).await;
}

/// A transaction larger than `logical_decoding_work_mem` is spilled to disk by the server and
/// sent whole once it committed: every message, in order.
#[tokio::test]
async fn a_transaction_spilled_to_disk_is_published_whole_and_in_order() {
    let (pool, schema, names, _guard) = cdc("cdc_spill").await;
    let url = format!(
        "{}?options=-c%20logical_decoding_work_mem%3D64kB",
        database_url()
    );
    let s = store(&pool, &names, &url).await;
    assert!(claim_n(&s, 1, Duration::from_millis(300)).await.is_empty());
    const N: u32 = 5_000;
    let mut tx = pool.begin().await.unwrap();
    sqlx::query(&schema.render(
        "INSERT INTO {schema}.outbox (aggregate_type, aggregate_id, event_type, payload) \
         SELECT 'order', 'k' || (g % 7), 'placed', \
                jsonb_build_object('n', g, 'pad', repeat('x', 200)) \
         FROM generate_series(0, $1 - 1) AS g",
    ))
    .bind(N as i32)
    .execute(&mut *tx)
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let got = drain_n(&s, N as usize, Duration::from_secs(30)).await;
    assert_eq!(numbers(&got), (0..u64::from(N)).collect::<Vec<_>>());
    wait_confirmed(&pool, &s, &names.slot).await;
    let spilled: i64 =
        sqlx::query_scalar("SELECT spill_txns FROM pg_stat_replication_slots WHERE slot_name = $1")
            .bind(&names.slot)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert!(
        spilled > 0,
        "the transaction was not spilled: the test proves nothing"
    );
    s.release(&member()).await.unwrap();
    drop(s);
    cleanup(&pool, &schema, &names).await;
}

/// With nothing in flight, the server's idle positions are confirmed: WAL written by other
/// tables is not held back by a quiet outbox.
#[tokio::test]
async fn an_idle_outbox_does_not_hold_back_wal_written_by_other_tables() {
    let (pool, schema, names, _guard) = cdc("cdc_idle").await;
    let s = store(&pool, &names, &database_url()).await;
    assert!(claim_n(&s, 1, Duration::from_millis(300)).await.is_empty());
    sqlx::raw_sql(&schema.render(
        "CREATE TABLE {schema}.other (id bigint, pad text); \
         INSERT INTO {schema}.other SELECT g, repeat('y', 500) FROM generate_series(1, 40000) g",
    ))
    .execute(&pool)
    .await
    .unwrap();
    let written: String = sqlx::query_scalar("SELECT pg_current_wal_lsn()::text")
        .fetch_one(&pool)
        .await
        .unwrap();
    let written = pgwire_lsn(&written);
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        claim_n(&s, 1, Duration::from_millis(100)).await;
        if slot_confirmed(&pool, &names.slot).await >= written {
            break;
        }
        assert!(
            Instant::now() < until,
            "the slot stayed behind the other table's WAL for a minute"
        );
    }
    s.release(&member()).await.unwrap();
    drop(s);
    cleanup(&pool, &schema, &names).await;
}

#[tokio::test]
async fn a_failed_message_parks_its_key_and_a_redrive_publishes_it_in_order() {
    let (pool, schema, names, _guard) = cdc("cdc_park").await;
    let s = store(&pool, &names, &database_url()).await;
    assert!(claim_n(&s, 1, Duration::from_millis(300)).await.is_empty());
    write(&pool, &schema, "k", 0..2).await;
    let got = claim_n(&s, 2, Duration::from_secs(10)).await;
    // The first fails; the second, behind it, was not tried.
    s.complete(
        &member(),
        &[Outcome::Failed {
            seq: got[0].seq,
            error: "rejected for good".into(),
        }],
    )
    .await
    .unwrap();
    write(&pool, &schema, "k", 2..3).await;
    write(&pool, &schema, "other", 3..4).await;
    let flowing = claim_n(&s, 1, Duration::from_secs(10)).await;
    assert_eq!(numbers(&flowing), vec![3], "other keys flow; k waits");
    publish(&s, &flowing).await;
    wait_confirmed(&pool, &s, &names.slot).await;
    let parked: Vec<(String, serde_json::Value)> = sqlx::query_as(
        &schema.render("SELECT state, payload FROM {schema}.outbox_parked ORDER BY seq"),
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let states: Vec<&str> = parked.iter().map(|(s, _)| s.as_str()).collect();
    assert_eq!(states, vec!["failed", "waiting", "waiting"]);
    assert_eq!(s.failed(10).await.unwrap().len(), 1);
    assert_eq!(
        s.redrive(&outbox_core::RedriveScope::All, "test")
            .await
            .unwrap(),
        1
    );
    let again = claim_n(&s, 3, Duration::from_secs(10)).await;
    assert_eq!(
        numbers(&again),
        vec![0, 1, 2],
        "the key, in order, after the redrive"
    );
    // The redriven head fails again: the two behind it stay parked, unpublished.
    s.complete(
        &member(),
        &[Outcome::Failed {
            seq: again[0].seq,
            error: "rejected again".into(),
        }],
    )
    .await
    .unwrap();
    assert!(
        claim_n(&s, 1, Duration::from_millis(1500)).await.is_empty(),
        "nothing of the key may pass its failed head"
    );
    let states: Vec<String> =
        sqlx::query_scalar(&schema.render("SELECT state FROM {schema}.outbox_parked ORDER BY seq"))
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(states, vec!["failed", "waiting", "waiting"]);
    assert_eq!(
        s.redrive(&outbox_core::RedriveScope::All, "test")
            .await
            .unwrap(),
        1
    );
    let again = claim_n(&s, 3, Duration::from_secs(10)).await;
    assert_eq!(
        numbers(&again),
        vec![0, 1, 2],
        "in order after the second redrive"
    );
    publish(&s, &again).await;
    let left: i64 =
        sqlx::query_scalar(&schema.render("SELECT count(*) FROM {schema}.outbox_parked"))
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(left, 0);
    s.release(&member()).await.unwrap();
    drop(s);
    cleanup(&pool, &schema, &names).await;
}

#[tokio::test]
async fn a_second_reader_of_the_group_is_refused_while_the_first_holds_the_slot() {
    let (pool, schema, names, _guard) = cdc("cdc_lease").await;
    let first = store(&pool, &names, &database_url()).await;
    assert!(claim_n(&first, 1, Duration::from_millis(300))
        .await
        .is_empty());
    let second = store(&pool, &names, &database_url()).await;
    let e = second
        .claim(&member(), &[], ClaimLimits::rows(10), OnFailed::Block)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("one reader at a time"), "{e}");
    first.release(&member()).await.unwrap();
    drop(first);
    second.release(&member()).await.unwrap();
    drop(second);
    cleanup(&pool, &schema, &names).await;
}

#[tokio::test]
async fn a_missing_slot_is_reported_with_its_fix() {
    let (pool, schema, _) = setup("cdc_noslot").await;
    let names = CdcNames::new(&schema, "relay").unwrap();
    let e = CdcStore::new(pool.clone(), &database_url(), names)
        .await
        .err()
        .unwrap();
    assert!(e.to_string().contains("outbox migrate --cdc"), "{e}");
    teardown(&pool, &schema).await;
}

/// Runs maintenance until the polling positions show nothing pending: the first round marks,
/// a later one (once the slot passed the mark) moves the positions.
async fn checkpointed(s: &CdcStore, pool: &PgPool, schema: &Schema) {
    let polling = outbox_postgres::PgStore::new(pool.clone(), schema.clone());
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        s.maintain(Duration::from_secs(3600)).await.unwrap();
        if polling.stats().await.unwrap().pending == 0 {
            return;
        }
        assert!(
            Instant::now() < until,
            "the positions never followed the relay"
        );
        // Idle positions from the server move the confirmed position past the mark.
        claim_n(s, 1, Duration::from_millis(100)).await;
    }
}

/// Ends the relay's replication session from the server and drops its slot before the relay
/// connects again: the slot is lost under a running relay.
async fn drop_slot_under_the_relay(pool: &PgPool, slot: &str) {
    sqlx::query(
        "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots \
         WHERE slot_name = $1 AND active_pid IS NOT NULL",
    )
    .bind(slot)
    .execute(pool)
    .await
    .unwrap();
    let until = Instant::now() + Duration::from_secs(10);
    while sqlx::query("SELECT pg_drop_replication_slot($1)")
        .bind(slot)
        .execute(pool)
        .await
        .is_err()
    {
        assert!(Instant::now() < until, "the slot could not be dropped");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Messages `0..n` were all published, some perhaps more than once, across `published`.
fn assert_each_at_least_once(published: &[&[Message]], n: u64) {
    let mut all: Vec<u64> = published.iter().flat_map(|p| numbers(p)).collect();
    all.sort_unstable();
    all.dedup();
    assert_eq!(
        all,
        (0..n).collect::<Vec<_>>(),
        "every message, at least once"
    );
}

/// Runs the worker's loop until every one of messages `0..n` was published at least once
/// (after a slot was lost the store delivers by polling, makes the slot again, catches up, and
/// streams), or `within` passed. Returns what was published.
async fn worker_until_all(s: &CdcStore, n: u64, within: Duration) -> Vec<Message> {
    let m = member();
    run_worker(s, &m, within, |_, all: &[Message]| {
        let mut seen: Vec<u64> = numbers(all);
        seen.sort_unstable();
        seen.dedup();
        seen.len() as u64 >= n
    })
    .await
}

/// An `emit` of message `n` on `key` in a transaction of its own.
async fn emit(pool: &PgPool, schema: &Schema, key: &str, n: u32) -> outbox_core::Result<()> {
    let mut tx = pool.begin().await.unwrap();
    Emitter::new(schema).emit(&mut tx, &msg(key, n)).await?;
    tx.commit().await.unwrap();
    Ok(())
}

/// Runs the worker's loop until the store, having found its slot lost, reads the stream again
/// (made its slot again and caught up), publishing what it is handed.
async fn until_streaming(s: &CdcStore, within: Duration) -> Vec<Message> {
    let m = member();
    let lost = std::cell::Cell::new(false);
    run_worker(s, &m, within, |s, _| {
        if s.recovering() || s.catching_up() {
            lost.set(true);
        }
        lost.get() && !s.recovering() && !s.catching_up()
    })
    .await
}

/// The CDC relay moves the polling positions behind it (checkpoints), so `outbox status` counts
/// nothing pending once it published everything.
#[tokio::test]
async fn checkpoints_move_the_polling_positions_behind_the_relay() {
    let (pool, schema, names, _guard) = cdc("cdc_ckpt").await;
    let s = store(&pool, &names, &database_url()).await;
    assert!(claim_n(&s, 1, Duration::from_millis(300)).await.is_empty());
    for k in 0..20 {
        write(&pool, &schema, &format!("k{k}"), k * 5..k * 5 + 5).await;
    }
    let polling = outbox_postgres::PgStore::new(pool.clone(), schema.clone());
    assert_eq!(polling.stats().await.unwrap().pending, 100);
    let got = claim_n(&s, 100, Duration::from_secs(10)).await;
    publish(&s, &got).await;
    checkpointed(&s, &pool, &schema).await;
    s.release(&member()).await.unwrap();
    drop(s);
    cleanup(&pool, &schema, &names).await;
}

/// The slot is dropped under the relay: it delivers the table's messages by polling from the
/// last checkpoint, makes the slot again, reads back from the WAL the `emit` messages the lost
/// slot had not delivered (parked, then published), and streams again. An `emit` while no slot
/// exists fails in its writer's transaction. Nothing committed is lost.
#[tokio::test]
async fn a_lost_slot_is_made_again_and_no_table_or_emit_message_is_lost() {
    let (pool, schema, names, _guard) = cdc("cdc_lost").await;
    let s = store(&pool, &names, &database_url()).await;
    assert!(claim_n(&s, 1, Duration::from_millis(300)).await.is_empty());
    // 50 messages published and checkpointed (the slot's position is recorded then).
    for k in 0..5 {
        write(&pool, &schema, &format!("k{k}"), k * 10..k * 10 + 10).await;
    }
    let early = claim_n(&s, 50, Duration::from_secs(10)).await;
    publish(&s, &early).await;
    checkpointed(&s, &pool, &schema).await;
    // 50 more rows, of which 30 published, and 10 emits none of which is.
    for k in 5..10 {
        write(&pool, &schema, &format!("k{k}"), k * 10..k * 10 + 10).await;
    }
    for n in 110..120 {
        emit(&pool, &schema, "e", n).await.unwrap();
    }
    let late = claim_n(&s, 60, Duration::from_secs(10)).await;
    assert_eq!(late.len(), 60);
    let late_rows: Vec<Message> = late
        .iter()
        .filter(|m| m.aggregate_id != "e")
        .take(30)
        .cloned()
        .collect();
    publish(&s, &late_rows).await;
    wait_confirmed(&pool, &s, &names.slot).await;
    // The slot goes: its session ended by the server, then dropped before the relay is back.
    drop_slot_under_the_relay(&pool, &names.slot).await;
    let refused = emit(&pool, &schema, "e", 999).await.unwrap_err();
    assert!(
        refused.to_string().contains("missing or lost"),
        "an emit with no slot fails in its transaction: {refused}"
    );
    write(&pool, &schema, "after", 100..110).await;
    let rest = worker_until_all(&s, 70, Duration::from_secs(60)).await;
    let first: Vec<Message> = early.into_iter().chain(late_rows).collect();
    let mut all: Vec<u64> = numbers(&first).into_iter().chain(numbers(&rest)).collect();
    all.sort_unstable();
    all.dedup();
    assert_eq!(
        all,
        (0..120).collect::<Vec<_>>(),
        "every row and every emit committed, at least once (the refused emit never)"
    );
    assert_eq!(
        numbers_of(&rest, "e"),
        (110..120).collect::<Vec<_>>(),
        "the emits read back from the WAL, in commit order"
    );
    assert!(
        outbox_postgres::cdc::setup::slot_exists(&pool, &names.slot)
            .await
            .unwrap(),
        "the slot is made again"
    );
    run_worker(&s, &member(), Duration::from_secs(30), |s, _| {
        !s.recovering() && !s.catching_up()
    })
    .await;
    emit(&pool, &schema, "e", 120).await.unwrap();
    let streamed = drain_n(&s, 1, Duration::from_secs(10)).await;
    assert_eq!(numbers(&streamed), vec![120], "and the stream again");
    drop(s);
    cleanup(&pool, &schema, &names).await;
}

/// Parking fails (the database refuses the write): the relay reads the stream again from the
/// confirmed position, so the message is parked on the next try instead of being held for ever.
#[tokio::test]
async fn a_park_that_fails_reads_the_stream_again_instead_of_stalling() {
    let (pool, schema, names, _guard) = cdc("cdc_parkfail").await;
    let s = store(&pool, &names, &database_url()).await;
    assert!(claim_n(&s, 1, Duration::from_millis(300)).await.is_empty());
    write(&pool, &schema, "k", 0..2).await;
    let got = claim_n(&s, 2, Duration::from_secs(10)).await;
    let rename = |from: &'static str, to: &'static str| {
        let sql = schema.render(&format!("ALTER TABLE {{schema}}.{from} RENAME TO {to}"));
        let pool = pool.clone();
        async move { sqlx::query(&sql).execute(&pool).await.unwrap() }
    };
    rename("outbox_parked", "outbox_parked_away").await;
    let failed = |m: &Message| Outcome::Failed {
        seq: m.seq,
        error: "rejected for good".into(),
    };
    assert!(s.complete(&member(), &[failed(&got[0])]).await.is_err());
    rename("outbox_parked_away", "outbox_parked").await;
    let again = claim_n(&s, 2, Duration::from_secs(10)).await;
    assert_eq!(
        numbers(&again),
        vec![0, 1],
        "read again from the confirmed position"
    );
    s.complete(&member(), &[failed(&again[0])]).await.unwrap();
    let states: Vec<String> =
        sqlx::query_scalar(&schema.render("SELECT state FROM {schema}.outbox_parked ORDER BY seq"))
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(states, vec!["failed", "waiting"]);
    s.release(&member()).await.unwrap();
    drop(s);
    cleanup(&pool, &schema, &names).await;
}

/// A message of the key waits in the relay (it did not fit the last claim's byte bound) when the
/// key's head fails: it is parked behind the failure, never published ahead of it.
#[tokio::test]
async fn what_the_relay_holds_of_a_key_is_parked_behind_its_failed_head() {
    let (pool, schema, names, _guard) = cdc("cdc_holdpark").await;
    let s = store(&pool, &names, &database_url()).await;
    assert!(claim_n(&s, 1, Duration::from_millis(300)).await.is_empty());
    write(&pool, &schema, "k", 0..2).await;
    let m = member();
    let mut got = Vec::new();
    let until = Instant::now() + Duration::from_secs(10);
    while got.is_empty() {
        assert!(Instant::now() < until);
        // One byte: the first message goes alone, the second waits in the relay.
        got = s
            .claim(&m, &[], ClaimLimits { rows: 10, bytes: 1 }, OnFailed::Block)
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(numbers(&got), vec![0]);
    s.complete(
        &m,
        &[Outcome::Failed {
            seq: got[0].seq,
            error: "rejected for good".into(),
        }],
    )
    .await
    .unwrap();
    assert!(
        claim_n(&s, 1, Duration::from_millis(500)).await.is_empty(),
        "the key's next message must wait behind its failure"
    );
    let parked: Vec<(String, serde_json::Value)> = sqlx::query_as(
        &schema.render("SELECT state, payload FROM {schema}.outbox_parked ORDER BY seq"),
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let got: Vec<(&str, u64)> = parked
        .iter()
        .map(|(st, p)| (st.as_str(), p["n"].as_u64().unwrap()))
        .collect();
    assert_eq!(got, vec![("failed", 0), ("waiting", 1)]);
    s.release(&member()).await.unwrap();
    drop(s);
    cleanup(&pool, &schema, &names).await;
}

/// A batch handed out and never completed (the worker lost the answer) is handed out again,
/// in order, before anything new.
#[tokio::test]
async fn messages_handed_out_without_an_outcome_come_again_first() {
    let (pool, schema, names, _guard) = cdc("cdc_leftover").await;
    let s = store(&pool, &names, &database_url()).await;
    assert!(claim_n(&s, 1, Duration::from_millis(300)).await.is_empty());
    write(&pool, &schema, "k", 0..2).await;
    let m = member();
    let mut first = Vec::new();
    let until = Instant::now() + Duration::from_secs(10);
    while first.len() < 2 && Instant::now() < until {
        first = s
            .claim(&m, &[], ClaimLimits::rows(2), OnFailed::Block)
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(numbers(&first), vec![0, 1]);
    write(&pool, &schema, "k", 2..3).await;
    let again = claim_n(&s, 3, Duration::from_secs(10)).await;
    assert_eq!(
        numbers(&again),
        vec![0, 1, 2],
        "again, in order, then the new one"
    );
    publish(&s, &again).await;
    s.release(&member()).await.unwrap();
    drop(s);
    cleanup(&pool, &schema, &names).await;
}

/// Under `--on-failed skip` a failed message does not hold its key, also after a restart.
#[tokio::test]
async fn under_skip_a_failed_message_does_not_hold_its_key_after_a_restart() {
    let (pool, schema, names, _guard) = cdc("cdc_skip").await;
    let m = member();
    async fn claim_skip(s: &CdcStore, m: &MemberId) -> Vec<Message> {
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            let got = s
                .claim(m, &[], ClaimLimits::rows(100), OnFailed::Skip)
                .await
                .unwrap_or_default();
            if !got.is_empty() || Instant::now() > until {
                return got;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let s = store(&pool, &names, &database_url()).await;
    let _ = s
        .claim(&m, &[], ClaimLimits::rows(1), OnFailed::Skip)
        .await
        .unwrap();
    write(&pool, &schema, "k", 0..1).await;
    let got = claim_skip(&s, &m).await;
    assert_eq!(numbers(&got), vec![0]);
    s.complete(
        &m,
        &[Outcome::Failed {
            seq: got[0].seq,
            error: "rejected for good".into(),
        }],
    )
    .await
    .unwrap();
    wait_confirmed(&pool, &s, &names.slot).await;
    s.release(&m).await.unwrap();
    drop(s);
    let s = store(&pool, &names, &database_url()).await;
    write(&pool, &schema, "k", 1..2).await;
    let got = claim_skip(&s, &m).await;
    assert_eq!(
        numbers(&got),
        vec![1],
        "the key flows past its failed message"
    );
    publish(&s, &got).await;
    s.release(&m).await.unwrap();
    drop(s);
    cleanup(&pool, &schema, &names).await;
}

#[tokio::test]
async fn a_second_cdc_group_on_one_schema_is_refused() {
    let (pool, schema, names, _guard) = cdc("cdc_groups").await;
    let other = CdcNames::new(&schema, "eu").unwrap();
    let e = migrate_cdc(&pool, &other).await.unwrap_err();
    assert!(e.to_string().contains("one CDC group per schema"), "{e}");
    cleanup(&pool, &schema, &names).await;
}

/// After the slot is lost, a message the CDC relay parked as failed is still the polling
/// engine's to deliver: redriven, it is published, in order with its key. The key's head is a
/// logical message, its next a row: the row is parked behind it (a fresh seq, not its own, which
/// would sort it first).
#[tokio::test]
async fn after_a_lost_slot_a_message_parked_by_cdc_is_redriven_in_order() {
    let (pool, schema, names, _guard) = cdc("cdc_fbpark").await;
    let s = store(&pool, &names, &database_url()).await;
    assert!(claim_n(&s, 1, Duration::from_millis(300)).await.is_empty());
    write(&pool, &schema, "warm", 0..5).await;
    drain_n(&s, 5, Duration::from_secs(10)).await;
    checkpointed(&s, &pool, &schema).await;
    let mut tx = pool.begin().await.unwrap();
    Emitter::new(&schema)
        .emit(&mut tx, &msg("k", 10))
        .await
        .unwrap();
    Writer::new(&schema)
        .enqueue(&mut tx, &msg("k", 11))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let got = claim_n(&s, 2, Duration::from_secs(10)).await;
    assert_eq!(numbers(&got), vec![10, 11]);
    s.complete(
        &member(),
        &[Outcome::Failed {
            seq: got[0].seq,
            error: "rejected for good".into(),
        }],
    )
    .await
    .unwrap();
    wait_confirmed(&pool, &s, &names.slot).await;
    drop_slot_under_the_relay(&pool, &names.slot).await;
    // Polling (the recovery, the catch-up) meets row 11 again: its key waits behind the failure.
    let before = until_streaming(&s, Duration::from_secs(30)).await;
    assert!(
        numbers(&before).iter().all(|n| !(10..12).contains(n)),
        "nothing of the key while its head is failed: {:?}",
        numbers(&before)
    );
    assert_eq!(
        s.redrive(&outbox_core::RedriveScope::All, "test")
            .await
            .unwrap(),
        1
    );
    let rest = worker_until_all(&s, 2, Duration::from_secs(30)).await;
    assert_eq!(
        numbers_of(&rest, "k"),
        vec![10, 11],
        "the redriven head first, then its key"
    );
    drop(s);
    cleanup(&pool, &schema, &names).await;
}

/// The review's N2: a key's head (a row) fails and its next row waits behind it, both parked by
/// the CDC relay; the slot is lost, and the polling engine reads the same rows again from the
/// checkpoint before anyone redrives. It must publish neither (the key is blocked), and parks
/// no second copy; after the redrive, the head first. CDC once parked them at fresh seqs, and
/// polling parked copies at their own, older seqs, ahead of the failure.
#[tokio::test]
async fn rows_parked_by_cdc_keep_their_seqs_so_polling_after_a_lost_slot_keeps_the_key_blocked() {
    let (pool, schema, names, _guard) = cdc("cdc_n2").await;
    let s = store(&pool, &names, &database_url()).await;
    assert!(claim_n(&s, 1, Duration::from_millis(300)).await.is_empty());
    write(&pool, &schema, "warm", 0..5).await;
    drain_n(&s, 5, Duration::from_secs(10)).await;
    checkpointed(&s, &pool, &schema).await;
    write(&pool, &schema, "k", 10..12).await;
    let got = claim_n(&s, 2, Duration::from_secs(10)).await;
    assert_eq!(numbers(&got), vec![10, 11]);
    s.complete(
        &member(),
        &[Outcome::Failed {
            seq: got[0].seq,
            error: "rejected for good".into(),
        }],
    )
    .await
    .unwrap();
    wait_confirmed(&pool, &s, &names.slot).await;
    drop_slot_under_the_relay(&pool, &names.slot).await;
    let before = until_streaming(&s, Duration::from_secs(30)).await;
    assert!(
        numbers(&before).iter().all(|n| !(10..12).contains(n)),
        "nothing of the blocked key: {:?}",
        numbers(&before)
    );
    let parked: i64 = sqlx::query_scalar(
        &schema.render("SELECT count(*) FROM {schema}.outbox_parked WHERE aggregate_id = 'k'"),
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(parked, 2, "one parked copy of each");
    s.redrive(&outbox_core::RedriveScope::All, "test")
        .await
        .unwrap();
    let rest = worker_until_all(&s, 2, Duration::from_secs(30)).await;
    assert_eq!(numbers_of(&rest, "k"), vec![10, 11]);
    drop(s);
    cleanup(&pool, &schema, &names).await;
}

/// A malformed logical message arrives while an earlier message of its key waits for a retry:
/// it is parked behind that message, never ahead, so a redrive cannot publish it first. Key
/// `a`'s head then fails for good (parked first, the malformed one and the message behind it
/// after it); key `b`'s head is published (then the malformed one is parked, and the message
/// behind it waits behind that).
#[tokio::test]
async fn a_malformed_message_is_parked_behind_its_keys_earlier_messages() {
    let (pool, schema, names, _guard) = cdc("cdc_malformed").await;
    let s = store(&pool, &names, &database_url()).await;
    assert!(claim_n(&s, 1, Duration::from_millis(300)).await.is_empty());
    write(&pool, &schema, "a", 0..1).await;
    write(&pool, &schema, "b", 1..2).await;
    let heads = claim_n(&s, 2, Duration::from_secs(10)).await;
    assert_eq!(numbers(&heads), vec![0, 1]);
    let retry = |m: &Message| Outcome::Retry {
        seq: m.seq,
        error: "broker said later".into(),
        delay: Duration::from_millis(500),
    };
    s.complete(&member(), &[retry(&heads[0]), retry(&heads[1])])
        .await
        .unwrap();
    for key in ["a", "b"] {
        let mut tx = pool.begin().await.unwrap();
        let content = format!(r#"{{"aggregate_type":"order","aggregate_id":"{key}"}}"#);
        sqlx::query("SELECT pg_logical_emit_message(true, $1, $2)")
            .bind(&names.prefix)
            .bind(content)
            .execute(&mut *tx)
            .await
            .unwrap();
        tx.commit().await.unwrap();
    }
    write(&pool, &schema, "a", 2..3).await;
    write(&pool, &schema, "b", 3..4).await;
    // The heads come again after their delay, alone: what follows them waits.
    let again = claim_n(&s, 2, Duration::from_secs(10)).await;
    assert_eq!(numbers(&again), vec![0, 1]);
    let parked_now: i64 =
        sqlx::query_scalar(&schema.render("SELECT count(*) FROM {schema}.outbox_parked"))
            .fetch_one(&pool)
            .await
            .unwrap();
    if parked_now != 0 {
        let rows: Vec<(String, String, Option<String>, serde_json::Value)> = sqlx::query_as(
            &schema.render("SELECT aggregate_id, state, last_error, payload FROM {schema}.outbox_parked ORDER BY seq"),
        )
        .fetch_all(&pool)
        .await
        .unwrap();
        panic!("parked ahead of the heads: {rows:?}");
    }
    s.complete(
        &member(),
        &[
            Outcome::Failed {
                seq: again[0].seq,
                error: "rejected for good".into(),
            },
            Outcome::Published { seq: again[1].seq },
        ],
    )
    .await
    .unwrap();
    // `b`'s malformed message is parked at the next claim; nothing of either key is handed out.
    assert!(claim_n(&s, 1, Duration::from_millis(1500)).await.is_empty());
    let parked: Vec<(String, String, Option<String>, serde_json::Value)> =
        sqlx::query_as(&schema.render(
            "SELECT aggregate_id, state, last_error, payload FROM {schema}.outbox_parked \
             ORDER BY seq",
        ))
        .fetch_all(&pool)
        .await
        .unwrap();
    let got: Vec<(&str, &str, Option<u64>)> = parked
        .iter()
        .map(|(k, st, _, p)| (k.as_str(), st.as_str(), p["n"].as_u64()))
        .collect();
    assert_eq!(
        got,
        vec![
            ("a", "failed", Some(0)),
            ("a", "failed", None),
            ("a", "waiting", Some(2)),
            ("b", "failed", None),
            ("b", "waiting", Some(3)),
        ]
    );
    for (key, state, error, _) in &parked {
        if state == "failed" && error.as_deref() != Some("rejected for good") {
            assert!(
                error.as_deref().is_some_and(|e| e.contains("lacks")),
                "{key}: the malformed message keeps its reason, got {error:?}"
            );
        }
    }
    s.release(&member()).await.unwrap();
    drop(s);
    cleanup(&pool, &schema, &names).await;
}

/// The slot is further behind than the relay's limit while the relay is behind (messages in
/// hand, unpublished): the maintenance round drops the slot (holding the emitters' lock), makes
/// it again, and every message, rows and emits, is delivered at least once.
#[tokio::test]
async fn a_slot_over_the_retained_limit_is_dropped_and_made_again() {
    let (pool, schema, names, _guard) = cdc("cdc_overlimit").await;
    let s = store(&pool, &names, &database_url())
        .await
        .with_max_retained(Some(1));
    assert!(claim_n(&s, 1, Duration::from_millis(300)).await.is_empty());
    write(&pool, &schema, "k", 0..20).await;
    for n in 20..25 {
        emit(&pool, &schema, "e", n).await.unwrap();
    }
    let got = claim_n(&s, 25, Duration::from_secs(10)).await;
    publish(&s, &got[..10]).await;
    // Fifteen in hand: the relay is behind, so the round looks at the slot, over 1 byte.
    s.maintain(Duration::from_secs(3600)).await.unwrap();
    assert!(s.recovering(), "over its limit, the slot is dropped");
    assert!(
        !outbox_postgres::cdc::setup::slot_exists(&pool, &names.slot)
            .await
            .unwrap(),
        "the slot is dropped, and its WAL with it"
    );
    write(&pool, &schema, "k", 25..30).await;
    let rest = worker_until_all(&s, 30, Duration::from_secs(60)).await;
    assert_each_at_least_once(&[&got[..10], &rest], 30);
    drop(s);
    cleanup(&pool, &schema, &names).await;
}

/// The worker's loop with one member, as `outbox relay` runs it: rebalance, claim (small
/// batches, so windows are read in several claims), publish, complete; until `done` says so or
/// `within` passed. Returns what was published, in order.
async fn run_worker(
    s: &CdcStore,
    m: &MemberId,
    within: Duration,
    done: impl Fn(&CdcStore, &[Message]) -> bool,
) -> Vec<Message> {
    run_worker_failing(s, m, within, done, |_| false).await
}

/// [`run_worker`], where the broker rejects for good the messages `fails` names: returns what
/// was published.
async fn run_worker_failing(
    s: &CdcStore,
    m: &MemberId,
    within: Duration,
    done: impl Fn(&CdcStore, &[Message]) -> bool,
    fails: impl Fn(u64) -> bool,
) -> Vec<Message> {
    let mut all = Vec::new();
    let until = Instant::now() + within;
    while !done(s, &all) {
        assert!(
            Instant::now() < until,
            "the worker did not get there in time"
        );
        // As the worker does: a failed call (the stream lost, the slot being made again) is
        // retried after a pause.
        let Ok(parts) = s.rebalance(m, Duration::from_secs(30)).await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let Ok(got) = s
            .claim(m, &parts, ClaimLimits::rows(7), OnFailed::Block)
            .await
        else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        if got.is_empty() {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        }
        // As the relay's delivery does: after a key's failure, its later messages of the batch
        // are not tried (no outcome; they come again).
        let mut failed_keys = std::collections::HashSet::new();
        let mut outcomes = Vec::new();
        for (x, n) in got.iter().zip(numbers(&got)) {
            if failed_keys.contains(&x.aggregate_id) {
                continue;
            }
            if fails(n) {
                failed_keys.insert(x.aggregate_id.clone());
                outcomes.push(Outcome::Failed {
                    seq: x.seq,
                    error: "rejected for good".into(),
                });
            } else {
                outcomes.push(Outcome::Published { seq: x.seq });
                all.push(x.clone());
            }
        }
        s.complete(m, &outcomes).await.unwrap();
    }
    all
}

/// A polling relay claims `n` messages, publishes them and stops (releasing its partitions):
/// the window it read stays open past them. Returns what it published.
async fn polling_relay_stops_in_mid_window(
    polling: &outbox_postgres::PgStore,
    n: usize,
) -> Vec<Message> {
    let pm = member();
    let parts = polling
        .rebalance(&pm, Duration::from_secs(30))
        .await
        .unwrap();
    let early = polling
        .claim(&pm, &parts, ClaimLimits::rows(n), OnFailed::Block)
        .await
        .unwrap();
    let outcomes: Vec<Outcome> = early
        .iter()
        .map(|x| Outcome::Published { seq: x.seq })
        .collect();
    polling.complete(&pm, &outcomes).await.unwrap();
    polling.release(&pm).await.unwrap();
    early
}

/// The numbers of `key`'s messages among `published`, in the order published.
fn numbers_of(published: &[Message], key: &str) -> Vec<u64> {
    published
        .iter()
        .zip(numbers(published))
        .filter(|(x, _)| x.aggregate_id == key)
        .map(|(_, n)| n)
        .collect()
}

/// Each key's first deliveries, in the order published, are its messages in the order written.
fn assert_first_deliveries_in_order(published: &[Message]) {
    let mut seen = std::collections::HashSet::new();
    let mut last: std::collections::HashMap<String, u64> = Default::default();
    for (m, n) in published.iter().zip(numbers(published)) {
        if !seen.insert(n) {
            continue;
        }
        if let Some(prev) = last.insert(m.aggregate_id.clone(), n) {
            assert!(
                prev < n,
                "key {}: {n} first published after {prev}",
                m.aggregate_id
            );
        }
    }
}

/// Messages written before the slot was created are not in its stream. A polling relay
/// delivered a few of them and stopped in mid-window; the CDC relay then delivers the rest by
/// polling (the catch-up), and only then reads the stream: every message at least once, each
/// key's in order, and the positions follow the relay afterwards.
#[tokio::test]
async fn messages_written_before_the_slot_are_delivered_before_the_stream() {
    let (pool, schema, polling) = common::setup("cdc_catchup").await;
    for k in 0..3 {
        write(&pool, &schema, &format!("k{k}"), k * 10..k * 10 + 10).await;
    }
    // A polling relay publishes the first 4 messages of one window and stops.
    let early = polling_relay_stops_in_mid_window(&polling, 4).await;
    assert_eq!(early.len(), 4);
    let (names, _guard) = make_slot(&pool, &schema).await;
    // Written after the slot: in its stream.
    write(&pool, &schema, "k0", 30..40).await;

    let s = store(&pool, &names, &database_url()).await;
    assert!(
        s.catching_up(),
        "26 messages written before the slot are pending"
    );
    let g = s.gauges().await.unwrap();
    assert_eq!(
        g.pending, 36,
        "the table's backlog, counted as in polling mode"
    );
    assert!(
        g.cdc_slot.is_some(),
        "the slot stays watched during the catch-up"
    );
    let m = member();
    let caught_up = run_worker(&s, &m, Duration::from_secs(60), |s, _| !s.catching_up()).await;
    let delivered: std::collections::HashSet<u64> = numbers(&early)
        .into_iter()
        .chain(numbers(&caught_up))
        .collect();
    assert!(
        (0..30).all(|n| delivered.contains(&n)),
        "every message written before the slot, before the stream starts"
    );

    // Now the stream: a message only it can carry (emit), and more rows.
    let mut tx = pool.begin().await.unwrap();
    Emitter::new(&schema)
        .emit(&mut tx, &msg("k1", 40))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    write(&pool, &schema, "k2", 41..45).await;
    let streamed = run_worker(&s, &m, Duration::from_secs(30), |_, got| {
        numbers(got).contains(&44)
    })
    .await;
    assert!(
        numbers(&streamed).contains(&40),
        "the emitted message comes from the stream"
    );
    assert!(
        numbers(&streamed).iter().all(|n| *n >= 30),
        "the stream starts at the slot: nothing written before it"
    );
    assert_each_at_least_once(&[&early, &caught_up, &streamed], 45);
    let all: Vec<Message> = early
        .iter()
        .chain(&caught_up)
        .chain(&streamed)
        .cloned()
        .collect();
    assert_first_deliveries_in_order(&all);
    checkpointed(&s, &pool, &schema).await;
    s.release(&m).await.unwrap();
    drop(s);
    cleanup(&pool, &schema, &names).await;
}

/// A polling relay stopped in mid-window after the slot was created: the window holds only
/// messages the stream carries, so the CDC relay's checkpoint closes it (it no longer pins the
/// partition's position, and retention, until a polling relay comes back).
#[tokio::test]
async fn a_window_a_stopped_polling_relay_left_open_is_checkpointed() {
    let (pool, schema, names, _guard) = cdc("cdc_openwin").await;
    write(&pool, &schema, "k", 0..10).await;
    let polling = outbox_postgres::PgStore::new(pool.clone(), schema.clone());
    let early = polling_relay_stops_in_mid_window(&polling, 4).await;
    assert_eq!(numbers(&early), vec![0, 1, 2, 3]);
    let open_windows = || async {
        sqlx::query_scalar::<_, i64>(&schema.render(
            "SELECT count(*) FROM (SELECT DISTINCT ON (partition) cur FROM {schema}.outbox_positions \
             ORDER BY partition, id DESC) l WHERE cur IS NOT NULL",
        ))
        .fetch_one(&pool)
        .await
        .unwrap()
    };
    assert!(
        open_windows().await >= 1,
        "the polling relay left its window open"
    );

    let s = store(&pool, &names, &database_url()).await;
    assert!(!s.catching_up(), "nothing was written before the slot");
    let got = claim_n(&s, 10, Duration::from_secs(10)).await;
    assert_eq!(numbers(&got), (0..10).collect::<Vec<_>>());
    publish(&s, &got).await;
    checkpointed(&s, &pool, &schema).await;
    assert_eq!(open_windows().await, 0, "the checkpoint closed the window");
    s.release(&member()).await.unwrap();
    drop(s);
    cleanup(&pool, &schema, &names).await;
}

/// A message written before the slot fails for good during the catch-up (`--on-failed block`):
/// the catch-up still ends, the stream's copies of the key's later messages wait behind the
/// failure instead of passing it, and a redrive publishes the key in order.
#[tokio::test]
async fn a_failure_during_the_catch_up_keeps_its_key_behind_it_in_the_stream() {
    let (pool, schema, _) = common::setup("cdc_catchup_fail").await;
    write(&pool, &schema, "k", 0..5).await;
    write(&pool, &schema, "other", 5..6).await;
    let (names, _guard) = make_slot(&pool, &schema).await;
    write(&pool, &schema, "k", 6..8).await;
    write(&pool, &schema, "other", 8..9).await;

    let s = store(&pool, &names, &database_url()).await;
    assert!(s.catching_up());
    let m = member();
    let mut published = run_worker_failing(
        &s,
        &m,
        Duration::from_secs(60),
        |s, _| !s.catching_up(),
        |n| n == 2,
    )
    .await;
    // The stream: `other` flows (its message written now can only come from the stream), `k`
    // stays behind its failed message.
    write(&pool, &schema, "other", 9..10).await;
    published.extend(
        run_worker(&s, &m, Duration::from_secs(30), |_, got| {
            numbers(got).contains(&9)
        })
        .await,
    );
    assert!(
        claim_n(&s, 1, Duration::from_millis(1500)).await.is_empty(),
        "k's later messages wait behind the failure"
    );
    let of_k = numbers_of(&published, "k");
    assert_eq!(of_k, vec![0, 1], "nothing of k passes its failed message");
    assert_eq!(s.failed(10).await.unwrap().len(), 1);
    assert_eq!(
        s.redrive(&outbox_core::RedriveScope::All, "test")
            .await
            .unwrap(),
        1
    );
    let again = run_worker(&s, &m, Duration::from_secs(30), |_, got| {
        numbers(got).contains(&7)
    })
    .await;
    let again_k = numbers_of(&again, "k");
    assert_eq!(
        again_k.first(),
        Some(&2),
        "the redrive starts with the failed message"
    );
    assert_first_deliveries_in_order(&again);
    assert!(
        [2, 3, 4, 6, 7].iter().all(|n| again_k.contains(n)),
        "the rest of k: {again_k:?}"
    );
    s.release(&m).await.unwrap();
    drop(s);
    cleanup(&pool, &schema, &names).await;
}

/// A slot over the relay's own limit during a catch-up (the slot waits unread meanwhile) is
/// dropped as it would be while streaming, and made again: every message still arrives.
#[tokio::test]
async fn a_slot_over_the_retained_limit_during_the_catch_up_is_dropped() {
    let (pool, schema, polling) = common::setup("cdc_catchup_limit").await;
    write(&pool, &schema, "k", 0..10).await;
    let early = polling_relay_stops_in_mid_window(&polling, 4).await;
    let (names, _guard) = make_slot(&pool, &schema).await;
    write(&pool, &schema, "k", 10..20).await;
    let s = store(&pool, &names, &database_url())
        .await
        .with_max_retained(Some(1));
    assert!(s.catching_up());
    s.maintain(Duration::from_secs(3600)).await.unwrap();
    assert!(s.recovering(), "over its limit, the slot is dropped");
    assert!(
        !outbox_postgres::cdc::setup::slot_exists(&pool, &names.slot)
            .await
            .unwrap(),
        "the slot is dropped, and its WAL with it"
    );
    // The polling relay published the first 4; the rest come now.
    let rest = worker_until_all(&s, 16, Duration::from_secs(60)).await;
    assert_each_at_least_once(&[&early, &rest], 20);
    drop(s);
    cleanup(&pool, &schema, &names).await;
}

/// A member the polling engine gives no partition never claims: its catch-up ends at a
/// rebalance. Here another polling relay delivered everything written before the slot; the CDC
/// store's next rebalance (past the check interval) finds nothing left and owns every partition
/// through the slot.
#[tokio::test]
async fn a_catch_up_another_relay_finished_ends_at_the_next_rebalance() {
    let (pool, schema, polling) = common::setup("cdc_catchup_rebalance").await;
    write(&pool, &schema, "k", 0..10).await;
    let (names, _guard) = make_slot(&pool, &schema).await;
    write(&pool, &schema, "k", 10..15).await;
    let s = store(&pool, &names, &database_url()).await;
    assert!(s.catching_up());
    let pm = member();
    let parts = polling
        .rebalance(&pm, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(common::drain(&polling, &pm, &parts).await.len(), 15);
    polling.release(&pm).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let m = member();
    let owned = s.rebalance(&m, Duration::from_secs(30)).await.unwrap();
    assert!(!s.catching_up(), "the rebalance ended the catch-up");
    assert_eq!(owned.len(), 64, "the slot is the lease: every partition");
    let streamed = claim_n(&s, 5, Duration::from_secs(10)).await;
    assert_eq!(
        numbers(&streamed),
        (10..15).collect::<Vec<_>>(),
        "the stream, from the slot's start"
    );
    publish(&s, &streamed).await;
    s.release(&m).await.unwrap();
    drop(s);
    cleanup(&pool, &schema, &names).await;
}

/// The publication drifted (published through the segments instead of the root table, a row
/// filter, the table dropped from it): the relay refuses to read the stream, naming what differs
/// and how to mend it, says so on its ping (`/readyz`), and reads again once it is mended.
#[tokio::test]
async fn publication_drift_is_refused_naming_what_differs() {
    let (pool, schema, names, _guard) = cdc("cdc_drift").await;
    let s = store(&pool, &names, &database_url()).await;
    assert!(claim_n(&s, 1, Duration::from_millis(300)).await.is_empty());
    let p = &names.publication;
    for (drift, said) in [
        (
            format!("ALTER PUBLICATION {p} SET (publish_via_partition_root = false)"),
            "publish_via_partition_root",
        ),
        (
            format!(
                "ALTER PUBLICATION {p} SET TABLE {}.outbox WHERE (aggregate_id <> 'x')",
                schema.as_str()
            ),
            "filters the rows",
        ),
        (
            format!(
                "ALTER PUBLICATION {p} DROP TABLE {}.outbox",
                schema.as_str()
            ),
            "does not include",
        ),
    ] {
        sqlx::raw_sql(&drift).execute(&pool).await.unwrap();
        // The relay's session ends (a restart, a network cut): it connects again, and checks.
        s.release(&member()).await.unwrap();
        let e = s
            .claim(&member(), &[], ClaimLimits::rows(10), OnFailed::Block)
            .await
            .unwrap_err();
        assert!(e.to_string().contains(said), "{e}");
        let ping = s.ping().await.unwrap_err();
        assert!(ping.to_string().contains("drift"), "{ping}");
        sqlx::raw_sql(&format!(
            "ALTER PUBLICATION {p} SET TABLE {}.outbox; \
             ALTER PUBLICATION {p} SET (publish_via_partition_root = true, publish = 'insert')",
            schema.as_str()
        ))
        .execute(&pool)
        .await
        .unwrap();
    }
    write(&pool, &schema, "k", 0..3).await;
    let got = drain_n(&s, 3, Duration::from_secs(10)).await;
    assert_eq!(numbers(&got), vec![0, 1, 2], "mended, it reads again");
    s.ping().await.unwrap();
    s.release(&member()).await.unwrap();
    drop(s);
    cleanup(&pool, &schema, &names).await;
}

/// Under `--on-failed skip` a failed message does not hold its key, so no parked key remains;
/// a redrive from another process (`outbox redrive`) must still be picked up within seconds:
/// the relay reads the parked table while it holds any row.
#[tokio::test]
async fn a_redrive_under_skip_is_picked_up() {
    let (pool, schema, names, _guard) = cdc("cdc_skipredrive").await;
    let s = store(&pool, &names, &database_url()).await;
    assert!(claim_n(&s, 1, Duration::from_millis(300)).await.is_empty());
    write(&pool, &schema, "k", 0..1).await;
    let m = member();
    let got = s
        .claim(&m, &[], ClaimLimits::rows(10), OnFailed::Skip)
        .await
        .unwrap();
    let got = if got.is_empty() {
        claim_n(&s, 1, Duration::from_secs(10)).await
    } else {
        got
    };
    assert_eq!(numbers(&got), vec![0]);
    s.complete(
        &m,
        &[Outcome::Failed {
            seq: got[0].seq,
            error: "rejected for good".into(),
        }],
    )
    .await
    .unwrap();
    // Claims with nothing new to read go on under skip.
    for _ in 0..3 {
        let none = s
            .claim(&m, &[], ClaimLimits::rows(10), OnFailed::Skip)
            .await
            .unwrap();
        assert!(none.is_empty());
    }
    let polling = outbox_postgres::PgStore::new(pool.clone(), schema.clone());
    assert_eq!(
        polling
            .redrive(&outbox_core::RedriveScope::All, "fixed")
            .await
            .unwrap(),
        1
    );
    let until = Instant::now() + Duration::from_secs(10);
    let again = loop {
        let got = s
            .claim(&m, &[], ClaimLimits::rows(10), OnFailed::Skip)
            .await
            .unwrap();
        if !got.is_empty() {
            break got;
        }
        assert!(Instant::now() < until, "the redrive was never picked up");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(numbers(&again), vec![0]);
    publish(&s, &again).await;
    s.release(&m).await.unwrap();
    drop(s);
    cleanup(&pool, &schema, &names).await;
}

/// One key's sink is down (its messages come back deferred) while other keys flow: after the
/// park-after bound its messages are parked, so its transactions are confirmed and the slot's
/// position moves past them; once its sink is back they are published from the parked table, in
/// order.
#[tokio::test]
async fn a_key_whose_sink_stays_down_is_parked_so_the_slot_moves() {
    let (pool, schema, names, _guard) = cdc("cdc_stuckroute").await;
    let s = store(&pool, &names, &database_url())
        .await
        .with_park_after(Duration::from_secs(1));
    assert!(claim_n(&s, 1, Duration::from_millis(300)).await.is_empty());
    write(&pool, &schema, "down", 0..3).await;
    let m = member();
    let until = Instant::now() + Duration::from_secs(30);
    let mut flowed = 0u32;
    // The `down` key's messages are deferred (its lane's breaker open); others keep flowing.
    loop {
        write(&pool, &schema, "busy", 100 + flowed..101 + flowed).await;
        let got = s
            .claim(&m, &[], ClaimLimits::rows(100), OnFailed::Block)
            .await
            .unwrap();
        let outcomes: Vec<Outcome> = got
            .iter()
            .map(|x| {
                if x.aggregate_id == "down" {
                    Outcome::Deferred {
                        seq: x.seq,
                        error: "sink down".into(),
                        delay: Duration::from_millis(200),
                    }
                } else {
                    flowed += 1;
                    Outcome::Published { seq: x.seq }
                }
            })
            .collect();
        s.complete(&m, &outcomes).await.unwrap();
        let parked: i64 = sqlx::query_scalar(
            &schema
                .render("SELECT count(*) FROM {schema}.outbox_parked WHERE aggregate_id = 'down'"),
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        if parked == 3 {
            break;
        }
        assert!(Instant::now() < until, "the held key was never parked");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The slot confirms past the held key's transaction now.
    // (A `busy` message written in the loop's last round may come first.)
    write(&pool, &schema, "busy", 500..501).await;
    drain_until(&s, Duration::from_secs(10), |n| n.contains(&500)).await;
    wait_confirmed(&pool, &s, &names.slot).await;
    // The sink is back: the parked messages go out, in order.
    let back = worker_until_all(&s, 3, Duration::from_secs(30)).await;
    assert_eq!(numbers_of(&back, "down"), vec![0, 1, 2]);
    s.release(&m).await.unwrap();
    drop(s);
    cleanup(&pool, &schema, &names).await;
}

/// The connection to the server goes silent (a black-holed network: held open, no RST): the
/// relay asks the server for a word, gets none, gives the connection up and connects again once
/// the network is back; nothing is lost.
#[tokio::test]
async fn a_silent_server_is_given_up_and_the_stream_made_again() {
    let (pool, schema, names, _guard) = cdc("cdc_silent").await;
    let port: u16 = database_url()
        .rsplit_once(':')
        .and_then(|(_, rest)| rest.split('/').next()?.parse().ok())
        .unwrap_or(5432);
    let proxy = outbox_testkit::proxy::TcpProxy::start(port);
    let via = database_url().replace(&format!(":{port}/"), &format!(":{}/", proxy.port()));
    let s = store(&pool, &names, &via)
        .await
        .with_silence(Duration::from_secs(1));
    assert!(claim_n(&s, 1, Duration::from_millis(300)).await.is_empty());
    write(&pool, &schema, "k", 0..2).await;
    publish(&s, &claim_n(&s, 2, Duration::from_secs(10)).await).await;
    proxy.go_silent();
    let started = Instant::now();
    let ended = loop {
        match s
            .claim(&member(), &[], ClaimLimits::rows(10), OnFailed::Block)
            .await
        {
            Err(e) => break e,
            Ok(_) => {
                // Two silences of 1 s; the bound is loose for a loaded machine, and still far
                // from TCP's ~15 minutes.
                assert!(
                    started.elapsed() < Duration::from_secs(60),
                    "a silent server was waited on"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    assert!(
        ended.to_string().contains("no word from the server"),
        "{ended}"
    );
    write(&pool, &schema, "k", 2..4).await;
    proxy.open();
    // 0 and 1 may come again first: their confirmation may not have reached the server before
    // the silence (at least once, same ids).
    let got = drain_until(&s, Duration::from_secs(30), |n| n.ends_with(&[2, 3])).await;
    assert!(numbers(&got).iter().all(|n| *n < 4), "{:?}", numbers(&got));
    s.release(&member()).await.unwrap();
    drop(s);
    drop(proxy);
    cleanup(&pool, &schema, &names).await;
}
