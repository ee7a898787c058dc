//! What is particular to the MQTT sink, against the real Mosquitto on this machine: a topic
//! with a wildcard can never be published to. What every sink must do (the ACL refusal of a
//! private broker included) is the conformance suite's (`outbox-sinks/tests/conformance.rs`,
//! module `mqtt`).

#![allow(clippy::unwrap_used)]

use crate::common;
use std::sync::Arc;
use std::time::Duration;

use common::World;
use outbox_core::{NewMessage, Store};
use outbox_sinks::mqtt::{MqttConfig, MqttSink};
use outbox_sinks::read::{scratch, ScratchOptions};
use outbox_testkit::relay::{
    assert_key_order, interleaved, read_distinct, triples, wait_failed, RunningRelay,
};

fn mqtt_url() -> String {
    std::env::var("OUTBOX_TEST_MQTT_URL").unwrap_or_else(|_| "mqtt://127.0.0.1:1883".into())
}

/// A row whose topic holds a wildcard (`+`) is invalid: it ends `failed` at its first attempt
/// naming the wildcard, the circuit stays closed, and the other rows flow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wildcard_topic_fails_at_once_and_others_flow() {
    let w = World::with_stream(false).await;
    let mut s = scratch(&mqtt_url(), &ScratchOptions::new("mqttwild"))
        .await
        .expect("Mosquitto must be running");
    let prefix = s.destination.split('/').next().unwrap().to_string();
    let wild = NewMessage::new("order", "wild", "placed", serde_json::json!({}))
        .topic(format!("{prefix}/+/x"));
    w.store().insert(std::slice::from_ref(&wild)).await.unwrap();
    w.store()
        .insert(&interleaved(&["good".to_string()], 0..2))
        .await
        .unwrap();
    let cfg = w.relay_config_to(&s.destination);
    let url = format!("{}?ack_timeout=800ms", mqtt_url());
    let relay = RunningRelay::start(
        w.dyn_store(),
        Arc::new(MqttSink::connect(MqttConfig::from_url(&url).unwrap()).unwrap()),
        cfg,
    );
    let left_closed = relay.watch_breaker();
    let failed = wait_failed(w.dyn_store().as_ref(), 1, Duration::from_secs(30)).await;
    w.wait_drained(Duration::from_secs(20)).await;
    relay.stop().await;
    assert_eq!(failed[0].id, wild.id);
    assert_eq!(failed[0].attempts, 1);
    let error = failed[0].last_error.clone().unwrap_or_default();
    assert!(error.contains("wildcard"), "{error}");
    assert!(!left_closed.load(std::sync::atomic::Ordering::SeqCst));
    let got = read_distinct(s.reader.as_mut(), 2, Duration::from_secs(30)).await;
    assert_eq!(assert_key_order(triples(&got))["good"], 2);
    s.reader.cleanup().await;
    w.drop_all().await;
}
