//! Raw produce rate of the bundled librdkafka against a Kafka-protocol broker, and of the
//! `KafkaSink` on top of it, for comparing with the relay's figures.
//!
//! `cargo run --release -p outbox-sinks --example kafka_produce_rate -- [kafka://127.0.0.1:9092] [messages]`
//!
//! 1. librdkafka alone: `messages` 200-byte messages, idempotent, `acks=all`, all enqueued at
//!    once, then every delivery report awaited (one key per message, 8 partitions).
//! 2. `KafkaSink::publish` with 1,000 envelopes of **one key** per call, call after call: what
//!    the relay's single-key path can reach at most.

#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use futures::future::join_all;
use outbox_core::{Envelope, Sink};
use outbox_sinks::kafka::{create_topic, delete_topic, KafkaConfig, KafkaSink};
use rdkafka::config::ClientConfig;
use rdkafka::producer::{FutureProducer, FutureRecord};

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let url = args
        .next()
        .unwrap_or_else(|| "kafka://127.0.0.1:9092".into());
    let n: usize = args.next().map(|s| s.parse().unwrap()).unwrap_or(100_000);
    let brokers = KafkaConfig::from_url(&url).unwrap().brokers;
    let payload = vec![b'x'; 200];

    let topic = format!("outbox_rate_{:x}", fastrand::u64(..));
    create_topic(&brokers, &topic, 8).await.unwrap();
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "5")
        .set("queue.buffering.max.messages", "1000000")
        .create()
        .unwrap();
    let started = Instant::now();
    let mut pending = Vec::with_capacity(n);
    for i in 0..n {
        let key = format!("k{}", i % 1000);
        pending.push(
            producer
                .send_result(FutureRecord::to(&topic).key(&key).payload(&payload))
                .map_err(|(e, _)| e)
                .unwrap(),
        );
    }
    let acked = join_all(pending)
        .await
        .into_iter()
        .filter(|r| matches!(r, Ok(Ok(_))))
        .count();
    let took = started.elapsed();
    println!(
        "librdkafka alone: {acked}/{n} acknowledged in {took:.2?}: {:.0} msg/s",
        acked as f64 / took.as_secs_f64()
    );
    let _ = delete_topic(&brokers, &topic).await;

    let topic = format!("outbox_rate_{:x}", fastrand::u64(..));
    create_topic(&brokers, &topic, 8).await.unwrap();
    let sink = KafkaSink::connect(KafkaConfig::from_url(&url).unwrap()).unwrap();
    let payload = bytes::Bytes::from(payload);
    let started = Instant::now();
    let mut ok = 0;
    for _ in 0..n / 1000 {
        let batch: Vec<Envelope> = (0..1000)
            .map(|_| {
                let id = uuid::Uuid::now_v7();
                Envelope {
                    id,
                    destination: topic.clone(),
                    key: "hot".into(),
                    headers: vec![
                        ("outbox-message-id".into(), id.to_string()),
                        ("outbox-event-type".into(), "changed".into()),
                        ("outbox-aggregate-type".into(), "order".into()),
                        ("outbox-aggregate-id".into(), "hot".into()),
                    ],
                    payload: payload.clone(),
                    created_at: chrono::Utc::now(),
                }
            })
            .collect();
        ok += sink
            .publish(&batch)
            .await
            .iter()
            .filter(|r| r.is_ok())
            .count();
    }
    let took = started.elapsed();
    println!(
        "KafkaSink, one key, 1,000 per call: {ok}/{} acknowledged in {took:.2?}: {:.0} msg/s",
        n / 1000 * 1000,
        ok as f64 / took.as_secs_f64()
    );
    drop(sink);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let _ = delete_topic(&brokers, &topic).await;
}
