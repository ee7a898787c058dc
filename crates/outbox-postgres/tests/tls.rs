//! TLS and client-certificate authentication against the real PostgreSQL, configured by
//! scripts/services.sh as production is: `ssl=on` with a certificate of the test CA
//! (scripts/tls-certs.sh), and a `hostssl … cert` line for the user `outbox_cert`, who has no
//! password. The pool and the CDC replication stream must both use the URL's TLS settings.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use common::{database_url, msg, setup, teardown};
use outbox_core::{ClaimLimits, MemberId, OnFailed, Store};
use outbox_postgres::cdc::setup::{drop_cdc, migrate_cdc};
use outbox_postgres::cdc::{CdcNames, CdcStore};
use outbox_postgres::{connect_pool, Writer};
use sqlx::PgPool;

fn tls_dir() -> String {
    std::env::var("OUTBOX_TLS_DIR").unwrap_or_else(|_| "/var/tmp/outbox-tls".into())
}

/// `outbox_cert`, verify-full against the test CA, authenticated by its client certificate.
fn cert_url() -> String {
    let d = tls_dir();
    format!(
        "postgres://outbox_cert@localhost:5432/test?sslmode=verify-full&sslrootcert={d}/ca.pem\
         &sslcert={d}/client.pem&sslkey={d}/client.key"
    )
}

/// Whether the session `pid` is encrypted, and as whom.
async fn session_tls(pool: &PgPool, pid: i32) -> (bool, String) {
    sqlx::query_as(
        "SELECT s.ssl, a.usename::text FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
         WHERE pid = $1",
    )
    .bind(pid)
    .fetch_one(pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn the_pool_connects_with_verify_full_and_a_client_certificate() {
    let pool = connect_pool(&cert_url(), 2).await.unwrap();
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(session_tls(&pool, pid).await, (true, "outbox_cert".into()));
}

#[tokio::test]
async fn a_wrong_ca_or_a_missing_certificate_is_one_clear_error_without_the_password() {
    let d = tls_dir();
    let wrong_ca = format!(
        "postgres://outbox_cert:hunter2@localhost:5432/test?sslmode=verify-full\
         &sslrootcert={d}/other-ca.pem&sslcert={d}/client.pem&sslkey={d}/client.key"
    );
    let e = connect_pool(&wrong_ca, 1).await.unwrap_err().to_string();
    assert!(!e.contains("hunter2"), "{e}");
    assert!(e.to_lowercase().contains("certificate"), "{e}");
    let no_cert = format!(
        "postgres://outbox_cert:hunter2@localhost:5432/test?sslmode=verify-full&sslrootcert={d}/ca.pem"
    );
    let e = connect_pool(&no_cert, 1).await.unwrap_err().to_string();
    assert!(!e.contains("hunter2"), "{e}");
    assert!(e.contains("valid client certificate"), "{e}");
}

/// The replication session of `slot`, once it is up: whether it is encrypted, and as whom.
async fn replication_tls(pool: &PgPool, slot: &str) -> (bool, String) {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let pid: Option<i32> =
            sqlx::query_scalar("SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1")
                .bind(slot)
                .fetch_one(pool)
                .await
                .unwrap();
        if let Some(pid) = pid {
            return session_tls(pool, pid).await;
        }
        assert!(Instant::now() < until, "the stream never took its slot");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Opens a CDC store on `url`, writes one message, claims it (which starts the stream) and
/// returns how the replication session is secured.
async fn stream_over(url: &str, tag: &str) -> (bool, String) {
    let (pool, schema, _) = setup(tag).await;
    let names = CdcNames::new(&schema, "relay").unwrap();
    migrate_cdc(&pool, &names).await.unwrap();
    let store = CdcStore::new(connect_pool(url, 2).await.unwrap(), url, names.clone())
        .await
        .unwrap();
    let mut tx = pool.begin().await.unwrap();
    Writer::new(&schema)
        .enqueue(&mut tx, &msg("k", 1))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let m = MemberId::random("tls-test");
    let until = Instant::now() + Duration::from_secs(20);
    while store
        .claim(&m, &[], ClaimLimits::rows(100), OnFailed::Block)
        .await
        .unwrap_or_default()
        .is_empty()
    {
        assert!(Instant::now() < until, "nothing came through the stream");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let seen = replication_tls(&pool, &names.slot).await;
    drop(store);
    for _ in 0..50 {
        if drop_cdc(&pool, &names).await.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    teardown(&pool, &schema).await;
    seen
}

#[tokio::test]
async fn the_replication_stream_uses_the_urls_certificates() {
    assert_eq!(
        stream_over(&cert_url(), "tls_cdc_cert").await,
        (true, "outbox_cert".into())
    );
}

/// `sslmode=prefer`, libpq's and sqlx's default: the pool encrypts when the server offers TLS,
/// and so must the stream. It streamed the WAL in plaintext before (seen failing: `false`).
#[tokio::test]
async fn prefer_streams_over_tls_when_the_server_offers_it() {
    let url = database_url();
    let (encrypted, _) = stream_over(&url, "tls_cdc_prefer").await;
    assert!(
        encrypted,
        "the replication stream of {url} is not encrypted"
    );
}
