//! What a relay sees when TLS or authentication goes wrong, against real servers: a wrong CA, an
//! expired certificate, a certificate for another host, a wrong password and a missing
//! credentials file. Each is one error that names the connection and the cause and never the
//! secret; a publish that fails this way is `unavailable` (the relay keeps the messages pending
//! and retries them), and a refusal found at start-up is a configuration error (the relay does
//! not start, its messages stay pending).
//!
//! The servers: the TLS listeners scripts/services.sh starts (Redis on 6380, NATS on 4223), and
//! for the bad certificates a TLS terminator (socat) of the test's own in front of the shared
//! plaintext Redis, presenting the expired or wrong-host certificate of scripts/tls-certs.sh.

#![allow(clippy::unwrap_used)]

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use bytes::Bytes;
use outbox_core::{Envelope, ErrorKind, Sink};

fn tls_dir() -> String {
    std::env::var("OUTBOX_TLS_DIR").unwrap_or_else(|_| "/var/tmp/outbox-tls".into())
}

fn d(url: &str) -> String {
    url.replace("{d}", &tls_dir())
}

fn envelope() -> Envelope {
    Envelope {
        id: uuid::Uuid::now_v7(),
        destination: outbox_testkit::unique_name("tls_failure"),
        key: "k".into(),
        headers: vec![],
        payload: Bytes::from_static(b"{\"n\":1}"),
        created_at: chrono::Utc::now(),
    }
}

/// Publishes one message through the sink `url` names and returns the error it got: the sink
/// must connect (its clients connect in the background) and then fail the publish.
async fn publish_error(url: &str) -> String {
    let sink = outbox_sinks::connect(url)
        .await
        .unwrap_or_else(|e| panic!("{url}: {e}"));
    let got = tokio::time::timeout(Duration::from_secs(20), sink.publish(&[envelope()]))
        .await
        .expect("the publish ends within its ack timeout");
    let e = got.into_iter().next().unwrap().unwrap_err();
    assert!(
        e.is_unavailable(),
        "a TLS or login failure is an outage, retried, never a failed message: {e}"
    );
    e.to_string()
}

/// A TLS terminator in front of the shared plaintext Redis, presenting `cert`; killed on drop.
struct Terminator {
    child: Child,
    port: u16,
}

impl Terminator {
    fn start(cert: &str) -> Self {
        Self::start_for(cert, 6379, false)
    }

    /// A terminator presenting `cert` in front of 127.0.0.1:`target`; with `client_certs`, it
    /// refuses a client without a certificate of the test CA (mutual TLS).
    fn start_for(cert: &str, target: u16, client_certs: bool) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let dir = tls_dir();
        let verify = if client_certs {
            format!("verify=1,cafile={dir}/ca.pem")
        } else {
            "verify=0".to_string()
        };
        let child = Command::new("socat")
            .arg(format!(
                "openssl-listen:{port},bind=127.0.0.1,reuseaddr,fork,{verify},\
                 cert={dir}/{cert}.pem,key={dir}/{cert}.key"
            ))
            .arg(format!("tcp:127.0.0.1:{target}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("socat (apt-get install socat) starts");
        // Owned at once: dropped (killed and waited for) on every path, the panic's included.
        let t = Self { child, port };
        for _ in 0..100 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return t;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("socat did not listen on {}", t.port);
    }
}

impl Drop for Terminator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn a_wrong_ca_is_named_with_the_server() {
    let url = d(
        "rediss://relay:hunter2@localhost:6380?tls_ca={d}/other-ca.pem\
                 &tls_cert={d}/client.pem&tls_key={d}/client.key",
    );
    let e = publish_error(&url).await;
    assert!(e.contains("localhost:6380"), "{e}");
    assert!(e.contains("UnknownIssuer"), "{e}");
    assert!(!e.contains("hunter2"), "{e}");
}

#[tokio::test]
async fn an_expired_certificate_is_named_as_expired() {
    let t = Terminator::start("expired");
    let e = publish_error(&d(&format!(
        "rediss://localhost:{}?tls_ca={{d}}/ca.pem",
        t.port
    )))
    .await;
    assert!(e.contains(&format!("localhost:{}", t.port)), "{e}");
    assert!(e.contains("certificate expired"), "{e}");
}

#[tokio::test]
async fn a_certificate_for_another_host_is_named_as_such() {
    let t = Terminator::start("wronghost");
    let e = publish_error(&d(&format!(
        "rediss://localhost:{}?tls_ca={{d}}/ca.pem",
        t.port
    )))
    .await;
    assert!(e.contains("not valid for name \"localhost\""), "{e}");
}

#[tokio::test]
async fn a_wrong_password_is_named_without_the_password() {
    std::env::set_var("OUTBOX_TLS_TEST_WRONG_PASSWORD", "hunter2-wrong");
    let e = publish_error(&d(
        "rediss://relay@localhost:6380?tls_ca={d}/ca.pem&tls_cert={d}/client.pem\
         &tls_key={d}/client.key&password_env=OUTBOX_TLS_TEST_WRONG_PASSWORD",
    ))
    .await;
    assert!(e.contains("authentication failed"), "{e}");
    assert!(e.contains("check the user and password_file"), "{e}");
    assert!(!e.contains("hunter2"), "{e}");
}

#[tokio::test]
async fn nats_refuses_to_start_on_a_wrong_ca_or_password_naming_the_cause() {
    let e = outbox_sinks::connect(&d(
        "nats://relay:hunter2@localhost:4223?tls_ca={d}/other-ca.pem\
         &tls_cert={d}/client.pem&tls_key={d}/client.key",
    ))
    .await
    .err()
    .unwrap();
    assert_eq!(e.kind(), ErrorKind::Config, "{e}");
    let text = e.to_string();
    assert!(text.contains("localhost:4223"), "{text}");
    assert!(text.contains("UnknownIssuer"), "{text}");
    assert!(!text.contains("hunter2"), "{text}");
    let e = outbox_sinks::connect(&d("nats://relay:hunter2@localhost:4223?tls_ca={d}/ca.pem\
         &tls_cert={d}/client.pem&tls_key={d}/client.key"))
    .await
    .err()
    .unwrap();
    let text = e.to_string();
    assert_eq!(e.kind(), ErrorKind::Config, "{text}");
    assert!(text.to_lowercase().contains("authorization"), "{text}");
    assert!(!text.contains("hunter2"), "{text}");
}

#[tokio::test]
async fn a_missing_credentials_file_is_a_configuration_error_naming_it() {
    for (url, says) in [
        (
            "tls://localhost:4224?creds_file=/nonexistent/user.creds",
            "creds_file /nonexistent/user.creds cannot be read",
        ),
        (
            "rediss://relay@localhost:6380?password_file=/nonexistent/redis.pass",
            "password_file /nonexistent/redis.pass cannot be read",
        ),
        (
            "mqtts://localhost:8883?tls_ca=/nonexistent/ca.pem",
            "tls_ca /nonexistent/ca.pem cannot be read",
        ),
    ] {
        let e = outbox_sinks::connect(url).await.err().unwrap();
        assert_eq!(e.kind(), ErrorKind::Config, "{url}: {e}");
        assert!(e.to_string().contains(says), "{url}: {e}");
    }
}

/// Mutual TLS to a webhook receiver: with the client certificate the message arrives; without
/// it the receiver's terminator refuses the handshake, and the publish is an outage (retried).
#[tokio::test]
async fn webhooks_present_a_client_certificate_to_the_receiver() {
    use outbox_sinks::http::{HttpReader, HttpReceiver};
    use outbox_sinks::read::Reader;
    let prefix = outbox_testkit::unique_name("mtls");
    let receiver = HttpReceiver::start(&prefix, None, None).await.unwrap();
    let port: u16 = receiver
        .url()
        .rsplit_once(':')
        .unwrap()
        .1
        .split('/')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let t = Terminator::start_for("server", port, true);
    let endpoint = format!("https://localhost:{}/{prefix}/{{destination}}", t.port);
    let with_cert = outbox_sinks::connect(&d(&format!(
        "{endpoint}#tls_ca={{d}}/ca.pem&tls_cert={{d}}/client.pem&tls_key={{d}}/client.key"
    )))
    .await
    .unwrap();
    let sent = envelope();
    let got = with_cert.publish(std::slice::from_ref(&sent)).await;
    assert!(got[0].is_ok(), "{got:?}");
    let mut reader = HttpReader::new(receiver);
    let polled = reader.poll(Duration::from_secs(5)).await;
    assert_eq!(polled.delivered.len(), 1);
    assert_eq!(polled.delivered[0].id, sent.id);
    let e = publish_error(&d(&format!("{endpoint}#tls_ca={{d}}/ca.pem"))).await;
    assert!(e.contains(&format!("localhost:{}", t.port)), "{e}");
}

/// MQTT over TLS with a CA that did not sign the broker's certificate: the publish is an
/// outage naming the broker and the refused certificate.
#[tokio::test]
async fn mqtt_names_the_refused_certificate() {
    let url = d("mqtts://localhost:8883?tls_ca={d}/other-ca.pem\
                 &tls_cert={d}/client.pem&tls_key={d}/client.key");
    let sink = outbox_sinks::connect(&url).await.unwrap();
    // The client connects in the background: the first publishes may find no attempt yet.
    let until = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let e = sink.publish(&[envelope()]).await.remove(0).unwrap_err();
        assert!(e.is_unavailable(), "{e}");
        let text = e.to_string();
        if text.contains("last attempt") {
            assert!(text.contains("localhost:8883"), "{text}");
            assert!(text.contains("UnknownIssuer"), "{text}");
            break;
        }
        assert!(std::time::Instant::now() < until, "{text}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
