//! The binlog route when production does what tests usually do not, against real MariaDB
//! servers: a binlog connection black-holed (no RST), a position without a row next to a row
//! the binlog did not carry, and a server whose binlog the sequencer cannot read. Each test in a
//! database of its own.

#![allow(clippy::unwrap_used)] // tests

use std::sync::Arc;
use std::time::Duration;

use outbox_mysql::binlog::{server, status};
use outbox_mysql::{MysqlStore, Schema};
use outbox_testkit::proxy::TcpProxy;
use sqlx::MySqlPool;

mod common;

fn binlog_url() -> String {
    std::env::var("OUTBOX_TEST_MYSQL_BINLOG_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3307/test".into())
}

/// `url` through `proxy`: the same server, user and database, another port.
fn through(url: &str, proxy: &TcpProxy) -> String {
    let (head, rest) = url.split_once('@').unwrap();
    let (_, path) = rest.split_once('/').unwrap();
    format!("{head}@127.0.0.1:{}/{path}", proxy.port())
}

fn port_of(url: &str) -> u16 {
    let host = url.split_once('@').unwrap().1.split('/').next().unwrap();
    host.rsplit_once(':')
        .map_or(3306, |(_, p)| p.parse().unwrap())
}

/// An outbox in a database of its own on the binlog server, migrated, the route on.
/// The plain four-column insert of `key` carrying `n`, on `conn`; its `seq`.
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

async fn positioned(pool: &MySqlPool, schema: &Schema, seq: i64) -> bool {
    sqlx::query_scalar::<_, bool>(
        &schema.render("SELECT EXISTS (SELECT 1 FROM {schema}.outbox_sequence WHERE seq = ?)"),
    )
    .bind(seq)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// The partition of `key`, as the sequencer computes it.
fn part(key: &str) -> i16 {
    outbox_mysql::binlog::sequencer::partition(key)
}

#[tokio::test]
async fn a_black_holed_binlog_connection_is_noticed_shown_and_reconnected() {
    let (pool, schema) = common::routed_outbox(&binlog_url()).await;
    let url = binlog_url();
    let proxy = TcpProxy::start(port_of(&url));
    // The store's own statements go straight to the server; the binlog stream through the
    // proxy, as it would through a network that drops without a reset.
    let store =
        Arc::new(MysqlStore::binlog(pool.clone(), schema.clone(), &through(&url, &proxy)).unwrap());
    let sequencer = store.sequencer().unwrap();
    sequencer.start();
    sequencer
        .wait_until_sequenced(Duration::from_secs(20))
        .await
        .unwrap();
    // Caught up: no lag in seconds.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let before = status::read(&pool, &schema).await.unwrap();
    assert!(before.lag_seconds < 5.0, "{before:?}");

    proxy.go_silent();
    let mut conn = pool.acquire().await.unwrap();
    let seq = raw_insert(&mut conn, &schema, "k", 1).await;
    let mut progress = sequencer.progress();
    tokio::time::timeout(
        Duration::from_secs(30),
        progress.wait_for(|p| {
            p.error
                .as_deref()
                .is_some_and(|e| e.contains("sent nothing"))
        }),
    )
    .await
    .expect("the sequencer noticed the dead connection within 30 s (it waited for ever before)")
    .unwrap();
    assert!(!positioned(&pool, &schema, seq).await);
    // Its lease renewals no longer hide it: the lag in seconds grows while it cannot read.
    let stuck = status::read(&pool, &schema).await.unwrap();
    assert!(
        stuck.lag_seconds >= 5.0 && stuck.lag_bytes > Some(0),
        "{stuck:?}"
    );

    // The network comes back: it reconnects on its own and goes on from its saved position.
    proxy.open();
    sequencer
        .wait_until_positioned(seq, Duration::from_secs(30))
        .await
        .unwrap();
    sequencer.stop().await;
    drop(proxy);
    common::drop_db(&pool, &schema).await;
}

#[tokio::test]
async fn a_position_without_a_row_does_not_hide_a_row_the_binlog_did_not_carry() {
    let (pool, schema) = common::routed_outbox(&binlog_url()).await;
    let store = Arc::new(MysqlStore::binlog(pool.clone(), schema.clone(), &binlog_url()).unwrap());
    let sequencer = store.sequencer().unwrap();
    sequencer.start();
    sequencer
        .wait_until_sequenced(Duration::from_secs(20))
        .await
        .unwrap();
    // A partition no key of this test hashes to, for the position without a row.
    let empty = (0..64i16)
        .find(|p| ![part("k"), part("gone")].contains(p))
        .unwrap();
    // One transaction the binlog does not carry (a maintenance session): a row of `k`, and a
    // row that is deleted again, whose seq gets a position by hand (a row deleted after it was
    // positioned, or an unfinished group a crash left: a position without a row).
    let mut hidden = pool.acquire().await.unwrap();
    sqlx::raw_sql("SET SESSION sql_log_bin = 0; BEGIN")
        .execute(&mut *hidden)
        .await
        .unwrap();
    let unseen = raw_insert(&mut hidden, &schema, "k", 1).await;
    let gone = raw_insert(&mut hidden, &schema, "gone", 2).await;
    sqlx::query(&schema.render("DELETE FROM {schema}.outbox WHERE seq = ?"))
        .bind(gone)
        .execute(&mut *hidden)
        .await
        .unwrap();
    sqlx::query(
        &schema
            .render("INSERT INTO {schema}.outbox_sequence (seq, part, part_seq) VALUES (?, ?, 1)"),
    )
    .bind(gone)
    .bind(empty)
    .execute(&mut *hidden)
    .await
    .unwrap();
    sqlx::raw_sql("COMMIT; SET SESSION sql_log_bin = 1")
        .execute(&mut *hidden)
        .await
        .unwrap();
    drop(hidden);
    let mut progress = sequencer.progress();
    tokio::time::timeout(
        Duration::from_secs(30),
        progress.wait_for(|p| p.sequenced_below > gone),
    )
    .await
    .expect("the seal passed both rows")
    .unwrap();
    // The counts balanced (one position without a row, one row without a position): the old
    // seal raised itself past the row, which retention would then drop unrelayed.
    assert!(
        positioned(&pool, &schema, unseen).await,
        "the row the binlog did not carry was sealed without a position: lost"
    );
    // The position without a row is a stuck partition, and shown as one.
    let q = status::read(&pool, &schema).await.unwrap();
    assert_eq!(q.stuck_partitions, 1, "{q:?}");
    sequencer.stop().await;
    common::drop_db(&pool, &schema).await;
}

#[tokio::test]
async fn the_sequencer_checks_the_servers_binlog_settings_at_every_start() {
    outbox_testkit::init_test_log();
    // This machine's own server runs without a binlog, as MariaDB ships: a server the route
    // was switched on elsewhere, or restarted without its binlog since.
    let (pool, schema) = common::migrated_outbox(&common::server_url(), 4).await;
    let settings = server::settings(&pool).await.unwrap();
    assert!(
        settings.check().is_err(),
        "the server at {} must run without a row binlog for this test",
        common::server_url()
    );
    let store = MysqlStore::binlog(pool.clone(), schema.clone(), &common::server_url()).unwrap();
    let sequencer = store.sequencer().unwrap();
    sequencer.start();
    let mut progress = sequencer.progress();
    let error = tokio::time::timeout(
        Duration::from_secs(20),
        progress.wait_for(|p| p.error.is_some()),
    )
    .await
    .expect("the sequencer refused within 20 s")
    .unwrap()
    .error
    .clone()
    .unwrap();
    assert!(
        error.contains("cannot read this server") && error.contains("log_bin is OFF"),
        "{error}"
    );
    sequencer.stop().await;
    common::drop_db(&pool, &schema).await;
}

#[tokio::test]
async fn a_position_saved_on_another_server_is_made_good_like_a_purged_binlog() {
    let (pool, schema) = common::routed_outbox(&binlog_url()).await;
    let first = Arc::new(MysqlStore::binlog(pool.clone(), schema.clone(), &binlog_url()).unwrap());
    let sequencer = first.sequencer().unwrap();
    sequencer.start();
    let mut conn = pool.acquire().await.unwrap();
    let before = raw_insert(&mut conn, &schema, "k", 1).await;
    sequencer
        .wait_until_positioned(before, Duration::from_secs(20))
        .await
        .unwrap();
    sequencer.stop().await;
    let identity = server::identity(&pool).await.unwrap();
    let saved: Option<String> = sqlx::query_scalar(&schema.render(
        "SELECT CAST(server_identity AS CHAR) FROM {schema}.outbox_sequencer WHERE id = 1",
    ))
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(saved.as_deref(), Some(identity.as_str()));
    // As after a failover: the position names another server's binlog (here: an offset in a
    // file of the same name that means nothing on this one).
    // Without a GTID state saved with it (a MySQL server, an older version): from the table.
    sqlx::query(&schema.render(
        "UPDATE {schema}.outbox_sequencer SET server_identity = 'server_id:4242', \
         binlog_offset = 4, binlog_gtid = NULL WHERE id = 1",
    ))
    .execute(&pool)
    .await
    .unwrap();
    let after = raw_insert(&mut conn, &schema, "k", 2).await;
    let second = Arc::new(MysqlStore::binlog(pool.clone(), schema.clone(), &binlog_url()).unwrap());
    let sequencer = second.sequencer().unwrap();
    sequencer.start();
    sequencer
        .wait_until_positioned(after, Duration::from_secs(30))
        .await
        .unwrap();
    // The new identity is saved with the position, just after the rows' positions.
    let until = std::time::Instant::now() + Duration::from_secs(10);
    let (from_table, saved) = loop {
        let (from_table, saved): (i64, Option<String>) = sqlx::query_as(&schema.render(
            "SELECT from_table, CAST(server_identity AS CHAR) FROM {schema}.outbox_sequencer WHERE id = 1",
        ))
        .fetch_one(&pool)
        .await
        .unwrap();
        if saved.as_deref() == Some(identity.as_str()) || std::time::Instant::now() > until {
            break (from_table, saved);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        from_table, 1,
        "the row written meanwhile came from the table"
    );
    assert_eq!(saved.as_deref(), Some(identity.as_str()));
    // One position each, in order.
    let ps: Vec<i64> = sqlx::query_scalar(
        &schema.render("SELECT seq FROM {schema}.outbox_sequence WHERE part = ? ORDER BY part_seq"),
    )
    .bind(part("k"))
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(ps, vec![before, after]);
    sequencer.stop().await;
    common::drop_db(&pool, &schema).await;
}

/// The sequencer's saved identity, GTID state and rows taken from the table.
async fn saved_state(pool: &MySqlPool, schema: &Schema) -> (Option<String>, Option<String>, i64) {
    sqlx::query_as(&schema.render(
        "SELECT CAST(server_identity AS CHAR), CAST(binlog_gtid AS CHAR), from_table \
         FROM {schema}.outbox_sequencer WHERE id = 1",
    ))
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Two rows of `key` whose `seq` order is not their commit order: the lower `seq` commits
/// last. Returns (first committed, last committed).
async fn two_rows_committed_the_other_way(
    pool: &MySqlPool,
    schema: &Schema,
    key: &str,
) -> (i64, i64) {
    let mut a = pool.begin().await.unwrap();
    let low = raw_insert(&mut a, schema, key, 10).await;
    let mut b = pool.begin().await.unwrap();
    let high = raw_insert(&mut b, schema, key, 11).await;
    assert!(low < high);
    b.commit().await.unwrap();
    a.commit().await.unwrap();
    (high, low)
}

/// The positions of `key`'s partition, by `seq`, in position order.
async fn positions_of(pool: &MySqlPool, schema: &Schema, key: &str) -> Vec<i64> {
    sqlx::query_scalar(
        &schema.render("SELECT seq FROM {schema}.outbox_sequence WHERE part = ? ORDER BY part_seq"),
    )
    .bind(part(key))
    .fetch_all(pool)
    .await
    .unwrap()
}

/// Runs a sequencer until `seqs` are positioned, then until the server's identity is saved.
async fn sequence_until(
    pool: &MySqlPool,
    schema: &Schema,
    seqs: &[i64],
) -> (Option<String>, Option<String>, i64) {
    let store = Arc::new(MysqlStore::binlog(pool.clone(), schema.clone(), &binlog_url()).unwrap());
    let sequencer = store.sequencer().unwrap();
    sequencer.start();
    for seq in seqs {
        sequencer
            .wait_until_positioned(*seq, Duration::from_secs(30))
            .await
            .unwrap();
    }
    let identity = server::identity(pool).await.unwrap();
    let until = std::time::Instant::now() + Duration::from_secs(10);
    let state = loop {
        let state = saved_state(pool, schema).await;
        if state.0.as_deref() == Some(identity.as_str()) || std::time::Instant::now() > until {
            break state;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    sequencer.stop().await;
    state
}

#[tokio::test]
async fn a_position_saved_on_another_server_resumes_by_gtid_in_commit_order() {
    let (pool, schema) = common::routed_outbox(&binlog_url()).await;
    let mut conn = pool.acquire().await.unwrap();
    let before = raw_insert(&mut conn, &schema, "k", 1).await;
    let (_, gtid, _) = sequence_until(&pool, &schema, &[before]).await;
    let gtid = gtid.expect("MariaDB's GTID state is saved with the position");
    assert!(gtid.split('-').count() >= 3, "a GTID state: {gtid}");
    // As after a failover to a replica (`log_slave_updates`): the position names another
    // server's binlog, the GTID state the same transactions, which this server holds.
    sqlx::query(&schema.render(
        "UPDATE {schema}.outbox_sequencer SET server_identity = 'server_id:4242', \
         binlog_offset = 4 WHERE id = 1",
    ))
    .execute(&pool)
    .await
    .unwrap();
    let (first, last) = two_rows_committed_the_other_way(&pool, &schema, "k").await;
    let identity = server::identity(&pool).await.unwrap();
    let (saved, gtid_after, from_table) = sequence_until(&pool, &schema, &[first, last]).await;
    assert_eq!(saved.as_deref(), Some(identity.as_str()));
    assert_eq!(
        from_table, 0,
        "nothing came from the table: the binlog was read on by GTID"
    );
    assert_ne!(
        gtid_after.as_deref(),
        Some(gtid.as_str()),
        "the GTID state moved on"
    );
    assert_eq!(
        positions_of(&pool, &schema, "k").await,
        vec![before, first, last],
        "one position each, in commit order (not seq order)"
    );
    common::drop_db(&pool, &schema).await;
}

#[tokio::test]
async fn a_gtid_state_the_server_lacks_is_made_good_from_the_table() {
    let (pool, schema) = common::routed_outbox(&binlog_url()).await;
    let mut conn = pool.acquire().await.unwrap();
    let before = raw_insert(&mut conn, &schema, "k", 1).await;
    sequence_until(&pool, &schema, &[before]).await;
    // A diverged or purged history: a transaction of a server this one never had.
    sqlx::query(&schema.render(
        "UPDATE {schema}.outbox_sequencer SET server_identity = 'server_id:4242', \
         binlog_offset = 4, binlog_gtid = '0-4242-999999999' WHERE id = 1",
    ))
    .execute(&pool)
    .await
    .unwrap();
    let after = raw_insert(&mut conn, &schema, "k", 2).await;
    let identity = server::identity(&pool).await.unwrap();
    let (saved, _, from_table) = sequence_until(&pool, &schema, &[after]).await;
    assert_eq!(saved.as_deref(), Some(identity.as_str()));
    assert_eq!(
        from_table, 1,
        "the server refused the GTID state: the row came from the table"
    );
    assert_eq!(positions_of(&pool, &schema, "k").await, vec![before, after]);
    common::drop_db(&pool, &schema).await;
}

#[tokio::test]
async fn a_restart_while_an_xa_transaction_is_prepared_positions_every_row_once() {
    // A prepared XA transaction outlives its session and holds every binlog seal on the
    // server: whatever happens in the body, it is not left behind.
    let outcome =
        futures::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(xa_restart_body())).await;
    let pool = sqlx::mysql::MySqlPoolOptions::new()
        .connect(&binlog_url())
        .await
        .unwrap();
    // Committed already is an error here, and that is fine.
    let _ = sqlx::raw_sql("XA ROLLBACK 'held'").execute(&pool).await;
    if let Err(e) = outcome {
        std::panic::resume_unwind(e);
    }
}

async fn xa_restart_body() {
    let (pool, schema) = common::routed_outbox(&binlog_url()).await;
    let first = Arc::new(MysqlStore::binlog(pool.clone(), schema.clone(), &binlog_url()).unwrap());
    let sequencer = first.sequencer().unwrap();
    sequencer.start();
    sequencer
        .wait_until_sequenced(Duration::from_secs(20))
        .await
        .unwrap();
    let mut xa = pool.acquire().await.unwrap();
    let mut plain = pool.acquire().await.unwrap();
    sqlx::raw_sql("XA START 'held'")
        .execute(&mut *xa)
        .await
        .unwrap();
    let prepared = raw_insert(&mut xa, &schema, "a", 1).await;
    sqlx::raw_sql("XA END 'held'; XA PREPARE 'held'")
        .execute(&mut *xa)
        .await
        .unwrap();
    // Committed after the prepare: positioned now, while the saved position stays before the
    // prepared group.
    let mut after = Vec::new();
    for n in 2..5 {
        after.push(raw_insert(&mut plain, &schema, "b", n).await);
    }
    for seq in &after {
        sequencer
            .wait_until_positioned(*seq, Duration::from_secs(20))
            .await
            .unwrap();
    }
    assert!(!positioned(&pool, &schema, prepared).await);
    // A restart: the stream reads again from before the prepared group.
    sequencer.stop().await;
    let second = Arc::new(MysqlStore::binlog(pool.clone(), schema.clone(), &binlog_url()).unwrap());
    let sequencer = second.sequencer().unwrap();
    sequencer.start();
    sqlx::raw_sql("XA COMMIT 'held'")
        .execute(&mut *xa)
        .await
        .unwrap();
    let last = raw_insert(&mut plain, &schema, "b", 5).await;
    sequencer
        .wait_until_positioned(prepared, Duration::from_secs(30))
        .await
        .unwrap();
    sequencer
        .wait_until_positioned(last, Duration::from_secs(30))
        .await
        .unwrap();
    // Every row once; key b in commit order.
    let counts: Vec<(i64, i64)> = sqlx::query_as(&schema.render(
        "SELECT seq, COUNT(*) FROM {schema}.outbox_sequence GROUP BY seq HAVING COUNT(*) > 1",
    ))
    .fetch_all(&pool)
    .await
    .unwrap();
    assert!(counts.is_empty(), "rows positioned twice: {counts:?}");
    let b: Vec<i64> = sqlx::query_scalar(
        &schema.render("SELECT seq FROM {schema}.outbox_sequence WHERE part = ? ORDER BY part_seq"),
    )
    .bind(part("b"))
    .fetch_all(&pool)
    .await
    .unwrap();
    let mut want = after.clone();
    want.push(last);
    assert_eq!(b, want);
    sequencer.stop().await;
    common::drop_db(&pool, &schema).await;
}

#[tokio::test]
async fn a_failover_while_an_xa_transaction_is_prepared_resumes_by_gtid() {
    // A prepared XA transaction outlives its session and holds every binlog seal on the
    // shared server: whatever happens in the body, it is not left behind.
    let xid = format!("m1held{:08x}", fastrand::u32(..));
    let outcome =
        futures::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(xa_failover_body(&xid)))
            .await;
    let pool = sqlx::mysql::MySqlPoolOptions::new()
        .connect(&binlog_url())
        .await
        .unwrap();
    // Committed already is an error here, and that is fine.
    let _ = sqlx::raw_sql(&format!("XA ROLLBACK '{xid}'"))
        .execute(&pool)
        .await;
    if let Err(e) = outcome {
        std::panic::resume_unwind(e);
    }
}

async fn xa_failover_body(xid: &str) {
    let (pool, schema) = common::routed_outbox(&binlog_url()).await;
    let first = Arc::new(MysqlStore::binlog(pool.clone(), schema.clone(), &binlog_url()).unwrap());
    let sequencer = first.sequencer().unwrap();
    sequencer.start();
    sequencer
        .wait_until_sequenced(Duration::from_secs(20))
        .await
        .unwrap();
    let mut xa = pool.acquire().await.unwrap();
    let mut plain = pool.acquire().await.unwrap();
    sqlx::raw_sql(&format!("XA START '{xid}'"))
        .execute(&mut *xa)
        .await
        .unwrap();
    let prepared = raw_insert(&mut xa, &schema, "a", 1).await;
    sqlx::raw_sql(&format!("XA END '{xid}'; XA PREPARE '{xid}'"))
        .execute(&mut *xa)
        .await
        .unwrap();
    let mut after = Vec::new();
    for n in 2..5 {
        after.push(raw_insert(&mut plain, &schema, "b", n).await);
    }
    for seq in &after {
        sequencer
            .wait_until_positioned(*seq, Duration::from_secs(20))
            .await
            .unwrap();
    }
    // Saved while the prepared group is held: the GTID state before it, with the position.
    let until = std::time::Instant::now() + Duration::from_secs(10);
    let gtid = loop {
        let (_, gtid, _) = saved_state(&pool, &schema).await;
        if gtid.is_some() || std::time::Instant::now() > until {
            break gtid;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    sequencer.stop().await;
    assert!(
        gtid.is_some(),
        "a GTID state is saved while an XA transaction is held"
    );
    // The failover: the position names another server's binlog.
    sqlx::query(&schema.render(
        "UPDATE {schema}.outbox_sequencer SET server_identity = 'server_id:4242', \
         binlog_offset = 4 WHERE id = 1",
    ))
    .execute(&pool)
    .await
    .unwrap();
    sqlx::raw_sql(&format!("XA COMMIT '{xid}'"))
        .execute(&mut *xa)
        .await
        .unwrap();
    let last = raw_insert(&mut plain, &schema, "b", 5).await;
    let (_, _, from_table) = sequence_until(&pool, &schema, &[prepared, last]).await;
    assert_eq!(from_table, 0, "read on by GTID, nothing from the table");
    let twice: Vec<(i64, i64)> = sqlx::query_as(&schema.render(
        "SELECT seq, COUNT(*) FROM {schema}.outbox_sequence GROUP BY seq HAVING COUNT(*) > 1",
    ))
    .fetch_all(&pool)
    .await
    .unwrap();
    assert!(twice.is_empty(), "rows positioned twice: {twice:?}");
    let mut want = after.clone();
    want.push(last);
    assert_eq!(positions_of(&pool, &schema, "b").await, want);
    assert_eq!(positions_of(&pool, &schema, "a").await, vec![prepared]);
    common::drop_db(&pool, &schema).await;
}
