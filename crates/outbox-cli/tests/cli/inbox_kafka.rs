//! `outbox inbox` from Kafka (tansu on 127.0.0.1:9092, or `OUTBOX_TEST_KAFKA_URL`), in what
//! is particular to Kafka: the source tells the topic's retention. Every message once in key
//! order across `kill -9`, what a dead member of the group fetched, and bad source URLs are
//! the source conformance suite's (`inbox_sources.rs`, module `kafka`).

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use outbox_sinks::kafka::{client_config, delete_topic, KafkaConfig};

fn brokers() -> String {
    KafkaConfig::from_url(&kafka_url()).unwrap().brokers
}

fn kafka_url() -> String {
    std::env::var("OUTBOX_TEST_KAFKA_URL").unwrap_or_else(|_| "kafka://127.0.0.1:9092".into())
}

/// The source reads the topic's `retention.ms`, which the daemon compares with the inbox's
/// retention at start-up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kafka_source_tells_the_topics_retention() {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    let name = outbox_testkit::unique_name("ibx");
    let admin: AdminClient<rdkafka::client::DefaultClientContext> =
        client_config(&brokers()).create().unwrap();
    let created = admin
        .create_topics(
            [&NewTopic::new(&name, 1, TopicReplication::Fixed(1)).set("retention.ms", "3600000")],
            &AdminOptions::new().request_timeout(Some(Duration::from_secs(10))),
        )
        .await
        .unwrap();
    assert!(created.iter().all(|r| r.is_ok()), "{created:?}");
    let mut source = outbox_inbox::source::open(
        &format!("{}?topic={name}", kafka_url()),
        &outbox_inbox::source::SourceOptions { batch: 10 },
    )
    .await
    .unwrap();
    let kept = source.retention().await;
    drop(source);
    let _ = delete_topic(&brokers(), &name).await;
    assert_eq!(
        kept.unwrap(),
        outbox_inbox::source::SourceRetention::For(Duration::from_secs(3600))
    );
}
