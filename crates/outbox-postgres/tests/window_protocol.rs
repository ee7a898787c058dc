//! The window protocol's correctness, each property a test that fails on the engine before
//! version 5: the claims' seq floor under writers drawing fast, records that land late, an
//! abandoned record cancelled, a transaction far larger than a batch, retention under a steady
//! backlog, and claim plans that follow the batch on empty, filling and full segments and on a
//! month of retained ones. Each test in a schema of its own.

// Test code: a failed expectation should panic with its message.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{claim_buffers, drain, msg, publish_all, setup, teardown};
use outbox_core::{ClaimLimits, MemberId, OnFailed, Outcome, Store};
use outbox_postgres::{PgStore, Schema};
use serde_json::Value;
use sqlx::PgPool;

const LEASE: Duration = Duration::from_secs(30);

/// The largest floor (`done_floor`, `cur_floor`) of the positions appended after `after`, and
/// the newest position id.
async fn floors_since(pool: &PgPool, schema: &Schema, after: i64) -> (Option<i64>, i64) {
    sqlx::query_as(&schema.render(
        "SELECT max(greatest(done_floor, coalesce(cur_floor, 0))), coalesce(max(id), $1)
         FROM {schema}.outbox_positions WHERE id > $1",
    ))
    .bind(after)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// The floor a claim reads never exceeds what the sequence has handed out, while other
/// sessions draw values as fast as they can. Two checks run beside the writers: the claims'
/// floor function, called in a tight loop, against the sequence's value read under its lock
/// right after it in the same statement; and real claims, whose recorded floors must not exceed
/// the sequence's value read right after each claim. A floor read with a plain `SELECT
/// last_value` can see the value `nextval` writes ahead into the WAL (up to 32 more): windows
/// then started above rows not yet written, which were never delivered. That race is narrow:
/// the review behind engine version 5 saw 2 bad floors in 4,544 reads shaped like the old
/// claim; on this project's machine a plain read in that shape gave none in 48,000 beside
/// 9,700 draws/s, so this test guards the invariant, and the model in `crates/outbox-model`
/// shows deterministically what a floor read above the sequence loses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_claims_floor_never_exceeds_the_sequence_while_writers_draw_fast() {
    let (pool, schema, store) = setup("wp_floor").await;
    let stop = Arc::new(AtomicBool::new(false));
    let seq = schema.render("{schema}.outbox_seq_v2");
    let mut drawers = Vec::new();
    for _ in 0..2 {
        let (pool, seq, stop) = (pool.clone(), seq.clone(), stop.clone());
        drawers.push(tokio::spawn(async move {
            let sql = "SELECT count(nextval($1::regclass)) FROM generate_series(1, 16)";
            let mut drawn = 0u64;
            while !stop.load(Ordering::Relaxed) {
                sqlx::query(sql).bind(&seq).execute(&pool).await.unwrap();
                drawn += 16;
            }
            drawn
        }));
    }
    {
        // Rows too, in every partition, so that windows open, close and get recorded.
        let (store, stop) = (store.clone(), stop.clone());
        drawers.push(tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let batch: Vec<_> = (0..8)
                    .map(|i| msg(&format!("k{}", (n + i) % 97), 0))
                    .collect();
                store.insert(&batch).await.unwrap();
                n += 8;
            }
            n
        }));
    }
    let reader = {
        let (pool, schema, seq, stop) = (pool.clone(), schema.clone(), seq.clone(), stop.clone());
        tokio::spawn(async move {
            let sql = schema.render(
                "SELECT {schema}.outbox_seq_floor(), \
                 coalesce(pg_sequence_last_value($1::regclass), 0)",
            );
            let (mut reads, mut above) = (0u64, Vec::new());
            while !stop.load(Ordering::Relaxed) {
                let (floor, high): (i64, i64) = sqlx::query_as(&sql)
                    .bind(&seq)
                    .fetch_one(&pool)
                    .await
                    .unwrap();
                reads += 1;
                if floor > high {
                    above.push((floor, high));
                }
            }
            (reads, above)
        })
    };
    let m = MemberId::random("m");
    let parts = store.rebalance(&m, LEASE).await.unwrap();
    let (_, mut checked) = floors_since(&pool, &schema, 0).await;
    let until = Instant::now() + Duration::from_secs(8);
    let mut claims = 0u32;
    while Instant::now() < until {
        let got = store
            .claim(&m, &parts, ClaimLimits::rows(50), OnFailed::Block)
            .await
            .unwrap();
        let high: i64 = sqlx::query_scalar("SELECT pg_sequence_last_value($1::regclass)")
            .bind(&seq)
            .fetch_one(&pool)
            .await
            .unwrap();
        if !got.is_empty() {
            publish_all(&store, &m, &got).await;
        }
        let (worst, newest) = floors_since(&pool, &schema, checked).await;
        if let Some(worst) = worst {
            assert!(
                worst <= high,
                "a claim recorded the floor {worst} while the sequence had handed out {high}"
            );
        }
        checked = newest;
        claims += 1;
    }
    stop.store(true, Ordering::Relaxed);
    let mut drawn = 0;
    for t in drawers {
        drawn += t.await.unwrap();
    }
    let (reads, above) = reader.await.unwrap();
    println!("{reads} floor reads and {claims} claims beside {drawn} values drawn in 8 s");
    assert!(
        above.is_empty(),
        "{} of {reads} floor reads were above the sequence (floor, sequence): {:?}",
        above.len(),
        &above[..above.len().min(5)]
    );
    assert!(
        reads >= 1000 && claims >= 50 && drawn >= 10_000,
        "{reads} reads, {claims} claims, {drawn} draws"
    );
    teardown(&pool, &schema).await;
}

/// A record abandoned at the store deadline that lands after the retry of its batch and after
/// a later batch was recorded moves nothing back and parks nothing again: positions are
/// compare-and-append, and its parking depends on its append. Before, it was appended as the
/// newest position (the partition went back to the first batch's window, delivered rows went
/// out again) and re-inserted the parked rows the later batch had released, so an old message
/// went out again after later ones of its key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_that_lands_late_moves_nothing_back_and_parks_nothing_again() {
    let (pool, schema, store) = setup("wp_late").await;
    let (a1, a2, b1) = (msg("a", 1), msg("a", 2), msg("b", 1));
    store
        .insert(&[a1.clone(), a2.clone(), b1.clone()])
        .await
        .unwrap();
    let m = MemberId::random("m");
    let parts = store.rebalance(&m, LEASE).await.unwrap();
    let got = store
        .claim(&m, &parts, ClaimLimits::rows(100), OnFailed::Block)
        .await
        .unwrap();
    assert_eq!(got.len(), 3);
    let seq_of = |id| got.iter().find(|r| r.id == id).unwrap().seq;
    // `a1` is to be retried at once; `a2` was not tried (its key stopped); `b1` went out.
    let outcomes = [
        Outcome::Retry {
            seq: seq_of(a1.id),
            error: "broker busy".into(),
            delay: Duration::ZERO,
        },
        Outcome::Published { seq: seq_of(b1.id) },
    ];
    // The first attempt to record, abandoned: it lands at the end of this test.
    let late = store.hold_completion(&m, &outcomes).unwrap();
    // Its retry lands: `a1` and `a2` are parked.
    assert_eq!(store.complete(&m, &outcomes).await.unwrap(), 2);
    // The next batch publishes the parked key in order and releases it.
    let again = store
        .claim(&m, &parts, ClaimLimits::rows(100), OnFailed::Block)
        .await
        .unwrap();
    assert_eq!(
        again.iter().map(|r| r.id).collect::<Vec<_>>(),
        vec![a1.id, a2.id]
    );
    publish_all(&store, &m, &again).await;
    let latest = |pool: PgPool, schema: Schema| async move {
        sqlx::query_as::<_, (i16, i64, String, i64)>(&schema.render(
            "SELECT DISTINCT ON (partition) partition, id, done::text, cursor
             FROM {schema}.outbox_positions ORDER BY partition, id DESC",
        ))
        .fetch_all(&pool)
        .await
        .unwrap()
    };
    let before = latest(pool.clone(), schema.clone()).await;
    // Now the abandoned record lands.
    let appended = store.land_completion(&late).await.unwrap();
    assert_eq!(appended, vec![], "its predecessor was already followed");
    assert_eq!(
        latest(pool.clone(), schema.clone()).await,
        before,
        "no position moved"
    );
    let parked: i64 =
        sqlx::query_scalar(&schema.render("SELECT count(*) FROM {schema}.outbox_parked"))
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(parked, 0, "nothing parked again");
    assert!(
        drain(&store, &m, &parts).await.is_empty(),
        "nothing goes out twice"
    );
    let s = store.stats().await.unwrap();
    assert_eq!((s.pending, s.published, s.parked), (0, 3, 0));
    teardown(&pool, &schema).await;
}

/// A record abandoned at the relay's store deadline (here: waiting on a lock) is cancelled on
/// the server rather than left running beside its retry, and the retry records the batch once:
/// one successor of the position the claim read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_record_is_cancelled_and_its_retry_records_the_batch_once() {
    let (pool, schema, store) = setup("wp_cancel").await;
    store.insert(&[msg("a", 1), msg("b", 1)]).await.unwrap();
    let m = MemberId::random("m");
    let parts = store.rebalance(&m, LEASE).await.unwrap();
    let got = store
        .claim(&m, &parts, ClaimLimits::rows(100), OnFailed::Block)
        .await
        .unwrap();
    let outcomes: Vec<_> = got
        .iter()
        .map(|r| Outcome::Published { seq: r.seq })
        .collect();
    let newest = |pool: PgPool, schema: Schema| async move {
        sqlx::query_scalar::<_, i64>(
            &schema.render("SELECT max(id) FROM {schema}.outbox_positions"),
        )
        .fetch_one(&pool)
        .await
        .unwrap()
    };
    let before = newest(pool.clone(), schema.clone()).await;
    // Hold every partition row: the record's fence waits on the lock.
    let mut holder = pool.begin().await.unwrap();
    sqlx::query(&schema.render("SELECT 1 FROM {schema}.outbox_partitions FOR UPDATE"))
        .execute(&mut *holder)
        .await
        .unwrap();
    let holder_pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut *holder)
        .await
        .unwrap();
    // Statements waiting on the holder's lock (the server shows only the first kilobyte of a
    // statement's text, which for the record is its comment: match on what blocks it instead).
    let waiting = || {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE state = 'active' AND $1 = ANY (pg_blocking_pids(pid))",
            )
            .bind(holder_pid)
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    };
    // The record is abandoned (its future dropped, as the relay's store deadline drops it)
    // once the server shows it waiting on the lock.
    tokio::select! {
        r = store.complete(&m, &outcomes) => panic!("the record did not wait: {r:?}"),
        () = async {
            while waiting().await == 0 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        } => {}
    }
    // The abandoned statement is gone from the server soon after: cancelled, not waiting.
    let mut still = waiting().await;
    for _ in 0..100 {
        if still == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        still = waiting().await;
    }
    assert_eq!(still, 0, "the abandoned record still waits on the server");
    holder.commit().await.unwrap();
    assert_eq!(store.complete(&m, &outcomes).await.unwrap(), 2);
    // Each partition written has exactly one new position, and nothing is claimed again.
    let appended: Vec<(i16, i64)> = sqlx::query_as(&schema.render(
        "SELECT partition, count(*) FROM {schema}.outbox_positions WHERE id > $1
         GROUP BY partition",
    ))
    .bind(before)
    .fetch_all(&pool)
    .await
    .unwrap();
    assert!(
        !appended.is_empty() && appended.iter().all(|(_, n)| *n == 1),
        "{appended:?}"
    );
    assert!(drain(&store, &m, &parts).await.is_empty());
    teardown(&pool, &schema).await;
}

/// A transaction of 200,000 rows, open across many claims while other keys flow and then
/// committed, drains batch by batch at the cost of a batch: every claim reads that transaction
/// from its cursor on, so a claim near its end reads what one near its start did. Before, every
/// claim read the whole transaction and cut it after the fetch (a 50,000-row transaction was
/// read whole by each 1,000-row claim); `outbox bench --mode big-tx` measures the same with a
/// million rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_far_larger_than_a_batch_drains_at_the_cost_of_a_batch() {
    let (pool, schema, store) = setup("wp_big").await;
    let m = MemberId::random("m");
    let parts = store.rebalance(&m, LEASE).await.unwrap();
    const ROWS: i32 = 200_000;
    let mut big = pool.begin().await.unwrap();
    sqlx::query(&schema.render(
        "INSERT INTO {schema}.outbox (aggregate_type, aggregate_id, event_type, payload)
         SELECT 'order', 'big' || (g % 100), 'placed', jsonb_build_object('n', g)
         FROM generate_series(1, $1) AS g",
    ))
    .bind(ROWS)
    .execute(&mut *big)
    .await
    .unwrap();
    // Other keys flow while it is open: windows close with it running.
    for round in 0..3 {
        let others: Vec<_> = (0..200).map(|i| msg(&format!("o{i}"), round)).collect();
        store.insert(&others).await.unwrap();
        assert_eq!(drain(&store, &m, &parts).await.len(), 200);
    }
    big.commit().await.unwrap();
    let mut costs = Vec::new();
    let mut seen = 0usize;
    let mut last_n: std::collections::HashMap<String, i64> = Default::default();
    let mut batches = 0;
    loop {
        if batches % 20 == 0 {
            costs.push(claim_buffers(&store, &m, &parts, 1000 / 64 + 1).await);
        }
        let got = store
            .claim(&m, &parts, ClaimLimits::rows(1000), OnFailed::Block)
            .await
            .unwrap();
        if got.is_empty() && store.more_to_read(&m) {
            continue;
        }
        if got.is_empty() {
            let again = store
                .claim(&m, &parts, ClaimLimits::rows(1000), OnFailed::Block)
                .await
                .unwrap();
            if again.is_empty() {
                break;
            }
            publish_all(&store, &m, &again).await;
            seen += again.len();
            continue;
        }
        for r in &got {
            let n: i64 = serde_json::from_slice::<Value>(&r.payload).unwrap()["n"]
                .as_i64()
                .unwrap();
            let prev = last_n.insert(r.aggregate_id.clone(), n).unwrap_or(0);
            assert!(
                n > prev,
                "key {} out of order: {n} after {prev}",
                r.aggregate_id
            );
        }
        publish_all(&store, &m, &got).await;
        seen += got.len();
        batches += 1;
    }
    assert_eq!(seen, ROWS as usize);
    let first = costs[0];
    let worst = *costs.iter().max().unwrap();
    println!("claim buffers along the drain of {ROWS} rows: {costs:?}");
    assert!(
        worst <= first * 2 + 500,
        "a claim's cost grew along the transaction: {costs:?}"
    );
    teardown(&pool, &schema).await;
}

/// A transaction still being written, whose rows lie between other keys' committed rows, costs
/// each claim at most its walk span: the walk moves the window's cursor past the rows it
/// stepped over and reads on at the next claim (`more_to_read`), so the other keys are
/// delivered while it is open, and its own rows in order once it commits. Before, a claim
/// stepped over every row of it between the cursor and the rows it handed out: 100,000 here,
/// and up to 55,000 (300 ms) under `outbox bench --mode big-tx`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_being_written_costs_each_claim_at_most_its_walk_span() {
    let (pool, schema, store) = setup("wp_walk").await;
    let m = MemberId::random("m");
    let parts = store.rebalance(&m, LEASE).await.unwrap();
    let idle = claim_buffers(&store, &m, &parts, 16).await;
    const CHUNK: i32 = 100_000;
    let mut big = pool.begin().await.unwrap();
    for round in 0..2 {
        sqlx::query(&schema.render(
            "INSERT INTO {schema}.outbox (aggregate_type, aggregate_id, event_type, payload)
             SELECT 'order', 'big', 'placed', jsonb_build_object('n', $2 + g)
             FROM generate_series(1, $1) AS g",
        ))
        .bind(CHUNK)
        .bind(round * CHUNK)
        .execute(&mut *big)
        .await
        .unwrap();
        let others: Vec<_> = (0..200)
            .map(|i| msg(&format!("o{i}"), round as u32))
            .collect();
        store.insert(&others).await.unwrap();
    }
    let mut costs = Vec::new();
    let mut seen = 0;
    let mut claims = 0;
    let mut empty = 0;
    loop {
        costs.push(claim_buffers(&store, &m, &parts, 16).await);
        let got = store
            .claim(&m, &parts, ClaimLimits::rows(1000), OnFailed::Block)
            .await
            .unwrap();
        claims += 1;
        assert!(claims < 2_000, "the walk made no progress: {claims} claims");
        empty = if got.is_empty() && !store.more_to_read(&m) {
            empty + 1
        } else {
            0
        };
        if empty == 2 {
            break;
        }
        assert!(got.iter().all(|r| r.aggregate_id != "big"));
        publish_all(&store, &m, &got).await;
        seen += got.len();
    }
    let worst = *costs.iter().max().unwrap();
    println!(
        "{claims} claims while {} rows were being written: buffers {idle} idle, worst {worst}",
        2 * CHUNK
    );
    assert_eq!(
        seen, 400,
        "other keys delivered while the transaction was open"
    );
    // A span of 4,096 seqs of the transaction's rows is about 100 heap pages and their index
    // pages; all of a chunk, 2,500.
    assert!(
        worst <= idle + 1_000,
        "a claim stepped over more than its span: {worst} buffers (idle {idle})"
    );
    big.commit().await.unwrap();
    let mut last = 0;
    let mut n_big = 0;
    let mut empty = 0;
    loop {
        let got = store
            .claim(&m, &parts, ClaimLimits::rows(1000), OnFailed::Block)
            .await
            .unwrap();
        // The first empty claim may close the window that did not see the commit.
        empty = if got.is_empty() && !store.more_to_read(&m) {
            empty + 1
        } else {
            0
        };
        if empty == 2 {
            break;
        }
        for r in &got {
            let n = serde_json::from_slice::<Value>(&r.payload).unwrap()["n"]
                .as_i64()
                .unwrap();
            assert!(n > last, "out of order: {n} after {last}");
            last = n;
        }
        n_big += got.len();
        publish_all(&store, &m, &got).await;
    }
    assert_eq!(n_big, 2 * CHUNK as usize);
    teardown(&pool, &schema).await;
}

/// Replaces the migration's segments with ones `width` transaction ids wide, starting at the
/// current id, so a test can move past several.
async fn small_segments(pool: &PgPool, schema: &Schema, store: &PgStore, width: u32) {
    sqlx::raw_sql(&schema.render(&format!(
        "UPDATE {{schema}}.outbox_settings SET value = '{width}' WHERE name = 'segment_xids';
         DO $$ DECLARE s text; BEGIN
           FOR s IN SELECT name FROM {{schema}}.outbox_segments LOOP
             EXECUTE format('DROP TABLE {{schema}}.%I', s);
           END LOOP;
           DELETE FROM {{schema}}.outbox_segments;
         END $$;"
    )))
    .execute(pool)
    .await
    .unwrap();
    store.purge(Duration::from_secs(3600)).await.unwrap();
}

/// Uses up transaction ids until the next one lies `offset` ids into its segment.
async fn burn_to_segment_offset(pool: &PgPool, schema: &Schema, offset: i64) {
    let (now, lo, hi): (i64, i64, i64) = sqlx::query_as(&schema.render(
        "SELECT x, s.lo::text::int8, s.hi::text::int8
         FROM (SELECT pg_current_xact_id()::text::int8 AS x) AS c
         JOIN {schema}.outbox_segments AS s ON s.lo::text::int8 <= c.x AND c.x < s.hi::text::int8",
    ))
    .fetch_one(pool)
    .await
    .unwrap();
    let burn = if now - lo < offset {
        offset - (now - lo)
    } else {
        (hi - now) + offset
    };
    burn_xids(pool, u32::try_from(burn).unwrap()).await;
}

/// Uses up `n` transaction ids.
async fn burn_xids(pool: &PgPool, n: u32) {
    for _ in 0..n {
        sqlx::query("SELECT pg_current_xact_id()")
            .execute(pool)
            .await
            .unwrap();
    }
}

/// Under a steady backlog on one key, where every claim returns rows, the quiet partitions'
/// empty windows are still recorded as passed (with a batch, every few seconds), so the
/// retention horizon moves and a segment every position passed is dropped. Before, empty
/// windows were recorded only by a claim that returned nothing at all: under a steady backlog,
/// never, and no segment was ever dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quiet_partitions_let_a_segment_drop_under_a_steady_backlog() {
    let (pool, schema, store) = setup("wp_quiet").await;
    small_segments(&pool, &schema, &store, 1000).await;
    let m = MemberId::random("m");
    let parts = store.rebalance(&m, LEASE).await.unwrap();
    let hot = |n: u32| (0..n).map(|i| msg("hot", i)).collect::<Vec<_>>();
    store.insert(&hot(500)).await.unwrap();
    burn_xids(&pool, 2500).await;
    store.maintain(Duration::from_secs(3600)).await.unwrap();
    // A steady backlog: 150 rows come between two claims, so every claim returns rows (fewer
    // than it asks for, so each closes its window), and none comes back empty. Quiet windows
    // close with a batch every 5 s; a transaction another test keeps open on this server holds
    // every snapshot's horizon back meanwhile, so the drop may take a few passes.
    let started = Instant::now();
    let mut next_purge = started + Duration::from_secs(6);
    let dropped = loop {
        let got = store
            .claim(&m, &parts, ClaimLimits::rows(1000), OnFailed::Block)
            .await
            .unwrap();
        assert!(!got.is_empty(), "the backlog ran dry");
        publish_all(&store, &m, &got).await;
        // Other tests burn transaction ids too: keep segments ahead, as the relay does.
        store.maintain(Duration::from_secs(3600)).await.unwrap();
        store.insert(&hot(150)).await.unwrap();
        if Instant::now() >= next_purge {
            let purged = store.purge(Duration::ZERO).await.unwrap();
            if purged.segments_dropped > 0 || started.elapsed() > Duration::from_secs(40) {
                break purged.segments_dropped;
            }
            next_purge = Instant::now() + Duration::from_secs(1);
        }
    };
    assert!(
        dropped > 0,
        "no segment dropped in 40 s of a steady backlog"
    );
    teardown(&pool, &schema).await;
}

/// Every node of a plan (EXPLAIN FORMAT JSON), depth first.
fn nodes(plan: &Value) -> Vec<&Value> {
    let mut out = vec![plan];
    if let Some(children) = plan["Plans"].as_array() {
        for c in children {
            out.extend(nodes(c));
        }
    }
    out
}

/// The ways a claim plan can fail to follow the batch: a scan of a segment that is sequential
/// or bitmap; a segment index scan whose conditions do not bound it to the window from the
/// cursor on; a sort of more rows than the claim returns.
fn plan_faults(plan: &Value, limit: i64) -> Vec<String> {
    let mut faults = Vec::new();
    for n in nodes(&plan[0]["Plan"]) {
        let kind = n["Node Type"].as_str().unwrap_or("");
        let relation = n["Relation Name"].as_str().unwrap_or("");
        let index = n["Index Name"].as_str().unwrap_or("");
        let cond = n["Index Cond"].as_str().unwrap_or("");
        let rows = n["Actual Rows"].as_i64().unwrap_or(0) * n["Actual Loops"].as_i64().unwrap_or(1);
        let segment = relation.starts_with("outbox_s");
        if segment && (kind == "Seq Scan" || kind.starts_with("Bitmap")) {
            faults.push(format!("{kind} on {relation}"));
        }
        if segment && index.contains("partition_seq") && !cond.contains("seq >") {
            faults.push(format!("seq index scanned without a seq bound: {cond}"));
        }
        // A2's walk: its span is an index bound, else it steps over what it meets unbounded.
        if segment && index.contains("partition_seq") && !cond.contains("seq <=") {
            faults.push(format!("seq index scanned without the walk's span: {cond}"));
        }
        if segment && index.contains("partition_txid_seq") && !cond.contains("txid") {
            faults.push(format!("txid index scanned without a txid bound: {cond}"));
        }
        if segment
            && index.contains("partition_txid_seq")
            && cond.contains("txid =")
            && !cond.contains("seq >")
        {
            faults.push(format!("a transaction probed without the cursor: {cond}"));
        }
        if kind == "Sort" && rows > limit {
            faults.push(format!("a sort of {rows} rows"));
        }
    }
    // The walk stops at its batch's next row of its own: a run condition on its WindowAgg.
    // Without it every claim reads its whole span, even from a plain backlog.
    let stops = nodes(&plan[0]["Plan"])
        .iter()
        .any(|n| n["Node Type"] == "WindowAgg" && n.get("Run Condition").is_some());
    if !stops {
        faults.push("the walk has no run condition".into());
    }
    faults
}

/// Every part of the window claim (B: a transaction `done` saw running; A1: one that began
/// before `done` was recorded; A2: the rows after the floor) reads through its index from the
/// cursor on, with no sequential, bitmap or large sorted read, on an empty segment, a filling
/// one and a full one, with and without planner statistics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_claim_part_reads_its_index_from_the_cursor_on_any_segment_with_any_statistics() {
    for state in ["empty", "filling", "full"] {
        for analyzed in [false, true] {
            let (pool, schema, store) = setup("wp_plan").await;
            if state == "empty" {
                // A fresh segment only: nothing written before this test's own rows.
                small_segments(&pool, &schema, &store, 1_000_000).await;
            }
            let m = MemberId::random("m");
            let parts = store.rebalance(&m, LEASE).await.unwrap();
            if state != "empty" {
                let n = if state == "full" { 60_000 } else { 3_000 };
                sqlx::query(&schema.render(
                    "INSERT INTO {schema}.outbox (aggregate_type, aggregate_id, event_type, payload)
                     SELECT 'order', 'k' || (g % 10), 'placed', '{}' FROM generate_series(1, $1) AS g",
                ))
                .bind(n)
                .execute(&pool)
                .await
                .unwrap();
                drain(&store, &m, &parts).await;
            }
            // B: a writer open while a window is taken and recorded, committed after.
            let mut running = pool.begin().await.unwrap();
            sqlx::query(&schema.render(
                "INSERT INTO {schema}.outbox (aggregate_type, aggregate_id, event_type, payload)
                 SELECT 'order', 'b' || (g % 10), 'placed', '{}' FROM generate_series(1, 500) AS g",
            ))
            .execute(&mut *running)
            .await
            .unwrap();
            store.insert(&[msg("x", 0)]).await.unwrap();
            let got = store
                .claim(&m, &parts, ClaimLimits::rows(1000), OnFailed::Block)
                .await
                .unwrap();
            // A1: committed between that claim and its record.
            sqlx::query(&schema.render(
                "INSERT INTO {schema}.outbox (aggregate_type, aggregate_id, event_type, payload)
                 SELECT 'order', 'a' || (g % 10), 'placed', '{}' FROM generate_series(1, 500) AS g",
            ))
            .execute(&pool)
            .await
            .unwrap();
            publish_all(&store, &m, &got).await;
            running.commit().await.unwrap();
            // A2: after the record.
            store
                .insert(
                    &(0..500)
                        .map(|i| msg(&format!("c{}", i % 10), i))
                        .collect::<Vec<_>>(),
                )
                .await
                .unwrap();
            if analyzed {
                sqlx::raw_sql(&schema.render("ANALYZE {schema}.outbox"))
                    .execute(&pool)
                    .await
                    .unwrap();
            }
            // Twice: the window's first claim, then one further on (cursor past its start);
            // each as planned for its values and as the generic plan a relay reuses.
            for _ in 0..2 {
                let per = 50;
                for generic in [false, true] {
                    let plan = store.explain_claim(&m, &parts, per, generic).await.unwrap();
                    let faults = plan_faults(&plan, (per * parts.len()) as i64);
                    assert!(
                        faults.is_empty(),
                        "{state}, analyzed {analyzed}, generic {generic}: {faults:?}"
                    );
                }
                let got = store
                    .claim(&m, &parts, ClaimLimits::rows(per * 4), OnFailed::Block)
                    .await
                    .unwrap();
                publish_all(&store, &m, &got).await;
            }
            let rest = drain(&store, &m, &parts).await.len();
            let s = store.stats().await.unwrap();
            assert_eq!(s.pending, 0, "{state}, analyzed {analyzed}: {rest} drained");
            teardown(&pool, &schema).await;
        }
    }
}

/// After a month's worth of segments (small ones, to simulate), a claim costs what it cost with
/// one: the rows' segment is found by the txid bounds at run time, and the segments every
/// position passed are never probed. Before, the seq walk (A2) had no lower txid bound and
/// probed every retained segment of every partition on every claim. Measured alone (the
/// `measured_` prefix: `scripts/test.sh` runs these after the others, one at a time), since
/// every transaction other tests commit meanwhile costs a claim a probe per partition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn measured_a_month_of_retained_segments_costs_a_claim_what_one_did() {
    let cost = |segments: u32| async move {
        let (pool, schema, store) = setup("wp_month").await;
        small_segments(&pool, &schema, &store, 200).await;
        let m = MemberId::random("m");
        let parts = store.rebalance(&m, LEASE).await.unwrap();
        // One segment a day: rows in each, drained, then the ids moved past it.
        for day in 0..segments {
            store.maintain(Duration::from_secs(3600)).await.unwrap();
            let rows: Vec<_> = (0..300)
                .map(|i| msg(&format!("k{}", i % 100), day))
                .collect();
            store.insert(&rows).await.unwrap();
            drain(&store, &m, &parts).await;
            burn_xids(&pool, 200).await;
        }
        store.maintain(Duration::from_secs(3600)).await.unwrap();
        let kept: i64 =
            sqlx::query_scalar(&schema.render("SELECT count(*) FROM {schema}.outbox_segments"))
                .fetch_one(&pool)
                .await
                .unwrap();
        // Both runs alike: the last window closes 50 ids into a segment, so today's window
        // lies in that one segment (a window spanning a segment boundary is probed in both
        // segments, in either run: that is the window's width, not the history's).
        burn_to_segment_offset(&pool, &schema, 50).await;
        // Quiet partitions (no key of this test hashes to them) pass their empty windows at the
        // idle advance, every 5 s: in a real month they trail by those seconds, a sliver of a
        // segment. The month here is compressed into seconds, so let that interval pass once,
        // in both runs, or their positions would trail by several segments and each claim
        // would probe every one of those for them.
        tokio::time::sleep(Duration::from_millis(5100)).await;
        // Transaction ids are the cluster's: tests running beside this one use them up during
        // the wait, past the few 200-id segments made ahead. Maintenance makes them, as the
        // relay's every 30 s would.
        store.maintain(Duration::from_secs(3600)).await.unwrap();
        store.insert(&[msg("tick", 0)]).await.unwrap();
        drain(&store, &m, &parts).await;
        // Today's backlog, after ANALYZE, and a claim of it.
        let rows: Vec<_> = (0..3000)
            .map(|i| msg(&format!("k{}", i % 100), 9999))
            .collect();
        store.insert(&rows).await.unwrap();
        sqlx::raw_sql(&schema.render("ANALYZE {schema}.outbox"))
            .execute(&pool)
            .await
            .unwrap();
        let got = store
            .claim(&m, &parts, ClaimLimits::rows(1000), OnFailed::Block)
            .await
            .unwrap();
        publish_all(&store, &m, &got).await;
        let buffers = claim_buffers(&store, &m, &parts, 16).await;
        teardown(&pool, &schema).await;
        (kept, buffers)
    };
    let (one_kept, one) = cost(1).await;
    let (month_kept, month) = cost(30).await;
    println!("claim buffers: {one} with {one_kept} segments, {month} with {month_kept}");
    assert!(month_kept >= 30, "{month_kept} segments kept");
    assert!(
        month * 10 <= one * 12,
        "a claim read {month} buffers with {month_kept} segments, {one} with {one_kept}"
    );
}
