//! Three findings of the engine review (../shared/reviews/engine-review.md), each a test that
//! failed on the engine before its fix: under `--on-failed block` no parked row behind a failed
//! one of its key is handed out (N2b); a record abandoned long ago cannot append once pruning has
//! removed the position it read (N4); a quiet partition's window is not stepped through seqs it
//! cannot hold, a position per claim, while other partitions draw seqs (N6). Each test in a
//! schema of its own.

// Test code: a failed expectation should panic with its message.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::{drain, msg, setup, teardown};
use outbox_core::{ClaimLimits, MemberId, OnFailed, Outcome, Store};
use outbox_postgres::Schema;
use sqlx::PgPool;

const LEASE: Duration = Duration::from_secs(30);

/// The partition a key hashes to (the `partition` column's expression).
async fn partition_of(pool: &PgPool, key: &str) -> i16 {
    sqlx::query_scalar("SELECT ((hashtext($1) & 2147483647) % 64)::int2")
        .bind(key)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// The parked layout a CDC→polling fallback made before N2's fix (a key's later message `M2`
/// parked at its own seq below the failed `M1`, and again behind it), here under `block`: the
/// rows of the key behind the failed one stay parked, and only the copy ahead of it by seq, which
/// the table cannot tell from a legitimate head, is handed out. Before, claim_parked.sql handed
/// out every non-failed row of a key whose head was not failed: M2 twice, once behind M1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_block_no_parked_row_behind_a_failed_one_of_its_key_is_handed_out() {
    let (pool, schema, store) = setup("pk_behind").await;
    let (m1, m2) = (msg("k", 1), msg("k", 2));
    store.insert(&[m1.clone(), m2.clone()]).await.unwrap();
    let m = MemberId::random("m");
    let parts = store.rebalance(&m, LEASE).await.unwrap();
    let got = store
        .claim(&m, &parts, ClaimLimits::rows(1), OnFailed::Block)
        .await
        .unwrap();
    assert_eq!(got.iter().map(|r| r.id).collect::<Vec<_>>(), vec![m1.id]);
    store
        .complete(
            &m,
            &[Outcome::Failed {
                seq: got[0].seq,
                error: "rejected".into(),
            }],
        )
        .await
        .unwrap();
    // M2 is parked behind its failed key by the next claim's record.
    assert!(drain(&store, &m, &parts).await.is_empty(), "M1 blocks k");
    let parked = |pool: PgPool, schema: Schema| async move {
        sqlx::query_as::<_, (i64, uuid::Uuid, String)>(
            &schema.render("SELECT seq, id, state FROM {schema}.outbox_parked ORDER BY seq"),
        )
        .fetch_all(&pool)
        .await
        .unwrap()
    };
    let before = parked(pool.clone(), schema.clone()).await;
    assert_eq!(
        before
            .iter()
            .map(|(_, id, state)| (*id, state.as_str()))
            .collect::<Vec<_>>(),
        vec![(m1.id, "failed"), (m2.id, "waiting")]
    );
    // The fallback's layout: the parked copies moved up (as CDC parked them, at fresh seqs), and
    // M2 parked again at its own seq, below the failed M1.
    sqlx::query(&schema.render("UPDATE {schema}.outbox_parked SET seq = seq + 1000"))
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query(&schema.render(
        "INSERT INTO {schema}.outbox_parked
             (partition, seq, aggregate_id, id, aggregate_type, event_type, payload, headers,
              topic, created_at, state, attempts)
         SELECT o.partition, o.seq, o.aggregate_id, o.id, o.aggregate_type, o.event_type,
                o.payload, o.headers, o.topic, o.created_at, 'waiting', 0
         FROM {schema}.outbox AS o WHERE o.id = $1",
    ))
    .bind(m2.id)
    .execute(&pool)
    .await
    .unwrap();
    let layout = parked(pool.clone(), schema.clone()).await;
    let failed_seq = layout
        .iter()
        .find(|(_, _, state)| state == "failed")
        .unwrap()
        .0;
    assert_eq!(layout.len(), 3, "{layout:?}");
    // A member re-reads parked messages it did not change itself at most every second.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let got = store
        .claim(&m, &parts, ClaimLimits::rows(100), OnFailed::Block)
        .await
        .unwrap();
    let handed: Vec<(i64, uuid::Uuid)> = got.iter().map(|r| (r.seq, r.id)).collect();
    assert!(
        handed.iter().all(|(seq, _)| *seq < failed_seq),
        "rows behind the failed M1 (seq {failed_seq}) handed out: {handed:?} of {layout:?}"
    );
    assert!(
        handed.iter().all(|(_, id)| *id != m1.id),
        "the failed head went out without a redrive: {handed:?}"
    );
    // Not vacuous: the key was read, and its copy ahead of the failure handed out.
    assert_eq!(handed, vec![(layout[0].0, m2.id)]);
    teardown(&pool, &schema).await;
}

/// Chain P1 ← P2 ← P3 ← P4 on one partition, a record of the batch claimed at P1 abandoned
/// before its retry recorded P2. Pruning removes P1..P3 (older than a minute, not the latest),
/// which frees P1's successor slot; the abandoned record then lands. Before, it appended as the
/// newest position, with P1's window, and the partition went back; now it finds the position it
/// read gone and writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_abandoned_before_pruning_cannot_append_behind_a_pruned_position() {
    let (pool, schema, store) = setup("pk_prune").await;
    let key = "k";
    let part = partition_of(&pool, key).await;
    let m = MemberId::random("m");
    let parts = store.rebalance(&m, LEASE).await.unwrap();
    let mine = [i32::from(part)];
    let positions = |pool: PgPool, schema: Schema| async move {
        sqlx::query_as::<_, (i64, Option<i64>, String, i64)>(&schema.render(
            "SELECT id, prev_id, done::text, cursor FROM {schema}.outbox_positions
             WHERE partition = $1 ORDER BY id",
        ))
        .bind(part)
        .fetch_all(&pool)
        .await
        .unwrap()
    };
    let first = msg(key, 0);
    store.insert(std::slice::from_ref(&first)).await.unwrap();
    let got = store
        .claim(&m, &mine, ClaimLimits::rows(100), OnFailed::Block)
        .await
        .unwrap();
    assert_eq!(got.iter().map(|r| r.id).collect::<Vec<_>>(), vec![first.id]);
    let outcomes = [Outcome::Published { seq: got[0].seq }];
    // The first attempt to record the batch: abandoned at the deadline, it lands at the end.
    let late = store.hold_completion(&m, &outcomes).unwrap();
    store.complete(&m, &outcomes).await.unwrap();
    // Two more batches: P3 and P4.
    for n in 1..=2 {
        let next = msg(key, n);
        store.insert(std::slice::from_ref(&next)).await.unwrap();
        assert_eq!(drain(&store, &m, &mine).await, vec![next.id]);
    }
    let chain = positions(pool.clone(), schema.clone()).await;
    assert!(chain.len() >= 4, "a chain of four positions: {chain:?}");
    for pair in chain.windows(2) {
        assert_eq!(pair[1].1, Some(pair[0].0), "one chain: {chain:?}");
    }
    // A minute later: maintenance prunes every position of the chain but the latest.
    sqlx::query(&schema.render(
        "UPDATE {schema}.outbox_positions SET recorded_at = recorded_at - interval '2 minutes'",
    ))
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query(&schema.render(include_str!("../queries/prune_positions.sql")))
        .execute(&pool)
        .await
        .unwrap();
    let latest = positions(pool.clone(), schema.clone()).await;
    assert_eq!(latest.len(), 1, "pruned to the latest: {latest:?}");
    assert_eq!(latest[0].0, chain.last().unwrap().0);
    // The abandoned record lands now.
    let appended = store.land_completion(&late).await.unwrap();
    assert_eq!(
        appended,
        vec![],
        "it appended behind a pruned position: {:?}",
        positions(pool.clone(), schema.clone()).await
    );
    assert_eq!(positions(pool.clone(), schema.clone()).await, latest);
    // Nothing goes out again: the partition did not go back to P1's window.
    assert!(drain(&store, &m, &mine).await.is_empty());
    let _ = parts;
    teardown(&pool, &schema).await;
}

/// What a quiet partition's positions did over a run of claims.
#[derive(Debug)]
struct QuietRun {
    /// Positions appended for it.
    appended: i64,
    /// Of those, the ones that closed a window (`done` moved on).
    closed: i64,
}

/// A quiet partition (no row of its own) claimed `claims` times by itself, after other
/// partitions drew 20,000 seqs and while they draw `drawn` more between claims.
async fn quiet_partition_run(tag: &str, drawn: i64, claims: usize) -> QuietRun {
    let (pool, schema, store) = setup(tag).await;
    let busy_part = partition_of(&pool, "busy").await;
    let quiet = (0..64i16).find(|p| *p != busy_part).unwrap();
    let m = MemberId::random("m");
    let _ = store.rebalance(&m, LEASE).await.unwrap();
    let draw = |rows: i64| {
        let (pool, schema) = (pool.clone(), schema.clone());
        async move {
            sqlx::query(&schema.render(
                "INSERT INTO {schema}.outbox (aggregate_type, aggregate_id, event_type, payload)
                 SELECT 'order', 'busy', 'placed', '{}'::jsonb FROM generate_series(1, $1)",
            ))
            .bind(rows)
            .execute(&pool)
            .await
            .unwrap();
        }
    };
    let last_id: i64 = sqlx::query_scalar(
        &schema.render("SELECT max(id) FROM {schema}.outbox_positions WHERE partition = $1"),
    )
    .bind(quiet)
    .fetch_one(&pool)
    .await
    .unwrap();
    draw(20_000).await;
    for _ in 0..claims {
        let got = store
            .claim(
                &m,
                &[i32::from(quiet)],
                ClaimLimits::rows(100),
                OnFailed::Block,
            )
            .await
            .unwrap();
        assert!(got.is_empty(), "the quiet partition has no row");
        draw(drawn).await;
    }
    let (appended, closed): (i64, i64) = sqlx::query_as(&schema.render(
        "SELECT count(*), count(*) FILTER (WHERE cur IS NULL)
         FROM {schema}.outbox_positions WHERE partition = $1 AND id > $2",
    ))
    .bind(quiet)
    .bind(last_id)
    .fetch_one(&pool)
    .await
    .unwrap();
    teardown(&pool, &schema).await;
    let run = QuietRun { appended, closed };
    println!("quiet partition, {drawn} seqs drawn per claim, {claims} claims: {run:?}");
    run
}

/// A quiet partition's window is walked in spans of 4,096 seqs only up to the floor it opened
/// at (`cur_floor`): past it the window holds nothing, and it closes. Before, the span test
/// compared with the floor each claim read, which other partitions keep raising: with more than
/// a span drawn per claim the window never closed (a position per claim, `done` never moving,
/// so retention could not pass it), and with half a span it was walked on past its floor and
/// the next window walked those seqs again. Measured here (2026-12-06, the old code, then
/// this): 5,120 seqs per claim, 12 claims: 12 positions none closing, then 12 with 2 closing;
/// 2,048 per claim, 30 claims: 30 positions (4 closing), then 23 (9 closing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_partition_closes_its_window_at_its_floor_while_others_draw_seqs() {
    let fast = quiet_partition_run("pk_span_fast", 5_120, 12).await;
    assert!(
        fast.closed >= 1,
        "the window never closed, stepped on through seqs it cannot hold: {fast:?}"
    );
    let slow = quiet_partition_run("pk_span_slow", 2_048, 30).await;
    assert!(
        slow.appended < 30,
        "a position per claim while others draw half a span per claim: {slow:?}"
    );
}
