//! The inbox's sources take the TLS and credential options of the sinks of the same broker: a
//! message published by the sink over a TLS listener with authentication (scripts/services.sh:
//! NATS with users on 4223 and with JWTs on 4224, Redis with ACL users on 6380, Mosquitto with
//! client certificates on 8883) is fetched by the source over the same URL.

#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use bytes::Bytes;
use outbox_core::{Envelope, Sink};
use outbox_inbox::source::{open, Source, SourceOptions};

fn d(url: &str) -> String {
    let dir = std::env::var("OUTBOX_TLS_DIR").unwrap_or_else(|_| "/var/tmp/outbox-tls".into());
    url.replace("{d}", &dir)
}

/// A message as the relay hands it to a sink: its id in the `outbox-message-id` header too.
fn envelope(destination: &str) -> Envelope {
    let id = uuid::Uuid::now_v7();
    Envelope {
        id,
        destination: destination.to_string(),
        key: "k".into(),
        headers: vec![
            ("outbox-message-id".into(), id.to_string()),
            ("outbox-event-type".into(), "placed".into()),
        ],
        payload: Bytes::from_static(b"{\"n\":1}"),
        created_at: chrono::Utc::now(),
    }
}

/// Publishes `e` as the relay would: an outage (a sink still connecting) is retried.
async fn publish(sink_url: &str, e: &Envelope) {
    let sink = outbox_sinks::connect(sink_url).await.unwrap();
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let got = sink.publish(std::slice::from_ref(e)).await;
        match &got[0] {
            Ok(()) => return,
            Err(err) if err.is_unavailable() && Instant::now() < until => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(err) => panic!("{sink_url}: {err}"),
        }
    }
}

/// Fetches from `source` until a message came (20 s at most) and returns its id.
async fn fetch_one(source: &mut dyn Source) -> uuid::Uuid {
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(got) = source.fetch(10).await {
            if let Some(first) = got.first() {
                return first.message.id;
            }
        }
        assert!(Instant::now() < until, "nothing from {}", source.describe());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn nats_round_trip(server: &str) {
    let name = outbox_testkit::unique_name("ibx_tls");
    let stream = name.to_uppercase();
    let client = outbox_sinks::nats::NatsConfig::from_url(server)
        .unwrap()
        .connect_client()
        .await
        .unwrap();
    let js = async_nats::jetstream::new(client);
    outbox_sinks::nats::create_stream(&js, &stream, vec![format!("{name}.>")], false)
        .await
        .unwrap();
    let e = envelope(&format!("{name}.placed"));
    publish(server, &e).await;
    let mut source = open(
        &format!("{server}&stream={stream}"),
        &SourceOptions { batch: 10 },
    )
    .await
    .unwrap();
    source.recover().await.unwrap();
    assert_eq!(fetch_one(source.as_mut()).await, e.id);
    let _ = js.delete_stream(&stream).await;
}

#[tokio::test]
async fn nats_with_a_client_certificate_and_a_password_file() {
    nats_round_trip(&d(
        "nats://relay@localhost:4223?tls_ca={d}/ca.pem&tls_cert={d}/client.pem\
         &tls_key={d}/client.key&password_file={d}/nats.pass",
    ))
    .await;
}

#[tokio::test]
async fn nats_with_a_credentials_file() {
    nats_round_trip(&d(
        "tls://localhost:4224?tls_ca={d}/ca.pem&creds_file={d}/nats/user.creds",
    ))
    .await;
}

#[tokio::test]
async fn redis_over_tls_with_an_acl_user() {
    let server = d(
        "rediss://relay@localhost:6380?tls_ca={d}/ca.pem&tls_cert={d}/client.pem\
                    &tls_key={d}/client.key&password_file={d}/redis.pass",
    );
    let key = outbox_testkit::unique_name("ibx_tls");
    let e = envelope(&key);
    publish(&server, &e).await;
    let mut source = open(
        &format!("{server}&stream={key}"),
        &SourceOptions { batch: 10 },
    )
    .await
    .unwrap();
    source.recover().await.unwrap();
    assert_eq!(fetch_one(source.as_mut()).await, e.id);
}

#[tokio::test]
async fn mqtt_over_tls_with_a_client_certificate() {
    let server = d(
        "mqtts://localhost:8883?tls_ca={d}/ca.pem&tls_cert={d}/client.pem&tls_key={d}/client.key",
    );
    let topic = outbox_testkit::unique_name("ibx_tls");
    // MQTT keeps nothing for a subscriber that is not there yet: subscribe first.
    let mut source = open(
        &format!("{server}&topic={topic}/%23&client_id={topic}"),
        &SourceOptions { batch: 10 },
    )
    .await
    .unwrap();
    source.recover().await.unwrap();
    let _ = source.fetch(10).await;
    let e = envelope(&format!("{topic}/placed"));
    publish(&server, &e).await;
    assert_eq!(fetch_one(source.as_mut()).await, e.id);
}
