//! The store and the writers run as users with exactly the grants docs/engine-mysql.md lists
//! ("Least privileges"), on the binlog route of the MariaDB with the row binlog
//! (127.0.0.1:3307): the relay (claims, records, the sequencer with its binlog stream and seal,
//! maintenance, status) and a writer that may only insert; and the operator, who runs `outbox
//! migrate` (creating the database) on a server without a binlog and `outbox migrate --binlog`
//! on the one with it. The users are made for the test and dropped after.

#![allow(clippy::unwrap_used)] // tests

use std::time::{Duration, Instant};

use outbox_core::{ClaimLimits, MemberId, OnFailed, Outcome, Store};
use outbox_mysql::binlog::route;
use outbox_mysql::{connect_pool, MysqlStore};

mod common;

fn binlog_url() -> String {
    std::env::var("OUTBOX_TEST_MYSQL_BINLOG_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3307/test".into())
}

/// The grants of docs/engine-mysql.md, "Least privileges", with `{db}` and `{user}`.
const RELAY: &[&str] = &[
    "GRANT SELECT, INSERT, UPDATE, DELETE, ALTER, DROP ON {db}.* TO {user}",
    "GRANT PROCESS, REPLICATION SLAVE, BINLOG MONITOR ON *.* TO {user}",
];
const WRITER: &[&str] = &[
    "GRANT INSERT ON {db}.outbox TO {user}",
    // The writer API's batch over several keys locks their position counters first.
    "GRANT SELECT ON {db}.outbox_part_seq TO {user}",
];
const OPERATOR: &[&str] = &[
    "GRANT CREATE, ALTER, DROP, INDEX, TRIGGER, CREATE VIEW, SELECT, INSERT, UPDATE, DELETE \
     ON {db}.* TO {user}",
];
/// `outbox migrate --binlog` beside [`OPERATOR`].
const OPERATOR_BINLOG: &[&str] = &["GRANT BINLOG MONITOR ON *.* TO {user}"];
/// Where the server writes a binlog and does not trust function creators: `CREATE TRIGGER`.
const OPERATOR_BINLOG_ON: &[&str] = &["GRANT SUPER ON *.* TO {user}"];

/// Creates `'name'@'127.0.0.1'` holding `grants` on database `db` (which need not exist yet).
async fn user_with(root: &sqlx::MySqlPool, name: &str, db: &str, grants: &[&[&str]]) -> String {
    let user = format!("'{name}'@'127.0.0.1'");
    sqlx::raw_sql(&format!("CREATE USER {user} IDENTIFIED BY 'pw-test-only'"))
        .execute(root)
        .await
        .unwrap();
    for g in grants.iter().flat_map(|g| g.iter()) {
        let sql = g.replace("{db}", db).replace("{user}", &user);
        sqlx::raw_sql(&sql).execute(root).await.unwrap();
    }
    user
}

/// `url` as `user` with no database: the operator's migration creates it.
fn no_database_as(url: &str, user: &str) -> String {
    let rest = url.split_once('@').unwrap().1;
    let host = rest.split('/').next().unwrap();
    format!("mysql://{user}:pw-test-only@{host}/")
}

/// The operator on `url`'s server: `outbox migrate` (and with `binlog`, `--binlog`) on a database
/// that does not exist yet, then again (nothing to do), as a user holding exactly the
/// documented grants. Returns whether the server needed the `SUPER` line.
async fn operator_migrates(url: &str, binlog: bool) -> bool {
    let root = connect_pool(url, 2).await.unwrap();
    let (log_bin, trusted): (i64, i64) = sqlx::query_as(
        "SELECT CAST(@@log_bin AS SIGNED), CAST(@@log_bin_trust_function_creators AS SIGNED)",
    )
    .fetch_one(&root)
    .await
    .unwrap();
    let binlog_on = log_bin == 1 && trusted == 0;
    let schema = outbox_mysql::Schema::new(&outbox_testkit::unique_name("outbox")).unwrap();
    let name = format!("operator_{:08x}", fastrand::u32(..));
    let mut grants = vec![OPERATOR];
    if binlog {
        grants.push(OPERATOR_BINLOG);
    }
    if binlog_on {
        grants.push(OPERATOR_BINLOG_ON);
    }
    let user = user_with(&root, &name, schema.as_str(), &grants).await;
    let operator = connect_pool(&no_database_as(url, &name), 2).await.unwrap();
    assert_eq!(
        outbox_mysql::migrate(&operator, &schema).await.unwrap(),
        vec![1, 2, 3, 4],
        "the operator creates the database and applies every migration"
    );
    if binlog {
        route::enable(&operator, &schema).await.unwrap();
        assert!(route::is_on(&operator, &schema).await.unwrap());
    }
    // Again, as every deploy runs it: nothing to apply, nothing refused.
    assert!(outbox_mysql::migrate(&operator, &schema)
        .await
        .unwrap()
        .is_empty());
    if binlog {
        route::enable(&operator, &schema).await.unwrap();
    }
    outbox_mysql::check_schema(&operator, &schema)
        .await
        .unwrap();
    operator.close().await;
    sqlx::raw_sql(&format!("DROP USER {user}"))
        .execute(&root)
        .await
        .unwrap();
    sqlx::raw_sql(&schema.render("DROP DATABASE {schema}"))
        .execute(&root)
        .await
        .unwrap();
    binlog_on
}

#[tokio::test]
async fn the_operator_migrates_with_exactly_the_documented_grants() {
    outbox_testkit::init_test_log();
    // This machine's MariaDB writes no binlog: no SUPER line.
    let needed_super = operator_migrates(&common::server_url(), false).await;
    assert!(!needed_super || std::env::var("OUTBOX_TEST_MYSQL_URL").is_ok());
}

#[tokio::test]
async fn the_operator_turns_the_binlog_route_on_with_exactly_the_documented_grants() {
    outbox_testkit::init_test_log();
    // The row binlog is on there and function creators are not trusted: the SUPER line is
    // what `CREATE TRIGGER` (migration 1) needs.
    let needed_super = operator_migrates(&binlog_url(), true).await;
    assert!(needed_super || std::env::var("OUTBOX_TEST_MYSQL_BINLOG_URL").is_ok());
}

/// `binlog_url()` as `user` with `password`, in database `db`.
fn url_as(user: &str, password: &str, db: &str) -> String {
    let url = binlog_url();
    let rest = url.split_once('@').unwrap().1;
    let host = rest.split('/').next().unwrap();
    format!("mysql://{user}:{password}@{host}/{db}")
}

#[tokio::test]
async fn the_relay_and_a_writer_run_with_exactly_the_documented_grants() {
    outbox_testkit::init_test_log();
    let (root, schema) = common::migrated_outbox(&binlog_url(), 4).await;
    route::enable(&root, &schema).await.unwrap();
    let suffix = fastrand::u32(..);
    let relay = format!("'relay_{suffix:08x}'@'127.0.0.1'");
    let writer = format!("'writer_{suffix:08x}'@'127.0.0.1'");
    for (user, grants) in [(&relay, RELAY), (&writer, WRITER)] {
        sqlx::raw_sql(&format!("CREATE USER {user} IDENTIFIED BY 'pw-test-only'"))
            .execute(&root)
            .await
            .unwrap();
        for g in grants {
            let sql = g.replace("{db}", schema.as_str()).replace("{user}", user);
            sqlx::raw_sql(&sql).execute(&root).await.unwrap();
        }
    }
    let relay_url = url_as(
        &format!("relay_{suffix:08x}"),
        "pw-test-only",
        schema.as_str(),
    );
    let writer_url = url_as(
        &format!("writer_{suffix:08x}"),
        "pw-test-only",
        schema.as_str(),
    );

    // The writer: a plain insert, nothing else.
    let writes = connect_pool(&writer_url, 2).await.unwrap();
    for n in 0..40u64 {
        sqlx::query(&schema.render(
            "INSERT INTO {schema}.outbox (aggregate_type, aggregate_id, event_type, payload) \
             VALUES ('order', ?, 'placed', JSON_OBJECT('n', ?))",
        ))
        .bind(format!("k{}", n % 5))
        .bind(n)
        .execute(&writes)
        .await
        .unwrap();
    }

    // The relay: the sequencer, claims and records, maintenance, status.
    let pool = connect_pool(&relay_url, 4).await.unwrap();
    let store = MysqlStore::binlog(pool.clone(), schema.clone(), &relay_url).unwrap();
    let member = MemberId::random("grants");
    let until = Instant::now() + Duration::from_secs(30);
    let mut got = 0;
    while got < 40 {
        assert!(
            Instant::now() < until,
            "only {got} of 40 came; sequencer: {:?}",
            store.sequencer().unwrap().progress().borrow().error
        );
        let parts = store
            .rebalance(&member, Duration::from_secs(30))
            .await
            .unwrap();
        let batch = store
            .claim(&member, &parts, ClaimLimits::rows(100), OnFailed::Block)
            .await
            .unwrap();
        if batch.is_empty() {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        }
        let outcomes: Vec<Outcome> = batch
            .iter()
            .map(|m| Outcome::Published { seq: m.seq })
            .collect();
        store.complete(&member, &outcomes).await.unwrap();
        got += batch.len();
    }
    store.maintain(Duration::ZERO).await.unwrap();
    store.stats().await.unwrap();
    let g = store.gauges().await.unwrap();
    assert!(g.binlog_sequencer.is_some_and(|q| q.leased));
    // The seal (PROCESS: the transactions writing now) moves on as this user too.
    let mut progress = store.sequencer().unwrap().progress();
    let next: i64 = sqlx::query_scalar(
        "SELECT CAST(AUTO_INCREMENT AS SIGNED) FROM information_schema.TABLES WHERE TABLE_SCHEMA = ? AND TABLE_NAME = 'outbox'",
    )
    .bind(schema.as_str())
    .fetch_one(&root)
    .await
    .unwrap();
    tokio::time::timeout(
        Duration::from_secs(30),
        progress.wait_for(|p| p.sequenced_below >= next),
    )
    .await
    .expect("the seal closed as the relay user")
    .unwrap();
    store.release(&member).await.unwrap();
    for user in [&relay, &writer] {
        sqlx::raw_sql(&format!("DROP USER {user}"))
            .execute(&root)
            .await
            .unwrap();
    }
    sqlx::raw_sql(&schema.render("DROP DATABASE {schema}"))
        .execute(&root)
        .await
        .unwrap();
}

/// The writer API's batch over several keys takes their partitions' position counters first
/// (`SELECT … FROM outbox_part_seq … FOR UPDATE`, so two batches never deadlock): a writer with
/// the documented grants must be able to, on either route.
#[tokio::test]
async fn a_writer_with_the_documented_grants_enqueues_a_batch_over_several_keys() {
    outbox_testkit::init_test_log();
    for (url, binlog) in [(common::server_url(), false), (binlog_url(), true)] {
        let (root, schema) = common::migrated_outbox(&url, 2).await;
        if binlog {
            route::enable(&root, &schema).await.unwrap();
        }
        let name = format!("writer_{:08x}", fastrand::u32(..));
        let user = user_with(&root, &name, schema.as_str(), &[WRITER]).await;
        let writes = connect_pool(&url_on(&url, &name, schema.as_str()), 2)
            .await
            .unwrap();
        let batch: Vec<_> = (0..6u64)
            .map(|n| common::msg(&format!("k{n}"), n))
            .collect();
        let mut tx = writes.begin().await.unwrap();
        outbox_mysql::enqueue_many(&mut tx, &schema, &batch)
            .await
            .unwrap_or_else(|e| panic!("binlog route {binlog}: {e}"));
        tx.commit().await.unwrap();
        let n: i64 = sqlx::query_scalar(&schema.render("SELECT COUNT(*) FROM {schema}.outbox"))
            .fetch_one(&root)
            .await
            .unwrap();
        assert_eq!(n, 6, "binlog route {binlog}");
        writes.close().await;
        sqlx::raw_sql(&format!("DROP USER {user}"))
            .execute(&root)
            .await
            .unwrap();
        sqlx::raw_sql(&schema.render("DROP DATABASE {schema}"))
            .execute(&root)
            .await
            .unwrap();
    }
}

/// `url` as `user` (password `pw-test-only`) in database `db`.
fn url_on(url: &str, user: &str, db: &str) -> String {
    let rest = url.split_once('@').unwrap().1;
    let host = rest.split('/').next().unwrap();
    format!("mysql://{user}:pw-test-only@{host}/{db}")
}
