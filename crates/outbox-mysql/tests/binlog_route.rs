//! The binlog route (`outbox migrate --binlog`) against a real MariaDB with the row binlog on
//! (scripts/services.sh starts one on 127.0.0.1:3307; `OUTBOX_TEST_MYSQL_BINLOG_URL` names
//! another): the whole store conformance suite over the sequencer's positions, and what is
//! particular to them (commit order without a trigger, rows the binlog did not carry, the switch
//! from the trigger, a purged binlog, one sequencer at a time). Each test in a database of its
//! own.

#![allow(clippy::unwrap_used)] // tests

use std::sync::Arc;
use std::time::{Duration, Instant};

use outbox_core::{ClaimLimits, MemberId, OnFailed, Outcome, Store};
use outbox_mysql::binlog::{route, server, BinlogPosition};
use outbox_mysql::{MysqlStore, Schema};
use outbox_testkit::conformance::Fixture;
use sqlx::MySqlPool;

mod common;

fn binlog_url() -> String {
    std::env::var("OUTBOX_TEST_MYSQL_BINLOG_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3307/test".into())
}

/// An outbox in a database of its own on the binlog server, migrated, the route on.
fn store(pool: &MySqlPool, schema: &Schema) -> Arc<MysqlStore> {
    Arc::new(MysqlStore::binlog(pool.clone(), schema.clone(), &binlog_url()).unwrap())
}

async fn fresh_store() -> Fixture {
    let (pool, schema) = common::routed_outbox(&binlog_url()).await;
    let routed = store(&pool, &schema);
    let store: Arc<dyn Store> = routed.clone();
    Fixture {
        store,
        teardown: Box::pin(async move {
            // Its sessions end before the database goes.
            routed.sequencer().unwrap().stop().await;
            common::drop_db(&pool, &schema).await
        }),
    }
}

outbox_testkit::store_conformance_suite!(fresh_store);

/// Starts `store`'s sequencer and waits until it reads the binlog: what is written from then on
/// is sequenced from the stream, in commit order (what was written before comes from the table,
/// in seq order).
async fn started(store: &MysqlStore) {
    let sequencer = store.sequencer().unwrap();
    sequencer.start();
    sequencer
        .wait_until_sequenced(Duration::from_secs(20))
        .await
        .unwrap();
}

/// The plain four-column insert of `key` carrying `n`, on `conn`.
async fn raw_insert(conn: &mut sqlx::MySqlConnection, schema: &Schema, key: &str, n: u64) -> i64 {
    sqlx::query(&schema.render(
        "INSERT INTO {schema}.outbox (aggregate_type, aggregate_id, event_type, payload) \
         VALUES ('order', ?, 'placed', JSON_OBJECT('n', ?))",
    ))
    .bind(key)
    .bind(n)
    .execute(&mut *conn)
    .await
    .unwrap()
    .last_insert_id() as i64
}

/// `(seq, part_seq)` of every sequenced row of `key`'s partition, by position.
async fn positions(pool: &MySqlPool, schema: &Schema, key: &str) -> Vec<(i64, i64)> {
    sqlx::query_as(&schema.render(
        "SELECT seq, part_seq FROM {schema}.outbox_sequence WHERE part = CRC32(?) % 64 \
         ORDER BY part_seq",
    ))
    .bind(key)
    .fetch_all(pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn the_route_takes_the_trigger_away_and_a_server_without_a_row_binlog_is_refused() {
    let (pool, schema) = common::routed_outbox(&binlog_url()).await;
    let trigger: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM information_schema.TRIGGERS WHERE TRIGGER_SCHEMA = ?",
    )
    .bind(schema.as_str())
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(trigger, 0);
    assert!(route::is_on(&pool, &schema).await.unwrap());
    // Again: nothing changes, nothing fails.
    route::enable(&pool, &schema).await.unwrap();
    let mut conn = pool.acquire().await.unwrap();
    let seq = raw_insert(&mut conn, &schema, "k", 1).await;
    let (part, part_seq): (i16, i64) =
        sqlx::query_as(&schema.render("SELECT part, part_seq FROM {schema}.outbox WHERE seq = ?"))
            .bind(seq)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(
        (part, part_seq),
        (-1, 0),
        "the writer's row carries no position"
    );
    common::drop_db(&pool, &schema).await;

    // This machine's own server writes no binlog: the route is refused with what to set.
    let (pool, schema) = common::migrated_outbox(&common::server_url(), 2).await;
    let e = route::enable(&pool, &schema).await.unwrap_err();
    assert!(e.to_string().contains("log_bin"), "{e}");
    assert!(!route::is_on(&pool, &schema).await.unwrap());
    common::drop_db(&pool, &schema).await;
}

#[tokio::test]
async fn positions_follow_commit_order_not_seq_order() {
    let (pool, schema) = common::routed_outbox(&binlog_url()).await;
    let store = store(&pool, &schema);
    // Written before any relay ran since the switch: still read from the binlog, from where
    // `migrate --binlog` saw it end, so in commit order.
    let mut first = pool.begin().await.unwrap();
    let mut second = pool.begin().await.unwrap();
    // `first` draws the lower seq, `second` commits first.
    let low = raw_insert(&mut first, &schema, "acct-1", 1).await;
    let high = raw_insert(&mut second, &schema, "acct-1", 2).await;
    assert!(low < high);
    second.commit().await.unwrap();
    first.commit().await.unwrap();
    // A rolled-back row never gets a position.
    let mut rolled = pool.begin().await.unwrap();
    raw_insert(&mut rolled, &schema, "acct-1", 3).await;
    rolled.rollback().await.unwrap();
    started(&store).await;
    assert_eq!(
        positions(&pool, &schema, "acct-1").await,
        vec![(high, 1), (low, 2)]
    );
    let got = common::drain(&store, 2).await;
    let ns: Vec<u64> = got.iter().map(common::n_of).collect();
    assert_eq!(ns, vec![2, 1], "relayed in commit order");
    common::drop_db(&pool, &schema).await;
}

#[tokio::test]
async fn a_row_the_binlog_did_not_carry_is_sequenced_by_the_seal() {
    let (pool, schema) = common::routed_outbox(&binlog_url()).await;
    let store = store(&pool, &schema);
    let sequencer = store.sequencer().unwrap();
    started(&store).await;
    let mut conn = pool.acquire().await.unwrap();
    raw_insert(&mut conn, &schema, "k", 1).await;
    // A session that keeps its writes out of the binlog (a maintenance script, say).
    let mut hidden = pool.acquire().await.unwrap();
    sqlx::query("SET SESSION sql_log_bin = 0")
        .execute(&mut *hidden)
        .await
        .unwrap();
    let unseen = raw_insert(&mut hidden, &schema, "k", 2).await;
    sqlx::query("SET SESSION sql_log_bin = 1")
        .execute(&mut *hidden)
        .await
        .unwrap();
    drop(hidden);
    raw_insert(&mut conn, &schema, "k", 3).await;
    let got = common::drain(&store, 3).await;
    let mut ns: Vec<u64> = got.iter().map(common::n_of).collect();
    ns.sort_unstable();
    assert_eq!(ns, vec![1, 2, 3], "nothing lost");
    assert!(sequencer.progress().borrow().from_table >= 1);
    let from_table: i64 = sqlx::query_scalar(
        &schema.render("SELECT from_table FROM {schema}.outbox_sequencer WHERE id = 1"),
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(from_table, 1);
    // The seal is raised past it right after (the same round).
    let mut below = sequencer.progress();
    tokio::time::timeout(
        Duration::from_secs(10),
        below.wait_for(|p| p.sequenced_below > unseen),
    )
    .await
    .unwrap()
    .unwrap();
    common::drop_db(&pool, &schema).await;
}

#[tokio::test]
async fn the_switch_keeps_the_triggers_positions_and_loses_nothing() {
    let (pool, schema) = common::migrated_outbox(&binlog_url(), 8).await;
    // Written under the trigger; the first two relayed by the polling route.
    let trigger_store = MysqlStore::new(pool.clone(), schema.clone());
    for n in 1..=4 {
        trigger_store.insert(&[common::msg("k", n)]).await.unwrap();
    }
    let member = MemberId::random("before");
    let parts = trigger_store
        .rebalance(&member, Duration::from_secs(30))
        .await
        .unwrap();
    let first = trigger_store
        .claim(&member, &parts, ClaimLimits::rows(2), OnFailed::Block)
        .await
        .unwrap();
    assert_eq!(first.len(), 2);
    let done: Vec<Outcome> = first
        .iter()
        .map(|m| Outcome::Published { seq: m.seq })
        .collect();
    trigger_store.complete(&member, &done).await.unwrap();
    trigger_store.release(&member).await.unwrap();
    // A writer positioned by the trigger still open while the route is turned on.
    let mut open = pool.begin().await.unwrap();
    raw_insert(&mut open, &schema, "k", 5).await;
    let (switched, ()) = tokio::join!(route::enable(&pool, &schema), async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        open.commit().await.unwrap();
    });
    switched.unwrap();
    // Written after the switch: no trigger.
    let mut conn = pool.acquire().await.unwrap();
    for n in 6..=8 {
        raw_insert(&mut conn, &schema, "k", n).await;
    }
    let store = store(&pool, &schema);
    let got = common::drain(&store, 6).await;
    let ns: Vec<u64> = got.iter().map(common::n_of).collect();
    assert_eq!(ns, vec![3, 4, 5, 6, 7, 8], "the rest, in order, once");
    let pos = positions(&pool, &schema, "k").await;
    let ps: Vec<i64> = pos.iter().map(|(_, p)| *p).collect();
    assert_eq!(
        ps,
        (1..=8).collect::<Vec<i64>>(),
        "the trigger's kept, the next ones after"
    );
    common::drop_db(&pool, &schema).await;
}

#[tokio::test]
async fn a_purged_binlog_is_made_good_from_the_table() {
    let (pool, schema) = common::routed_outbox(&binlog_url()).await;
    let mut conn = pool.acquire().await.unwrap();
    {
        let store = store(&pool, &schema);
        raw_insert(&mut conn, &schema, "k", 1).await;
        assert_eq!(common::drain(&store, 1).await.len(), 1);
        store.sequencer().unwrap().stop().await;
    }
    // Written while no sequencer runs; then its binlog is "purged": its saved position names a
    // file numbered before the oldest the server holds (a real purge would take files from
    // under the other tests).
    for n in 2..=4 {
        raw_insert(&mut conn, &schema, if n % 2 == 0 { "k" } else { "j" }, n).await;
    }
    let oldest = server::files(&pool).await.unwrap().remove(0);
    let oldest = BinlogPosition::new(oldest, 4);
    let (base, _) = oldest.file.rsplit_once('.').unwrap();
    let gone = format!("{base}.{:06}", oldest.file_number().unwrap() - 1);
    sqlx::query(&schema.render(
        "UPDATE {schema}.outbox_sequencer SET binlog_file = ?, binlog_offset = 4 WHERE id = 1",
    ))
    .bind(&gone)
    .execute(&pool)
    .await
    .unwrap();
    let store = store(&pool, &schema);
    let got = common::drain(&store, 3).await;
    let mut ns: Vec<u64> = got.iter().map(common::n_of).collect();
    ns.sort_unstable();
    assert_eq!(ns, vec![2, 3, 4]);
    // And the stream goes on from the binlog's end.
    raw_insert(&mut conn, &schema, "k", 5).await;
    let got = common::drain(&store, 1).await;
    assert_eq!(common::n_of(&got[0]), 5);
    let saved: String = sqlx::query_scalar(
        &schema
            .render("SELECT CAST(binlog_file AS CHAR) FROM {schema}.outbox_sequencer WHERE id = 1"),
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_ne!(saved, gone);
    common::drop_db(&pool, &schema).await;
}

#[tokio::test]
async fn one_sequencer_at_a_time_and_the_next_goes_on_without_a_gap() {
    let (pool, schema) = common::routed_outbox(&binlog_url()).await;
    let a = store(&pool, &schema);
    let b = store(&pool, &schema);
    a.sequencer().unwrap().start();
    let mut conn = pool.acquire().await.unwrap();
    raw_insert(&mut conn, &schema, "k", 1).await;
    a.sequencer()
        .unwrap()
        .wait_until_sequenced(Duration::from_secs(20))
        .await
        .unwrap();
    b.sequencer().unwrap().start();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(a.sequencer().unwrap().progress().borrow().leading);
    assert!(!b.sequencer().unwrap().progress().borrow().leading);
    raw_insert(&mut conn, &schema, "k", 2).await;
    // `b` waits for the leader's saved position.
    b.sequencer()
        .unwrap()
        .wait_until_sequenced(Duration::from_secs(20))
        .await
        .unwrap();
    a.sequencer().unwrap().stop().await;
    raw_insert(&mut conn, &schema, "k", 3).await;
    b.sequencer()
        .unwrap()
        .wait_until_sequenced(Duration::from_secs(20))
        .await
        .unwrap();
    assert!(b.sequencer().unwrap().progress().borrow().leading);
    let ps: Vec<i64> = positions(&pool, &schema, "k")
        .await
        .iter()
        .map(|(_, p)| *p)
        .collect();
    assert_eq!(ps, vec![1, 2, 3]);
    common::drop_db(&pool, &schema).await;
}

/// A sequencer whose lease another took (a pause past its lease, a network split) writes
/// nothing more: its next write is refused whole by the epoch checked in the same transaction,
/// so a row it reads meanwhile gets no position from it. Once the lease is free again it takes
/// it with a new epoch and goes on from its last saved position: the row gets one position.
#[tokio::test]
async fn a_sequencer_whose_lease_was_taken_writes_nothing_then_goes_on_from_its_saved_position() {
    let (pool, schema) = common::routed_outbox(&binlog_url()).await;
    let a = store(&pool, &schema);
    let sequencer = a.sequencer().unwrap();
    started(&a).await;
    let mut conn = pool.acquire().await.unwrap();
    raw_insert(&mut conn, &schema, "k", 1).await;
    sequencer
        .wait_until_sequenced(Duration::from_secs(20))
        .await
        .unwrap();
    // Another sequencer takes the lease for 3 s, as one would once this one's had run out.
    sqlx::query(&schema.render(
        "UPDATE {schema}.outbox_sequencer SET owner = 'intruder', epoch = epoch + 1, \
         lease_until = UTC_TIMESTAMP(6) + INTERVAL 3 SECOND WHERE id = 1",
    ))
    .execute(&pool)
    .await
    .unwrap();
    let taken_epoch: i64 = sqlx::query_scalar(
        &schema.render("SELECT epoch FROM {schema}.outbox_sequencer WHERE id = 1"),
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    let seq = raw_insert(&mut conn, &schema, "k", 2).await;
    // `a` reads the row (or renews its lease first) and is refused.
    let until = Instant::now() + Duration::from_secs(5);
    let error = loop {
        if let Some(e) = sequencer.progress().borrow().error.clone() {
            break e;
        }
        assert!(
            Instant::now() < until,
            "the fenced sequencer reported nothing"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(error.contains("another sequencer took"), "{error}");
    assert!(!sequencer.progress().borrow().leading);
    // Read in one statement: while the other holds the lease, the row has no position.
    let (positioned, intruder_holds): (i64, i64) = sqlx::query_as(&schema.render(
        "SELECT (SELECT COUNT(*) FROM {schema}.outbox_sequence WHERE seq = ?), \
         (SELECT CAST(owner = 'intruder' AND lease_until > UTC_TIMESTAMP(6) AS SIGNED) \
          FROM {schema}.outbox_sequencer WHERE id = 1)",
    ))
    .bind(seq)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(
        (positioned, intruder_holds),
        (0, 1),
        "a fenced sequencer wrote a position, or the test's lease ran out before it looked"
    );
    sequencer
        .wait_until_positioned(seq, Duration::from_secs(30))
        .await
        .unwrap();
    assert!(sequencer.progress().borrow().leading);
    let (epoch, owner_is_intruder): (i64, i64) = sqlx::query_as(&schema.render(
        "SELECT epoch, CAST(owner = 'intruder' AS SIGNED) FROM {schema}.outbox_sequencer \
         WHERE id = 1",
    ))
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!((epoch, owner_is_intruder), (taken_epoch + 1, 0));
    let ps: Vec<i64> = positions(&pool, &schema, "k")
        .await
        .iter()
        .map(|(_, p)| *p)
        .collect();
    assert_eq!(ps, vec![1, 2], "one position each, no gap");
    sequencer.stop().await;
    common::drop_db(&pool, &schema).await;
}

#[tokio::test]
async fn retention_drops_a_range_from_both_tables_once_sealed_and_passed() {
    let (pool, schema) = common::routed_outbox(&binlog_url()).await;
    // Ranges of 10 seqs, laid out again on the empty outbox: the sequence table follows.
    outbox_mysql::ranges::set_width(&pool, &schema, 10)
        .await
        .unwrap();
    let store = store(&pool, &schema);
    started(&store).await;
    let mut conn = pool.acquire().await.unwrap();
    let mut last = 0;
    for n in 1..=25 {
        last = raw_insert(&mut conn, &schema, &format!("k{}", n % 3), n).await;
    }
    assert_eq!(common::drain(&store, 25).await.len(), 25);
    // Sealed past every row (the drain released the sequencer with its member).
    let sequencer = store.sequencer().unwrap();
    sequencer.start();
    tokio::time::timeout(
        Duration::from_secs(20),
        sequencer.progress().wait_for(|p| p.sequenced_below > last),
    )
    .await
    .unwrap()
    .unwrap();
    let report = store.maintain(Duration::ZERO).await.unwrap();
    assert!(report.segments_dropped >= 2, "{report:?}");
    let layout = |table: &'static str| {
        let pool = pool.clone();
        let schema = schema.clone();
        async move {
            sqlx::query_scalar::<_, String>(
                "SELECT CAST(PARTITION_NAME AS CHAR) FROM information_schema.PARTITIONS \
                 WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? ORDER BY PARTITION_ORDINAL_POSITION",
            )
            .bind(schema.as_str())
            .bind(table)
            .fetch_all(&pool)
            .await
            .unwrap()
        }
    };
    assert_eq!(layout("outbox").await, layout("outbox_sequence").await);
    let count = |table: &'static str| {
        let pool = pool.clone();
        let sql = schema.render(&format!("SELECT COUNT(*) FROM {{schema}}.{table}"));
        async move {
            sqlx::query_scalar::<_, i64>(&sql)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    let (rows, positions) = (count("outbox").await, count("outbox_sequence").await);
    assert!(rows < 25, "ranges went: {rows} rows left");
    assert_eq!(rows, positions, "each row's position went with it");
    sequencer.stop().await;
    common::drop_db(&pool, &schema).await;
}

#[tokio::test]
async fn status_and_metrics_show_the_sequencer_its_lag_and_when_none_runs() {
    let (pool, schema) = common::routed_outbox(&binlog_url()).await;
    let store = store(&pool, &schema);
    started(&store).await;
    let mut conn = pool.acquire().await.unwrap();
    let seq = raw_insert(&mut conn, &schema, "k", 1).await;
    let sequencer = store.sequencer().unwrap();
    sequencer
        .wait_until_positioned(seq, Duration::from_secs(20))
        .await
        .unwrap();
    let detail = store.status_detail().await.unwrap();
    let q = detail
        .binlog_sequencer
        .expect("the binlog route shows its sequencer");
    assert!(
        q.owner
            .as_deref()
            .is_some_and(|o| o.starts_with("sequencer-")),
        "{q:?}"
    );
    assert!(
        q.epoch >= 1 && q.through.is_some() && q.binlog_end.is_some(),
        "{q:?}"
    );
    assert!(q.lag_bytes.is_some_and(|b| b >= 0), "{q:?}");
    assert!(q.next_seq > seq, "{q:?}");
    let g = store.gauges().await.unwrap();
    let live = g.binlog_sequencer.expect("its gauges");
    assert!(live.leased && live.save_age_seconds < 10.0, "{live:?}");
    assert_eq!(live.rows_from_table, 0);
    // The report `outbox status` shows (its text view, in outbox-cli, is tested there).
    let report = outbox_core::status::Report::collect(store.as_ref(), &[])
        .await
        .unwrap();
    let q = report
        .binlog_sequencer
        .expect("the sequencer in the report");
    assert!(
        q.owner
            .as_deref()
            .is_some_and(|o| o.starts_with("sequencer-"))
            && q.lease_until.is_some_and(|t| t > report.at),
        "{q:?}"
    );

    // Stopped (the relay is gone): the lease is given up, and both views say so.
    sequencer.stop().await;
    let g = store.gauges().await.unwrap().binlog_sequencer.unwrap();
    assert!(!g.leased, "{g:?}");
    let report = outbox_core::status::Report::collect(store.as_ref(), &[])
        .await
        .unwrap();
    let q = report
        .binlog_sequencer
        .expect("the sequencer in the report");
    // No holder: the text view says NO SEQUENCER and to start `outbox relay`.
    assert!(
        q.owner.is_none() || q.lease_until.is_none_or(|t| t <= report.at),
        "{q:?}"
    );

    // The trigger's route has no sequencer to show.
    let plain = MysqlStore::new(pool.clone(), schema.clone());
    assert_eq!(plain.status_detail().await.unwrap().binlog_sequencer, None);
    assert_eq!(plain.gauges().await.unwrap().binlog_sequencer, None);
    common::drop_db(&pool, &schema).await;
}

/// A relay upgraded before `outbox migrate` ran on an outbox the previous version switched: its
/// sequencer table lacks the newest column (`binlog_gtid`). The sequencer adds it at its start
/// and rows flow; before, every start failed on the unknown column and the route stood still.
#[tokio::test]
async fn an_upgraded_relay_adds_the_sequencers_new_columns_itself() {
    let (pool, schema) = common::routed_outbox(&binlog_url()).await;
    sqlx::query(&schema.render("ALTER TABLE {schema}.outbox_sequencer DROP COLUMN binlog_gtid"))
        .execute(&pool)
        .await
        .unwrap();
    let routed = store(&pool, &schema);
    started(&routed).await;
    let mut conn = pool.acquire().await.unwrap();
    for n in 0..3 {
        raw_insert(&mut conn, &schema, "upgraded", n).await;
    }
    drop(conn);
    let got = common::drain(&routed, 3).await;
    assert_eq!(
        got.len(),
        3,
        "every row came once the sequencer added its column"
    );
    let has: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM information_schema.COLUMNS \
         WHERE TABLE_SCHEMA = ? AND TABLE_NAME = 'outbox_sequencer' AND COLUMN_NAME = 'binlog_gtid'",
    )
    .bind(schema.as_str())
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(has, 1, "the column is there after the sequencer's start");
    routed.sequencer().unwrap().stop().await;
    common::drop_db(&pool, &schema).await;
}
