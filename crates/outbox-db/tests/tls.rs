//! MySQL/MariaDB over TLS for the pool: a MariaDB that takes TLS connections only
//! (`require_secure_transport`, scripts/services.sh on 127.0.0.1:3308) and a user that logs in
//! by its client certificate (`outbox_cert`, `REQUIRE SUBJECT '/CN=outbox_cert'`). The URL's
//! `ssl-mode`, `ssl-ca`, `ssl-cert` and `ssl-key` reach the driver unchanged.

#![allow(clippy::unwrap_used)]

fn tls_dir() -> String {
    std::env::var("OUTBOX_TLS_DIR").unwrap_or_else(|_| "/var/tmp/outbox-tls".into())
}

/// The user has no password: with `password`, one is sent anyway (a wrong one), to show it
/// never reaches an error.
fn url(ca: &str, with_cert: bool, password: bool) -> String {
    let d = tls_dir();
    let cert = if with_cert {
        format!("&ssl-cert={d}/client.pem&ssl-key={d}/client.key")
    } else {
        String::new()
    };
    let user = if password {
        "outbox_cert:hunter2"
    } else {
        "outbox_cert"
    };
    format!("mysql://{user}@localhost:3308/test?ssl-mode=VERIFY_IDENTITY&ssl-ca={d}/{ca}{cert}")
}

#[tokio::test]
async fn the_pool_connects_with_verify_identity_and_a_client_certificate() {
    let db = outbox_db::open(&url("ca.pem", true, false), "public", 2)
        .await
        .unwrap();
    // Tables made and checked over the TLS connection (idempotent: the server is this test's).
    db.migrate().await.unwrap();
    db.check().await.unwrap();
}

#[tokio::test]
async fn a_wrong_ca_or_no_certificate_is_a_clear_error_without_the_password() {
    for (u, says) in [
        (url("other-ca.pem", true, true), "certificate"),
        (url("ca.pem", false, true), "outbox_cert"),
    ] {
        let e = match outbox_db::open(&u, "public", 1).await {
            Ok(db) => db.check().await.unwrap_err().to_string(),
            Err(e) => e.to_string(),
        };
        assert!(e.to_lowercase().contains(says), "{u}: {e}");
        assert!(!e.contains("hunter2"), "{e}");
    }
}
