//! The binlog stream over TLS, against a real MariaDB that takes TLS connections only
//! (`require_secure_transport`) and keeps the row binlog: scripts/services.sh starts one on
//! 127.0.0.1:3312 (`OUTBOX_TEST_MYSQL_BINLOG_TLS_PORT` names another port), with the test CA's
//! server certificate (scripts/tls-certs.sh) and a user, `outbox_cert`, that logs in by its
//! client certificate (`REQUIRE SUBJECT '/CN=outbox_cert'`, no password). The binlog stream
//! takes the pool's URL options: `ssl-mode`, `ssl-ca`, `ssl-cert`, `ssl-key`.

#![allow(clippy::unwrap_used)] // tests

use std::sync::Arc;
use std::time::{Duration, Instant};

use outbox_core::{ClaimLimits, MemberId, OnFailed, Store};
use outbox_mysql::binlog::{server, BinlogReader, Item, ReadError, ReadOptions};
use outbox_mysql::{MysqlStore, Schema};
use sqlx::MySqlPool;

mod common;

fn tls_dir() -> String {
    std::env::var("OUTBOX_TLS_DIR").unwrap_or_else(|_| "/var/tmp/outbox-tls".into())
}

fn port() -> String {
    std::env::var("OUTBOX_TEST_MYSQL_BINLOG_TLS_PORT").unwrap_or_else(|_| "3312".into())
}

/// `outbox_cert` with VERIFY_IDENTITY against `ca`, by its client certificate (an EC key); `password`
/// adds one (the user has none, so it is wrong) to show it never reaches an error.
fn url(ca: &str, password: bool) -> String {
    let d = tls_dir();
    let user = if password {
        "outbox_cert:hunter2"
    } else {
        "outbox_cert"
    };
    format!(
        "mysql://{user}@localhost:{}/test?ssl-mode=VERIFY_IDENTITY&ssl-ca={d}/{ca}\
         &ssl-cert={d}/client.pem&ssl-key={d}/client.key",
        port()
    )
}

fn good_url() -> String {
    url("ca.pem", false)
}

/// An outbox of its own on the TLS server, migrated over TLS, the binlog route on.
async fn raw_insert(pool: &MySqlPool, schema: &Schema, key: &str, n: u64) {
    sqlx::query(&schema.render(
        "INSERT INTO {schema}.outbox (aggregate_type, aggregate_id, event_type, payload) \
         VALUES ('order', ?, 'placed', JSON_OBJECT('n', ?))",
    ))
    .bind(key)
    .bind(n)
    .execute(pool)
    .await
    .unwrap();
}

/// Who reads the binlog from this server now: the users of its `Binlog Dump` sessions.
async fn binlog_readers(pool: &MySqlPool) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT CAST(USER AS CHAR) FROM information_schema.PROCESSLIST \
         WHERE COMMAND LIKE 'Binlog Dump%'",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn the_binlog_route_relays_over_tls_with_verify_identity_and_a_client_certificate() {
    let (pool, schema) = common::routed_outbox(&good_url()).await;
    let store = Arc::new(MysqlStore::binlog(pool.clone(), schema.clone(), &good_url()).unwrap());
    let sequencer = store.sequencer().unwrap();
    sequencer.start();
    sequencer
        .wait_until_sequenced(Duration::from_secs(20))
        .await
        .unwrap();
    // The server takes no plaintext: a session reading its binlog is a TLS one, and its user
    // (`REQUIRE SUBJECT`) logged in by the client certificate.
    assert!(
        binlog_readers(&pool)
            .await
            .contains(&"outbox_cert".to_string()),
        "no binlog session of outbox_cert"
    );
    for n in 0..60u64 {
        raw_insert(&pool, &schema, &format!("k{}", n % 3), n).await;
    }
    let got = common::drain(&store, 60).await;
    let mut ns: Vec<u64> = got.iter().map(common::n_of).collect();
    // Per key, in the order written (commit order, from the binlog over TLS).
    for key in ["k0", "k1", "k2"] {
        let of_key: Vec<u64> = got
            .iter()
            .filter(|m| m.aggregate_id == key)
            .map(common::n_of)
            .collect();
        assert!(of_key.windows(2).all(|w| w[0] < w[1]), "{key}: {of_key:?}");
    }
    ns.sort_unstable();
    assert_eq!(ns, (0..60).collect::<Vec<_>>());
    sequencer.stop().await;
    common::drop_db(&pool, &schema).await;
}

#[tokio::test]
async fn the_reader_reads_committed_rows_over_tls() {
    let (pool, schema) = common::migrated_outbox(&good_url(), 2).await;
    let start = server::end_position(&pool).await.unwrap();
    let mut reader = BinlogReader::open(&good_url(), &schema, &start, &ReadOptions::default())
        .await
        .unwrap();
    raw_insert(&pool, &schema, "a", 1).await;
    let until = Instant::now() + Duration::from_secs(10);
    let committed = loop {
        assert!(Instant::now() < until, "no transaction came over TLS");
        match reader.next().await.unwrap() {
            Item::Committed(c) => break c,
            Item::Idle(_) => {}
        }
    };
    assert_eq!(committed.rows.len(), 1);
    assert_eq!(committed.rows[0].aggregate_id, "a");
    drop(reader);
    common::drop_db(&pool, &schema).await;
}

/// The error opening the binlog stream at `url` gives, as text.
async fn open_error(url: &str, schema: &Schema, pool: &MySqlPool) -> String {
    let start = server::end_position(pool).await.unwrap();
    match BinlogReader::open(url, schema, &start, &ReadOptions::default()).await {
        Ok(_) => panic!("{url} opened"),
        Err(ReadError::Other(e)) => e.to_string(),
        Err(e) => panic!("{url}: {e}"),
    }
}

#[tokio::test]
async fn a_wrong_ca_is_refused_with_the_cause_and_what_to_do_and_no_secret() {
    let (pool, schema) = common::routed_outbox(&good_url()).await;
    let wrong = url("other-ca.pem", true);
    let e = open_error(&wrong, &schema, &pool).await;
    assert!(e.contains("TLS handshake failed"), "{e}");
    assert!(e.to_lowercase().contains("unknownissuer"), "{e}");
    assert!(e.contains("check that ssl-ca is the CA"), "{e}");
    assert!(!e.contains("hunter2"), "{e}");

    // Relayed through the sequencer: nothing is positioned, so the row stays pending, and the
    // sequencer's error says why.
    let store = Arc::new(MysqlStore::binlog(pool.clone(), schema.clone(), &wrong).unwrap());
    raw_insert(&pool, &schema, "a", 1).await;
    let sequencer = store.sequencer().unwrap();
    sequencer.start();
    let e = sequencer
        .wait_until_sequenced(Duration::from_secs(4))
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("TLS handshake failed"), "{e}");
    assert!(!e.contains("hunter2"), "{e}");
    let member = MemberId::random("m");
    let parts = store
        .rebalance(&member, Duration::from_secs(30))
        .await
        .unwrap();
    let batch = store
        .claim(&member, &parts, ClaimLimits::rows(10), OnFailed::Block)
        .await
        .unwrap();
    assert!(batch.is_empty(), "a row came without the binlog: {batch:?}");
    let pending: i64 = sqlx::query_scalar(&schema.render("SELECT COUNT(*) FROM {schema}.outbox"))
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(pending, 1);
    sequencer.stop().await;
    common::drop_db(&pool, &schema).await;
}

#[tokio::test]
async fn plaintext_is_refused_by_the_server() {
    let (pool, schema) = common::migrated_outbox(&good_url(), 2).await;
    for user in ["outbox_cert", "root"] {
        let plain = format!("mysql://{user}@127.0.0.1:{}/test?ssl-mode=DISABLED", port());
        let e = open_error(&plain, &schema, &pool).await;
        // MariaDB refuses a plaintext login under require_secure_transport as a denied access.
        assert!(e.contains("Access denied"), "{e}");
        assert!(e.contains("require_secure_transport"), "{e}");
    }
    common::drop_db(&pool, &schema).await;
}

#[tokio::test]
async fn preferred_upgrades_when_the_server_offers_tls() {
    let (pool, schema) = common::migrated_outbox(&good_url(), 2).await;
    // root has no certificate requirement: only TLS lets it in here, and PREFERRED (the
    // default, as the pool's) takes it since the server offers it.
    for query in ["?ssl-mode=PREFERRED", ""] {
        let preferred = format!("mysql://root@127.0.0.1:{}/test{query}", port());
        let start = server::end_position(&pool).await.unwrap();
        BinlogReader::open(&preferred, &schema, &start, &ReadOptions::default())
            .await
            .unwrap();
    }
    common::drop_db(&pool, &schema).await;
}

#[tokio::test]
async fn required_is_refused_by_a_server_without_tls() {
    // The MariaDB with the row binlog on 3307 has no TLS.
    let plain_server = std::env::var("OUTBOX_TEST_MYSQL_BINLOG_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3307/test".into());
    let (pool, schema) = common::migrated_outbox(&plain_server, 2).await;
    let e = open_error(&format!("{plain_server}?ssl-mode=REQUIRED"), &schema, &pool).await;
    assert!(e.contains("offers no TLS"), "{e}");
    assert!(e.contains("ssl-mode=REQUIRED"), "{e}");
    common::drop_db(&pool, &schema).await;
}

#[tokio::test]
async fn without_the_client_certificate_the_server_refuses_the_user() {
    let (pool, schema) = common::migrated_outbox(&good_url(), 2).await;
    let d = tls_dir();
    let no_cert = format!(
        "mysql://outbox_cert:hunter2@localhost:{}/test?ssl-mode=VERIFY_IDENTITY&ssl-ca={d}/ca.pem",
        port()
    );
    let e = open_error(&no_cert, &schema, &pool).await;
    assert!(e.contains("Access denied for user 'outbox_cert'"), "{e}");
    assert!(!e.contains("hunter2"), "{e}");
    common::drop_db(&pool, &schema).await;
}
