//! Engine v2 behaviour that only PostgreSQL has: transaction visibility (a writer that stays
//! open across claims), plans under real statistics, bloat, retention by segment, and the
//! in-place upgrade from the version 1 table. Each test in a schema of its own.

// Test code: a failed expectation should panic with its message.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use outbox_core::{ClaimLimits, MemberId, OnFailed, Outcome, Store};
use outbox_postgres::{connect_pool, migrate, PgStore, Schema, Writer, MIGRATIONS};
use sqlx::{PgPool, Row};

mod common;
use common::{claim_buffers, database_url, drain, msg, publish_all, setup, teardown};

/// A transaction that stays open while relays claim and record other rows around it is
/// delivered once it commits: once, and in key order after what its key already had.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transaction_open_across_claims_is_delivered_once_in_key_order_when_it_commits() {
    let (pool, schema, store) = setup("eng_open").await;
    let w = Writer::new(&schema);
    let m = MemberId::random("m");
    let parts = store.rebalance(&m, Duration::from_secs(30)).await.unwrap();
    // The long writer takes the key lock of `k` and holds it... on another key, so the test
    // can keep writing `k` meanwhile: the rows of the long transaction must still come out.
    let long = msg("slow", 1);
    let mut tx = pool.begin().await.unwrap();
    w.enqueue(&mut tx, &long).await.unwrap();
    let mut delivered = Vec::new();
    for round in 0..5 {
        store.insert(&[msg("fast", round)]).await.unwrap();
        delivered.extend(drain(&store, &m, &parts).await);
    }
    assert_eq!(
        delivered.len(),
        5,
        "the open transaction's row is not visible yet"
    );
    assert!(!delivered.contains(&long.id));
    let after = msg("slow", 2);
    tx.commit().await.unwrap();
    store.insert(std::slice::from_ref(&after)).await.unwrap();
    let rest = drain(&store, &m, &parts).await;
    assert_eq!(
        rest,
        vec![long.id, after.id],
        "committed late, delivered once, in order"
    );
    assert!(drain(&store, &m, &parts).await.is_empty());
    let s = store.stats().await.unwrap();
    assert_eq!((s.pending, s.published), (0, 7));
    teardown(&pool, &schema).await;
}

/// Rows of a transaction that rolls back are never handed out, even after the positions
/// moved past the time it was open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolled_back_transaction_is_never_delivered() {
    let (pool, schema, store) = setup("eng_rb").await;
    let w = Writer::new(&schema);
    let m = MemberId::random("m");
    let parts = store.rebalance(&m, Duration::from_secs(30)).await.unwrap();
    let mut tx = pool.begin().await.unwrap();
    w.enqueue(&mut tx, &msg("gone", 1)).await.unwrap();
    store.insert(&[msg("kept", 1)]).await.unwrap();
    assert_eq!(drain(&store, &m, &parts).await.len(), 1);
    tx.rollback().await.unwrap();
    store.insert(&[msg("kept", 2)]).await.unwrap();
    let rest = drain(&store, &m, &parts).await;
    assert_eq!(rest.len(), 1);
    let s = store.stats().await.unwrap();
    assert_eq!((s.pending, s.published), (0, 2));
    teardown(&pool, &schema).await;
}

/// With 1, 10 and 1,000 keys, with and without planner statistics, the cost of a claim
/// follows the batch, not the backlog: the same claim reads about as many buffers from a
/// 60,000-row backlog as from a 6,000-row one, because the plan walks the (partition, seq)
/// index and stops at the batch, whatever ANALYZE says about the skew.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_stay_bounded_after_analyze_with_skewed_keys() {
    for keys in [1u32, 10, 1000] {
        let (pool, schema, store) = setup("eng_plan").await;
        let fill = |n: i32| {
            let (pool, schema) = (pool.clone(), schema.clone());
            async move {
                sqlx::query(&schema.render(
                    "INSERT INTO {schema}.outbox (aggregate_type, aggregate_id, event_type, payload)
                     SELECT 'order', 'k' || (g % $1), 'placed', jsonb_build_object('n', g)
                     FROM generate_series(1, $2) AS g",
                ))
                .bind(keys as i32)
                .bind(n)
                .execute(&pool)
                .await
                .unwrap();
            }
        };
        let analyze = || {
            let (pool, schema) = (pool.clone(), schema.clone());
            async move {
                sqlx::raw_sql(&schema.render("ANALYZE {schema}.outbox"))
                    .execute(&pool)
                    .await
                    .unwrap();
            }
        };
        let m = MemberId::random("m");
        let parts = store.rebalance(&m, Duration::from_secs(30)).await.unwrap();
        // A writer stays open across the whole test, so every claim probes for it (part B),
        // and its row must still come out at the end.
        let mut open = pool.begin().await.unwrap();
        Writer::new(&schema)
            .enqueue(&mut open, &msg("k0", 0))
            .await
            .unwrap();
        assert!(store
            .claim(&m, &parts, ClaimLimits::rows(1000), OnFailed::Block)
            .await
            .unwrap()
            .is_empty());
        // Rows per partition as the store asks for them: a batch of 1000 shared by the
        // partitions that have rows.
        let per = (1000 / keys.min(64)).max(1) as usize;
        // One batch claimed and recorded: the window is open and its cursor above the floor,
        // the steady state of a drain.
        let one_batch = || {
            let (store, m, parts) = (store.clone(), m.clone(), parts.clone());
            async move {
                // A claim may first close the window before (it ended at a batch boundary).
                for _ in 0..3 {
                    let got = store
                        .claim(&m, &parts, ClaimLimits::rows(1000), OnFailed::Block)
                        .await
                        .unwrap();
                    if got.is_empty() {
                        continue;
                    }
                    let outcomes: Vec<_> = got
                        .iter()
                        .map(|r| Outcome::Published { seq: r.seq })
                        .collect();
                    store.complete(&m, &outcomes).await.unwrap();
                    return;
                }
                panic!("no batch to claim");
            }
        };
        fill(6_000).await;
        one_batch().await;
        let small = claim_buffers(&store, &m, &parts, per).await;
        analyze().await;
        let small_stats = claim_buffers(&store, &m, &parts, per).await;
        // Ten times the history: the rest of this window drained, 54,000 more rows written.
        drain(&store, &m, &parts).await;
        fill(54_000).await;
        one_batch().await;
        let big = claim_buffers(&store, &m, &parts, per).await;
        analyze().await;
        let big_stats = claim_buffers(&store, &m, &parts, per).await;
        println!("{keys} keys: {small}/{small_stats} buffers at 6k rows, {big}/{big_stats} at 60k (without/with statistics)");
        let bound = |base: i64| base * 3 / 2 + 200;
        assert!(
            big <= bound(small) && big_stats <= bound(small_stats),
            "{keys} keys: a claim grew with the backlog: {small}/{small_stats} buffers at 6k rows, {big}/{big_stats} at 60k"
        );
        // And the drain is complete, the open writer's row included once it commits.
        open.commit().await.unwrap();
        drain(&store, &m, &parts).await;
        let s = store.stats().await.unwrap();
        assert_eq!((s.pending, s.published), (0, 60_001), "{keys} keys");
        // After the drain, the next read of every partition starts near the rows it passed
        // (an open window's cursor, or a closed one's floor), never from the beginning:
        // otherwise every later poll walks the whole history.
        let floors: Vec<i64> = sqlx::query_scalar(&schema.render(
            "SELECT DISTINCT ON (partition)
                    CASE WHEN cur IS NULL THEN done_floor ELSE greatest(cursor, done_floor) END
             FROM {schema}.outbox_positions
             WHERE partition IN (SELECT DISTINCT partition FROM {schema}.outbox)
             ORDER BY partition, id DESC",
        ))
        .fetch_all(&pool)
        .await
        .unwrap();
        assert!(
            floors.iter().all(|f| *f >= 6_000),
            "{keys} keys: windows after the drain start from floors {floors:?}"
        );
        teardown(&pool, &schema).await;
    }
}

async fn dead_tuples(pool: &PgPool, schema: &Schema) -> i64 {
    sqlx::query_scalar(
        "SELECT coalesce(sum(s.n_dead_tup), 0)::int8
         FROM pg_inherits AS i
         JOIN pg_class AS c ON c.oid = i.inhrelid
         JOIN pg_namespace AS n ON n.oid = c.relnamespace
         JOIN pg_class AS parent ON parent.oid = i.inhparent AND parent.relname = 'outbox'
         JOIN pg_stat_user_tables AS s ON s.relid = c.oid
         WHERE n.nspname = $1",
    )
    .bind(schema.as_str())
    .fetch_one(pool)
    .await
    .unwrap()
}

async fn outbox_bytes(pool: &PgPool, schema: &Schema) -> i64 {
    sqlx::query_scalar(
        "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)::int8
         FROM pg_inherits AS i
         JOIN pg_class AS c ON c.oid = i.inhrelid
         JOIN pg_namespace AS n ON n.oid = c.relnamespace
         JOIN pg_class AS parent ON parent.oid = i.inhparent AND parent.relname = 'outbox'
         WHERE n.nspname = $1",
    )
    .bind(schema.as_str())
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Draining leaves no dead tuple in the message table (nothing updates or deletes a message),
/// and once every position passed a segment, purging drops it whole: the table returns to
/// the size it had before the messages came.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn draining_leaves_no_dead_tuples_and_purge_returns_the_table_to_its_size() {
    let (pool, schema, store) = setup("eng_bloat").await;
    // Small segments, so that this test can move past one: drop the migration's empty ones
    // and let maintenance make 1000-xid segments from the current id on (wide enough that the
    // other tests' transactions on this server cannot use up the two ahead mid-test).
    sqlx::raw_sql(&schema.render(
        "UPDATE {schema}.outbox_settings SET value = '1000' WHERE name = 'segment_xids';
         DO $$ DECLARE s text; BEGIN
           FOR s IN SELECT name FROM {schema}.outbox_segments LOOP
             EXECUTE format('DROP TABLE {schema}.%I', s);
           END LOOP;
           DELETE FROM {schema}.outbox_segments;
         END $$;",
    ))
    .execute(&pool)
    .await
    .unwrap();
    store.purge(Duration::from_secs(3600)).await.unwrap();
    let empty_size = outbox_bytes(&pool, &schema).await;
    let msgs: Vec<_> = (0..5000).map(|i| msg(&format!("k{}", i % 50), i)).collect();
    for chunk in msgs.chunks(500) {
        store.maintain(Duration::from_secs(3600)).await.unwrap();
        store.insert(chunk).await.unwrap();
    }
    let m = MemberId::random("m");
    let parts = store.rebalance(&m, Duration::from_secs(30)).await.unwrap();
    assert_eq!(drain(&store, &m, &parts).await.len(), 5000);
    sqlx::raw_sql(&schema.render("ANALYZE {schema}.outbox"))
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(dead_tuples(&pool, &schema).await, 0);
    assert!(outbox_bytes(&pool, &schema).await > empty_size);
    // Move the transaction ids past the segments that hold the rows (each call is one xid),
    // then let every position pass them: an empty claim records idle windows as passed, at
    // most every 5 s.
    for _ in 0..2500 {
        sqlx::query("SELECT pg_current_xact_id()")
            .execute(&pool)
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(5200)).await;
    assert!(store
        .claim(&m, &parts, ClaimLimits::rows(1000), OnFailed::Block)
        .await
        .unwrap()
        .is_empty());
    let purged = store.purge(Duration::ZERO).await.unwrap();
    assert!(purged.segments_dropped > 0, "{purged:?}");
    let size = outbox_bytes(&pool, &schema).await;
    assert!(
        size <= empty_size,
        "after purge the table holds {size} bytes, {empty_size} before the messages"
    );
    let s = store.stats().await.unwrap();
    assert_eq!((s.pending, s.published), (0, 5000));
    teardown(&pool, &schema).await;
}

/// A segment holding a row some position has not passed is never dropped, however old.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_never_drops_a_pending_row() {
    let (pool, schema, store) = setup("eng_keep").await;
    store.insert(&[msg("a", 1)]).await.unwrap();
    for _ in 0..50 {
        sqlx::query("SELECT pg_current_xact_id()")
            .execute(&pool)
            .await
            .unwrap();
    }
    store.purge(Duration::ZERO).await.unwrap();
    let m = MemberId::random("m");
    let parts = store.rebalance(&m, Duration::from_secs(30)).await.unwrap();
    assert_eq!(drain(&store, &m, &parts).await.len(), 1);
    teardown(&pool, &schema).await;
}

/// A fresh schema migrated by hand up to `version` and no further, as an older `outbox migrate`
/// left it.
async fn schema_at_version(pool: &PgPool, prefix: &str, version: i32) -> Schema {
    let schema = Schema::new(&outbox_testkit::unique_name(prefix)).unwrap();
    sqlx::raw_sql(&schema.render(
        "CREATE SCHEMA {schema};
         CREATE TABLE {schema}.outbox_migrations (version integer PRIMARY KEY, name text NOT NULL,
             applied_at timestamptz NOT NULL DEFAULT now());",
    ))
    .execute(pool)
    .await
    .unwrap();
    for (v, name, sql) in MIGRATIONS.iter().filter(|(v, _, _)| *v <= version) {
        sqlx::raw_sql(&schema.render(sql))
            .execute(pool)
            .await
            .unwrap();
        sqlx::query(
            &schema
                .render("INSERT INTO {schema}.outbox_migrations (version, name) VALUES ($1, $2)"),
        )
        .bind(v)
        .bind(name)
        .execute(pool)
        .await
        .unwrap();
    }
    schema
}

/// Version 7 run while a writer is in the middle of its transaction, having read the outbox but
/// not yet drawn a seq: the migration waits for it (the table's lock first; taking the
/// sequence's first would deadlock with the writer's insert), and no seq is handed out twice
/// across the change of sequence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_to_version_7_waits_for_a_writer_in_progress() {
    let pool = connect_pool(&database_url(), 4).await.unwrap();
    let schema = schema_at_version(&pool, "eng_v7w", 6).await;
    let insert = schema.render(
        "INSERT INTO {schema}.outbox (aggregate_type, aggregate_id, event_type, payload)
         VALUES ('o', 'k', 'e', '{}') RETURNING seq",
    );
    let mut tx = pool.begin().await.unwrap();
    sqlx::query(&schema.render("SELECT count(*) FROM {schema}.outbox"))
        .execute(&mut *tx)
        .await
        .unwrap();
    // Polled for half a second and then left pending: its statement waits on the server.
    let migrating = migrate(&pool, &schema);
    tokio::pin!(migrating);
    assert!(
        tokio::time::timeout(Duration::from_millis(500), &mut migrating)
            .await
            .is_err(),
        "the migration waits for the writer"
    );
    let mut drawn = Vec::new();
    for _ in 0..2 {
        let seq: i64 = sqlx::query_scalar(&insert)
            .fetch_one(&mut *tx)
            .await
            .unwrap();
        drawn.push(seq);
    }
    tx.commit().await.unwrap();
    assert_eq!(migrating.await.unwrap(), vec![7, 8]);
    let after: i64 = sqlx::query_scalar(&insert).fetch_one(&pool).await.unwrap();
    assert!(
        drawn[0] < drawn[1] && drawn[1] < after,
        "seqs {drawn:?}, then {after} after the migration"
    );
    teardown(&pool, &schema).await;
}

/// Version 7 turns `seq` from an identity into a plain `nextval` default without moving the
/// sequence: rows written at version 6 are delivered, new rows draw seqs above theirs (never a
/// seq handed out before), and the sequence stays uncached, as the floor needs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_to_version_7_keeps_the_sequence_where_it_was() {
    let pool = connect_pool(&database_url(), 4).await.unwrap();
    let schema = schema_at_version(&pool, "eng_v7", 6).await;
    let insert = schema.render(
        "INSERT INTO {schema}.outbox (aggregate_type, aggregate_id, event_type, payload)
         SELECT 'o', 'k', 'e', '{}' FROM generate_series(1, 40) RETURNING id, seq",
    );
    let old: Vec<(uuid::Uuid, i64)> = sqlx::query_as(&insert).fetch_all(&pool).await.unwrap();
    // Drawn and rolled back at version 6: these seqs were handed out, so they must not return.
    let mut tx = pool.begin().await.unwrap();
    let lost: Vec<(uuid::Uuid, i64)> = sqlx::query_as(&insert).fetch_all(&mut *tx).await.unwrap();
    tx.rollback().await.unwrap();
    assert_eq!(migrate(&pool, &schema).await.unwrap(), vec![7, 8]);
    let identity: String = sqlx::query_scalar(&schema.render(
        "SELECT attidentity::text FROM pg_attribute
         WHERE attrelid = '{schema}.outbox'::regclass AND attname = 'seq'",
    ))
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(identity, "", "seq is no longer an identity");
    let cache: i64 = sqlx::query_scalar(&schema.render(
        "SELECT seqcache FROM pg_sequence WHERE seqrelid = '{schema}.outbox_seq_v2'::regclass",
    ))
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(cache, 1);
    let new: Vec<(uuid::Uuid, i64)> = sqlx::query_as(&insert).fetch_all(&pool).await.unwrap();
    let highest_before = old.iter().chain(&lost).map(|(_, s)| *s).max().unwrap();
    assert!(
        new.iter().all(|(_, s)| *s > highest_before),
        "new seqs {new:?} start above every seq handed out before ({highest_before})"
    );
    assert_eq!(migrate(&pool, &schema).await.unwrap(), Vec::<i32>::new());
    let store = Arc::new(PgStore::new(pool.clone(), schema.clone()));
    let m = MemberId::random("m");
    let parts = store.rebalance(&m, Duration::from_secs(30)).await.unwrap();
    let want: Vec<uuid::Uuid> = old.iter().chain(&new).map(|(id, _)| *id).collect();
    assert_eq!(drain(&store, &m, &parts).await, want, "every row, in order");
    teardown(&pool, &schema).await;
}

/// `migrate` upgrades a version 1 outbox in place: pending rows keep their ids and order,
/// retrying and failed heads keep their attempts and errors (parked), published history stays
/// in `outbox_v1`, and new rows come after the old ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_upgrades_a_version_one_outbox_in_place() {
    let pool = connect_pool(&database_url(), 4).await.unwrap();
    // The version 2 schema, before the engine change.
    let schema = schema_at_version(&pool, "eng_up", 2).await;
    sqlx::raw_sql(&schema.render(
        "INSERT INTO {schema}.outbox (aggregate_type, aggregate_id, event_type, payload, state,
                                      attempts, last_error, published_at)
         VALUES ('o', 'a', 'e', '{\"n\":1}', 'published', 1, NULL, now()),
                ('o', 'a', 'e', '{\"n\":2}', 'pending', 0, NULL, NULL),
                ('o', 'b', 'e', '{\"n\":1}', 'failed', 3, 'too large', NULL),
                ('o', 'b', 'e', '{\"n\":2}', 'pending', 0, NULL, NULL),
                ('o', 'c', 'e', '{\"n\":1}', 'pending', 2, 'down', NULL),
                ('o', 'a', 'e', '{\"n\":3}', 'pending', 0, NULL, NULL);",
    ))
    .execute(&pool)
    .await
    .unwrap();
    let old: Vec<(uuid::Uuid, String, String)> = sqlx::query_as(
        &schema.render("SELECT id, aggregate_id, state FROM {schema}.outbox ORDER BY seq"),
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        migrate(&pool, &schema).await.unwrap(),
        vec![3, 4, 5, 6, 7, 8]
    );
    let store = Arc::new(PgStore::new(pool.clone(), schema.clone()));
    let s = store.stats().await.unwrap();
    assert_eq!((s.failed, s.retrying), (1, 1));
    let m = MemberId::random("m");
    let parts = store.rebalance(&m, Duration::from_secs(30)).await.unwrap();
    // Parked `c` becomes due at once (its next attempt was not set); `b` stays failed.
    let first = store
        .claim(&m, &parts, ClaimLimits::rows(100), OnFailed::Block)
        .await
        .unwrap();
    let got: Vec<_> = first.iter().map(|r| r.id).collect();
    let want: Vec<_> = old
        .iter()
        .filter(|(_, key, state)| state == "pending" && key != "b")
        .map(|(id, _, _)| *id)
        .collect();
    assert_eq!(
        got, want,
        "pending rows keep ids and order; `b` waits behind its failure"
    );
    let c = first.iter().find(|r| r.aggregate_id == "c").unwrap();
    assert_eq!(c.attempts, 2);
    let outcomes: Vec<_> = first
        .iter()
        .map(|r| Outcome::Published { seq: r.seq })
        .collect();
    store.complete(&m, &outcomes).await.unwrap();
    let newer = msg("a", 4);
    store.insert(std::slice::from_ref(&newer)).await.unwrap();
    let next = store
        .claim(&m, &parts, ClaimLimits::rows(100), OnFailed::Block)
        .await
        .unwrap();
    assert_eq!(
        next.iter().map(|r| r.id).collect::<Vec<_>>(),
        vec![newer.id],
        "{next:?}"
    );
    assert!(next[0].seq > first.iter().map(|r| r.seq).max().unwrap());
    let history: i64 = sqlx::query_scalar(
        &schema.render("SELECT count(*) FROM {schema}.outbox_v1 WHERE state = 'published'"),
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(history, 1);
    let row = sqlx::query(&schema.render(
        "SELECT state, attempts, last_error FROM {schema}.outbox_parked WHERE aggregate_id = 'b'
         ORDER BY seq LIMIT 1",
    ))
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(row.get::<String, _>("state"), "failed");
    assert_eq!(row.get::<i32, _>("attempts"), 3);
    assert_eq!(
        row.get::<Option<String>, _>("last_error").as_deref(),
        Some("too large")
    );
    teardown(&pool, &schema).await;
}

/// A key stuck behind a failed head with a long backlog parks its rows only up to the cap:
/// then its partition stops advancing (other partitions flow, status says so), and once the
/// head is dealt with everything behind it comes out in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_at_the_parking_cap_stops_advancing_and_resumes_in_order() {
    let (pool, schema, _) = setup("eng_cap").await;
    let store = Arc::new(PgStore::new(pool.clone(), schema.clone()).with_parked_cap(5));
    // Two keys in one partition, one in another.
    let part = |k: String| {
        let pool = pool.clone();
        async move {
            let p: i32 = sqlx::query_scalar("SELECT ((hashtext($1) & 2147483647) % 64)::int4")
                .bind(&k)
                .fetch_one(&pool)
                .await
                .unwrap();
            (k, p)
        }
    };
    let (stuck, p0) = part("stuck".into()).await;
    let mut same = None;
    let mut other = None;
    for i in 0..1000 {
        let (k, p) = part(format!("k{i}")).await;
        if p == p0 && same.is_none() {
            same = Some(k);
        } else if p != p0 && other.is_none() {
            other = Some(k);
        }
        if same.is_some() && other.is_some() {
            break;
        }
    }
    let (same, other) = (same.unwrap(), other.unwrap());
    let stuck_rows: Vec<_> = (0..600).map(|i| msg(&stuck, i)).collect();
    store.insert(&stuck_rows).await.unwrap();
    let same_row = msg(&same, 0);
    store.insert(std::slice::from_ref(&same_row)).await.unwrap();
    let m = MemberId::random("m");
    let parts = store.rebalance(&m, Duration::from_secs(30)).await.unwrap();
    // Fail the stuck head: the rest of its key parks behind it, batch by batch, until the
    // partition holds the cap (overshooting by at most one batch).
    let got = store
        .claim(&m, &parts, ClaimLimits::rows(3), OnFailed::Block)
        .await
        .unwrap();
    assert_eq!(got[0].id, stuck_rows[0].id);
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
    let mut delivered = Vec::new();
    for _ in 0..20 {
        let got = store
            .claim(&m, &parts, ClaimLimits::rows(50), OnFailed::Block)
            .await
            .unwrap();
        let outcomes: Vec<_> = got
            .iter()
            .map(|r| Outcome::Published { seq: r.seq })
            .collect();
        store.complete(&m, &outcomes).await.unwrap();
        delivered.extend(got.iter().map(|r| r.id));
    }
    assert!(
        delivered.is_empty(),
        "nothing of the stopped partition flows"
    );
    let s = store.stats().await.unwrap();
    assert_eq!(s.partitions_at_parking_cap, 1, "{s:?}");
    let parked: i64 =
        sqlx::query_scalar(&schema.render("SELECT count(*) FROM {schema}.outbox_parked"))
            .fetch_one(&pool)
            .await
            .unwrap();
    assert!(
        (5..=60).contains(&parked),
        "parking stops at the cap: {parked}"
    );
    // The partition stopped: `same` waits although its key is fine; another partition flows.
    let other_row = msg(&other, 0);
    store
        .insert(std::slice::from_ref(&other_row))
        .await
        .unwrap();
    let more = drain(&store, &m, &parts).await;
    assert_eq!(more, vec![other_row.id], "other partitions flow");
    // The operator removes the failed head: the key drains in order, then the partition resumes.
    sqlx::query(&schema.render("DELETE FROM {schema}.outbox_parked WHERE state = 'failed'"))
        .execute(&pool)
        .await
        .unwrap();
    // A relay re-reads parked messages it did not change itself at most every second.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let mut rest = Vec::new();
    for _ in 0..30 {
        rest.extend(drain(&store, &m, &parts).await);
    }
    let stuck_out: Vec<_> = rest
        .iter()
        .filter(|id| stuck_rows.iter().any(|r| r.id == **id))
        .copied()
        .collect();
    let want: Vec<_> = stuck_rows[1..].iter().map(|r| r.id).collect();
    assert_eq!(
        stuck_out, want,
        "the stuck key comes out complete and in order"
    );
    assert_eq!(
        rest.last(),
        Some(&same_row.id),
        "the partition resumes after the key"
    );
    let s = store.stats().await.unwrap();
    assert_eq!(
        (s.pending, s.parked, s.partitions_at_parking_cap),
        (0, 0, 0)
    );
    teardown(&pool, &schema).await;
}

/// A member's very first claim already knows where the rows it reads end: when that window
/// closes, the next one starts from there, not from the beginning of the table (which made every
/// empty poll after a 1,000,000-row drain walk the whole history: 740 ms each).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_window_starts_the_next_one_after_the_rows_it_passed() {
    let (pool, schema, store) = setup("eng_floor").await;
    let rows: Vec<_> = (0..1000).map(|i| msg("k", i)).collect();
    store.insert(&rows).await.unwrap();
    let m = MemberId::random("m");
    let parts = store.rebalance(&m, Duration::from_secs(30)).await.unwrap();
    let got = store
        .claim(&m, &parts, ClaimLimits::rows(5000), OnFailed::Block)
        .await
        .unwrap();
    assert_eq!(got.len(), 1000);
    let outcomes: Vec<_> = got
        .iter()
        .map(|r| Outcome::Published { seq: r.seq })
        .collect();
    store.complete(&m, &outcomes).await.unwrap();
    let (floor, open): (i64, bool) = sqlx::query_as(&schema.render(
        "SELECT done_floor, cur IS NOT NULL FROM {schema}.outbox_positions
         WHERE partition = (SELECT partition FROM {schema}.outbox LIMIT 1)
         ORDER BY id DESC LIMIT 1",
    ))
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(!open, "the window was read to its end and closed");
    assert!(
        floor >= 1000,
        "the next window starts from seq {floor}, not after the 1000 rows passed"
    );
    teardown(&pool, &schema).await;
}

/// Publishes a backlog the way a relay does on a hot key: each batch is read ahead while the
/// one before it is "published", then adopted once that one is recorded. Batches read ahead
/// continue exactly where the pending ones end: every row arrives once, each key in order,
/// including rows committed while a window was open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_read_ahead_continue_the_pending_ones_and_deliver_every_row_once_in_order() {
    let (pool, schema, store) = setup("eng_ahead").await;
    for t in 0..5u32 {
        let rows: Vec<_> = (0..400u32)
            .map(|i| msg(if i % 4 == 0 { "cold" } else { "hot" }, t * 400 + i))
            .collect();
        store.insert(&rows).await.unwrap();
    }
    let m = MemberId::random("m");
    let parts = store.rebalance(&m, Duration::from_secs(30)).await.unwrap();
    let limits = ClaimLimits::rows(150);
    let (mut seen, mut batch, mut empty, mut adopted, mut round) =
        (Vec::new(), Vec::new(), 0, 0, 0);
    while empty < 2 {
        if batch.is_empty() {
            batch = store
                .claim(&m, &parts, limits, OnFailed::Block)
                .await
                .unwrap();
            if batch.is_empty() {
                empty += 1;
                continue;
            }
        }
        empty = 0;
        round += 1;
        if round == 3 {
            let later: Vec<_> = (0..50).map(|i| msg("hot", 10_000 + i)).collect();
            store.insert(&later).await.unwrap();
        }
        let ahead = store
            .claim_ahead(&m, &parts, limits, OnFailed::Block)
            .await
            .unwrap();
        let outcomes: Vec<_> = batch
            .iter()
            .map(|r| Outcome::Published { seq: r.seq })
            .collect();
        store.complete(&m, &outcomes).await.unwrap();
        seen.append(&mut batch);
        if !ahead.is_empty() {
            assert!(
                store.adopt_ahead(&m).await,
                "a batch recorded in full as read ahead is followed"
            );
            adopted += 1;
            batch = ahead;
        }
    }
    let total: i64 = sqlx::query_scalar(&schema.render("SELECT count(*) FROM {schema}.outbox"))
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(seen.len() as i64, total, "every row once");
    let ids: std::collections::HashSet<_> = seen.iter().map(|m| m.id).collect();
    assert_eq!(ids.len(), seen.len(), "no row twice");
    for key in ["hot", "cold"] {
        let seqs: Vec<i64> = seen
            .iter()
            .filter(|m| m.aggregate_id == key)
            .map(|m| m.seq)
            .collect();
        assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{key} in order");
    }
    assert!(
        adopted >= 5,
        "the backlog was read ahead ({adopted} batches)"
    );
    teardown(&pool, &schema).await;
}

/// A batch read ahead is dropped, never published, when the batch before it was not recorded
/// as the read assumed (a message retried) or when a claim came in between; what it held is
/// then claimed again, in key order behind the retried message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_read_ahead_is_dropped_unless_the_one_before_was_all_published() {
    let (pool, schema, store) = setup("eng_ahead_drop").await;
    let rows: Vec<_> = (0..300).map(|i| msg("hot", i)).collect();
    store.insert(&rows).await.unwrap();
    let m = MemberId::random("m");
    let parts = store.rebalance(&m, Duration::from_secs(30)).await.unwrap();
    let limits = ClaimLimits::rows(100);
    let first = store
        .claim(&m, &parts, limits, OnFailed::Block)
        .await
        .unwrap();
    let ahead = store
        .claim_ahead(&m, &parts, limits, OnFailed::Block)
        .await
        .unwrap();
    assert_eq!((first.len(), ahead.len()), (100, 100));
    assert!(
        ahead[0].seq > first[99].seq,
        "it continues after the pending batch"
    );
    // The head is retried; a relay tries no later message of its key.
    store
        .complete(
            &m,
            &[Outcome::Retry {
                seq: first[0].seq,
                error: "broker said no".into(),
                delay: Duration::ZERO,
            }],
        )
        .await
        .unwrap();
    assert!(!store.adopt_ahead(&m).await, "not recorded as assumed");
    // A claim in between drops a read ahead too.
    let ahead = store
        .claim_ahead(&m, &parts, limits, OnFailed::Block)
        .await
        .unwrap();
    assert!(ahead.is_empty(), "nothing is pending to follow");
    let all = drain(&store, &m, &parts).await;
    let expected: Vec<_> = sqlx::query_scalar::<_, uuid::Uuid>(
        &schema.render("SELECT id FROM {schema}.outbox ORDER BY seq"),
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(all, expected, "every message once, in key order");
    // After a plain claim, a read ahead taken before it is not adopted.
    let more: Vec<_> = (0..300).map(|i| msg("hot", 1000 + i)).collect();
    store.insert(&more).await.unwrap();
    let a = store
        .claim(&m, &parts, limits, OnFailed::Block)
        .await
        .unwrap();
    let b = store
        .claim_ahead(&m, &parts, limits, OnFailed::Block)
        .await
        .unwrap();
    assert!(!a.is_empty() && !b.is_empty());
    let again = store
        .claim(&m, &parts, limits, OnFailed::Block)
        .await
        .unwrap();
    assert_eq!(again.first().map(|x| x.seq), a.first().map(|x| x.seq));
    let outcomes: Vec<_> = again
        .iter()
        .map(|r| Outcome::Published { seq: r.seq })
        .collect();
    store.complete(&m, &outcomes).await.unwrap();
    assert!(!store.adopt_ahead(&m).await, "a claim came in between");
    teardown(&pool, &schema).await;
}

/// A member whose lease ran out while it published a batch records nothing (fenced), and the
/// batch it read ahead meanwhile is then never adopted: the new owner serves those rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_read_ahead_is_not_adopted_after_the_partitions_changed_owner() {
    let (pool, schema, store) = setup("eng_ahead_fence").await;
    let rows: Vec<_> = (0..300).map(|i| msg("hot", i)).collect();
    store.insert(&rows).await.unwrap();
    let lease = Duration::from_secs(1);
    let (m, m2) = (MemberId::random("m"), MemberId::random("m2"));
    let parts = store.rebalance(&m, lease).await.unwrap();
    let limits = ClaimLimits::rows(100);
    let first = store
        .claim(&m, &parts, limits, OnFailed::Block)
        .await
        .unwrap();
    let ahead = store
        .claim_ahead(&m, &parts, limits, OnFailed::Block)
        .await
        .unwrap();
    assert!(!first.is_empty() && !ahead.is_empty());
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // Silent for longer than the lease, `m` is forgotten and `m2` takes every partition.
    let taken = store.rebalance(&m2, lease).await.unwrap();
    assert_eq!(
        taken.len(),
        parts.len(),
        "the other member took every partition"
    );
    let outcomes: Vec<_> = first
        .iter()
        .map(|r| Outcome::Published { seq: r.seq })
        .collect();
    assert_eq!(store.complete(&m, &outcomes).await.unwrap(), 0, "fenced");
    assert!(
        !store.adopt_ahead(&m).await,
        "the batch before it was not recorded"
    );
    // The new owner starts from the last recorded position: the first batch again.
    let again = store
        .claim(&m2, &taken, limits, OnFailed::Block)
        .await
        .unwrap();
    assert_eq!(again.first().map(|x| x.id), first.first().map(|x| x.id));
    teardown(&pool, &schema).await;
}

/// A batch shared among many busy partitions comes back full: each partition's slice is
/// rounded up, so a limit that does not divide among them (here 3 per partition and one more)
/// is still reached. Rounded down, every batch came back short, which the relay reads as
/// "caught up": it then never read ahead and paused after every batch. The rows past the limit
/// are handed out by the next claims, every row once and each key in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_shared_among_busy_partitions_comes_back_full() {
    let (pool, schema, store) = setup("eng_full").await;
    let rows: Vec<_> = (0..2000u32)
        .map(|i| msg(&format!("k{}", i % 100), i))
        .collect();
    store.insert(&rows).await.unwrap();
    let busy: i64 =
        sqlx::query_scalar(&schema.render("SELECT count(DISTINCT partition) FROM {schema}.outbox"))
            .fetch_one(&pool)
            .await
            .unwrap();
    // Every busy partition holds at least 20 rows (one key), enough for 5 slices of 4.
    let limit = usize::try_from(busy * 3 + 1).unwrap();
    let m = MemberId::random("m");
    let parts = store.rebalance(&m, Duration::from_secs(30)).await.unwrap();
    let mut seen = Vec::new();
    for claim in 0..5 {
        let got = store
            .claim(&m, &parts, ClaimLimits::rows(limit), OnFailed::Block)
            .await
            .unwrap();
        assert_eq!(
            got.len(),
            limit,
            "claim {claim} over {busy} busy partitions is full"
        );
        let outcomes: Vec<_> = got
            .iter()
            .map(|r| Outcome::Published { seq: r.seq })
            .collect();
        store.complete(&m, &outcomes).await.unwrap();
        seen.extend(got);
    }
    let rest = drain(&store, &m, &parts).await;
    let mut ids: Vec<uuid::Uuid> = seen.iter().map(|r| r.id).collect();
    ids.extend(rest);
    assert_eq!(ids.len(), rows.len(), "every row once");
    let unique: std::collections::HashSet<_> = ids.iter().collect();
    assert_eq!(unique.len(), rows.len(), "no row twice");
    let mut last: std::collections::HashMap<&str, i64> = std::collections::HashMap::new();
    for r in &seen {
        let prev = last.insert(r.aggregate_id.as_str(), r.seq);
        assert!(
            prev.is_none_or(|p| p < r.seq),
            "{} in order",
            r.aggregate_id
        );
    }
    teardown(&pool, &schema).await;
}

/// The status counts, the scrape's gauge and the backlog by type count exactly what is left at
/// every point of an open window: the rows a claim has passed are gone from them, the rest and a
/// transaction that committed after the window opened (its seqs below the window's cursor) are
/// in. They read their ranges from past the cursor (pending_rows.sql), so this is what keeps
/// that from skipping or double-counting a part.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_counts_what_is_left_at_every_point_of_an_open_window() {
    let (pool, schema, store) = setup("eng_pend").await;
    let m = MemberId::random("m");
    let parts = store.rebalance(&m, Duration::from_secs(30)).await.unwrap();
    // Draws its seqs first, in k0's partition, and commits while k0's window is open: a raw
    // insert (no key lock), so the rows of k0 below can be written meanwhile.
    let mut late = pool.begin().await.unwrap();
    sqlx::raw_sql(&schema.render(
        "INSERT INTO {schema}.outbox (aggregate_type, aggregate_id, event_type, payload)
         SELECT 'order', 'k0', 'placed', jsonb_build_object('late', g)
         FROM generate_series(1, 7) AS g",
    ))
    .execute(&mut *late)
    .await
    .unwrap();
    let rows: Vec<_> = (0..2000).map(|n| msg(&format!("k{}", n % 5), n)).collect();
    store.insert(&rows).await.unwrap();
    let counts = || async {
        let s = store.stats().await.unwrap().pending;
        let g = store.gauges().await.unwrap().pending;
        let t: i64 = store
            .pending_by_type(1000)
            .await
            .unwrap()
            .iter()
            .map(|c| c.pending)
            .sum();
        (s, g, t)
    };
    let mut left = 2000;
    assert_eq!(counts().await, (left, left, left), "before any claim");
    let mut rounds = 0;
    loop {
        let got = store
            .claim(&m, &parts, ClaimLimits::rows(60), OnFailed::Block)
            .await
            .unwrap();
        publish_all(&store, &m, &got).await;
        left -= got.len() as i64;
        rounds += 1;
        if rounds == 3 {
            late.commit().await.unwrap();
            left += 7;
            // Moved on by nobody yet: the late rows are pending from the moment they commit.
            assert_eq!(counts().await, (left, left, left), "after the late commit");
            break;
        }
        assert_eq!(counts().await, (left, left, left), "after round {rounds}");
    }
    assert!(left > 7, "the window is still open: {left} left");
    let rest = drain(&store, &m, &parts).await;
    assert_eq!(rest.len() as i64, left);
    assert_eq!(counts().await, (0, 0, 0), "drained");
    teardown(&pool, &schema).await;
}

/// The floor audit counts a row lying at or below its partition's floor although its
/// transaction got its id after that floor was read: the row a claim would pass over, planted
/// here since the engine never writes one. (Without this the audit's 0 in `outbox verify` and
/// `bench --mode idle-tx` would prove nothing.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_floor_audit_counts_a_row_planted_below_the_floor() {
    let (pool, schema, store) = setup("eng_audit").await;
    let m = MemberId::random("m");
    let parts = store.rebalance(&m, Duration::from_secs(30)).await.unwrap();
    store.insert(&[msg("k", 1), msg("k", 2)]).await.unwrap();
    assert_eq!(drain(&store, &m, &parts).await.len(), 2);
    assert_eq!(store.floor_audit().await.unwrap(), 0);
    // Planted: seq 0, below every floor, written after the floors were read.
    sqlx::query(&schema.render(
        "INSERT INTO {schema}.outbox (id, aggregate_type, aggregate_id, event_type, payload, seq) \
         OVERRIDING SYSTEM VALUE VALUES (gen_random_uuid(), 'order', 'k', 'placed', '{}', 0)",
    ))
    .execute(&pool)
    .await
    .unwrap();
    assert_eq!(store.floor_audit().await.unwrap(), 1);
    teardown(&pool, &schema).await;
}

/// The relay drops a claim that outlives its budget, and a metrics scrape a figure that
/// outlives its timeout. sqlx counts a transaction only once the server answered its `BEGIN`
/// (sqlx issue #4393), so a call dropped in between would return its connection to the pool
/// inside a transaction nobody ends, whose snapshot holds back vacuum and retention. Calls
/// dropped at every point leave none.
#[tokio::test]
async fn a_call_dropped_at_any_point_leaves_no_transaction_open_on_the_pool() {
    let pool = connect_pool(&database_url(), 1).await.unwrap();
    let schema = Schema::new(&outbox_testkit::unique_name("drop")).unwrap();
    migrate(&pool, &schema).await.unwrap();
    let store = PgStore::new(pool.clone(), schema.clone());
    let member = MemberId::random("drop");
    store.join(&member).await.unwrap();
    let parts = store
        .rebalance(&member, Duration::from_secs(60))
        .await
        .unwrap();
    for round in 0..200u32 {
        store.insert(&[msg("k", round)]).await.unwrap();
        let cut = Duration::from_micros(u64::from(round) * 5);
        let _ = tokio::time::timeout(
            cut,
            store.claim(&member, &parts, ClaimLimits::rows(10), OnFailed::Block),
        )
        .await;
        let _ = tokio::time::timeout(cut, store.gauges()).await;
        let _ = tokio::time::timeout(cut, store.insert(&[msg("j", round)])).await;
        // The pool's one connection, once it is back: outside a transaction, `now()` is the
        // start of this statement (a simple query: one message, one implicit transaction).
        let fresh: bool = sqlx::raw_sql("SELECT now() = statement_timestamp()")
            .fetch_one(&pool)
            .await
            .unwrap()
            .get(0);
        assert!(
            fresh,
            "round {round}: a transaction was left open on the pool"
        );
    }
    teardown(&pool, &schema).await;
}
