//! The store and the writers run as users with exactly the grants docs/engine-mysql.md lists
//! ("Least privileges"), on the binlog route of the MariaDB with the row binlog
//! (127.0.0.1:3307): the relay (claims, records, the sequencer with its binlog stream and seal,
//! maintenance, status) and a writer that may only insert. The users are made for the test and
//! dropped after.

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
const WRITER: &[&str] = &["GRANT INSERT ON {db}.outbox TO {user}"];

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
