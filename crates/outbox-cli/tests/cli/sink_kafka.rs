//! What is particular to the Kafka sink, against a real Kafka-protocol broker (tansu on
//! 127.0.0.1:9092, or `OUTBOX_TEST_KAFKA_URL`; private brokers from the testkit): it orders
//! keys itself, so a hot key goes many messages per call and stays in order, within one call
//! and across a broker outage with calls of hundreds of messages of one key in flight; and
//! `create_topics`. What every sink must do is the conformance suite's
//! (`outbox-sinks/tests/conformance.rs`, module `kafka`).

#![allow(clippy::unwrap_used)]

use crate::common;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::World;
use outbox_core::{Sink, Store};
use outbox_sinks::kafka::{KafkaConfig, KafkaReader, KafkaSink};
use outbox_sinks::read::{scratch, Reader, ScratchOptions};
use outbox_testkit::proxy::TcpProxy;
use outbox_testkit::relay::{
    assert_key_order, envelope, interleaved, keys, read_distinct, triples, Backlog, RunningRelay,
};
use outbox_testkit::sinks::RecordingSink;

fn kafka_url() -> String {
    std::env::var("OUTBOX_TEST_KAFKA_URL").unwrap_or_else(|_| "kafka://127.0.0.1:9092".into())
}

fn sink(url: &str) -> KafkaSink {
    KafkaSink::connect(KafkaConfig::from_url(url).unwrap()).unwrap()
}

/// A scratch topic on `url` with `partitions` partitions, and its reader.
async fn topic(url: &str, tag: &str, partitions: u32) -> (String, Box<dyn Reader>) {
    let mut options = ScratchOptions::new(tag);
    options.partitions = partitions;
    let s = scratch(url, &options)
        .await
        .expect("the Kafka broker (tansu) must be running: scripts/services.sh starts it");
    (s.destination, s.reader)
}

/// A hot key (3,000 messages of one key) is relayed in whole batches per call, each message
/// acknowledged once, and read back complete and in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_key_goes_many_messages_per_call_and_stays_in_order() {
    let w = World::new().await;
    let (topic, mut reader) = topic(&kafka_url(), "hot", 2).await;
    let n = 3000;
    w.store()
        .insert(&interleaved(&["hot".to_string()], 0..n))
        .await
        .unwrap();
    let recording = Arc::new(RecordingSink::new(sink(&kafka_url())));
    let acked = recording.acked();
    let mut cfg = w.relay_config_to(&topic);
    cfg.batch_size = 1000;
    let started = Instant::now();
    let relay = RunningRelay::start(w.dyn_store(), recording, cfg);
    w.wait_drained(Duration::from_secs(60)).await;
    let took = started.elapsed();
    relay.stop().await;
    assert!(acked.lock().unwrap().values().all(|&c| c == 1));
    let got = read_distinct(reader.as_mut(), n, Duration::from_secs(60)).await;
    assert_eq!(got.len(), n);
    assert_eq!(
        assert_key_order(triples(&got)).get("hot"),
        Some(&(n as u64))
    );
    eprintln!("hot key: {n} messages relayed in {took:?}");
    reader.cleanup().await;
    w.drop_all().await;
}

/// One `publish` call with 500 messages of three keys: the broker writes each key's messages
/// in call order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_keeps_a_keys_order_within_one_call() {
    let (topic, mut reader) = topic(&kafka_url(), "call", 3).await;
    let s = sink(&kafka_url());
    assert!(s.orders_keys());
    let batch: Vec<outbox_core::Envelope> = (0..500u64)
        .map(|n| envelope(&topic, &format!("k{}", n % 3), n / 3))
        .collect();
    let results = s.publish(&batch).await;
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    let got = read_distinct(reader.as_mut(), 500, Duration::from_secs(30)).await;
    assert_eq!(got.len(), 500);
    assert_key_order(triples(&got));
    // No client may know a topic when it is deleted (see `KafkaReader::cleanup`).
    drop(s);
    reader.cleanup().await;
}

/// With `create_topics=true` a topic that does not exist is created (with the URL's partitions)
/// and the messages arrive in key order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_topics_true_creates_a_missing_topic() {
    let w = World::new().await;
    let missing = outbox_testkit::unique_name("outbox_created");
    w.store()
        .insert(&interleaved(&keys("k", 3), 0..10))
        .await
        .unwrap();
    let url = format!(
        "{}?create_topics=true&partitions=2&replication_factor=1",
        kafka_url()
    );
    let relay = RunningRelay::start(
        w.dyn_store(),
        Arc::new(sink(&url)),
        w.relay_config_to(&missing),
    );
    w.wait_drained(Duration::from_secs(30)).await;
    relay.stop().await;
    let brokers = KafkaConfig::from_url(&kafka_url()).unwrap().brokers;
    let mut reader = KafkaReader::open(&brokers, &missing).await.unwrap();
    let got = read_distinct(&mut reader, 30, Duration::from_secs(20)).await;
    assert_eq!(got.len(), 30);
    assert!(assert_key_order(triples(&got)).values().all(|&n| n == 10));
    assert_eq!(w.stats().await.failed, 0);
    reader.cleanup().await;
    w.drop_all().await;
}

/// Every connection to a private tansu cut and refused (a proxy in front of it, whose address
/// the broker advertises), then restored, while calls of hundreds of messages of one hot key
/// are in flight: the broker keeps what it acknowledged and its idempotent-producer state, as a
/// Kafka broker restarted on its log does, so nothing is lost and each key's first deliveries
/// stay in order. (tansu itself loses acknowledged writes when killed: the conformance suite's
/// `kafka::broker_down_mid_stream_with_messages_in_flight` checks order only for that reason.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_stays_in_order_with_many_in_flight_while_the_broker_restarts() {
    // `RUST_LOG=warn` shows what the relay and librdkafka saw.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let tansu = tokio::task::block_in_place(|| {
        outbox_testkit::brokers::tansu_in_memory(listener.local_addr().unwrap().port())
    });
    let proxy = TcpProxy::start_on(listener, tansu.port());
    let (topic, _) = topic(&tansu.url(), "restart", 2).await;
    // The sink answers within its ack timeout, inside the relay's deadline (a third of the
    // 3 s lease).
    let url = format!("{}?ack_timeout=500ms", tansu.url());
    let w = World::new().await;
    let mut cfg = w.relay_config_to(&topic);
    cfg.batch_size = 500;
    let mut key_names = vec!["hot".to_string()];
    key_names.extend(keys("k", 4));
    let per_key = 1000;
    let store = w.dyn_store();
    let d = Backlog::start(store, Arc::new(sink(&url)), cfg, &key_names, per_key).await;
    d.publishing(300).await;
    proxy.down();
    let before = d.outage(Duration::from_secs(30)).await;
    proxy.open();
    let most = d.finish(Duration::from_secs(120)).await;
    assert!(
        most >= 10,
        "no call with many messages of one key was caught by the outage: {most}"
    );
    let brokers = KafkaConfig::from_url(&url).unwrap().brokers;
    let mut reader = KafkaReader::open(&brokers, &topic).await.unwrap();
    let total = key_names.len() * per_key;
    let got = read_distinct(&mut reader, total, Duration::from_secs(60)).await;
    let counts = assert_key_order(triples(&got));
    assert_eq!(counts.len(), key_names.len(), "{counts:?}");
    assert!(counts.values().all(|&n| n == per_key as u64), "{counts:?}");
    eprintln!(
        "cut: {before} published before the broker came back; {} deliveries for {total} \
         messages; calls caught by the outage held up to {most} messages of one key",
        got.len(),
    );
    w.drop_all().await;
}
