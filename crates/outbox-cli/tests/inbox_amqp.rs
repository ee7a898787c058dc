//! `outbox inbox` consuming RabbitMQ (127.0.0.1:5672, or `OUTBOX_TEST_AMQP_URL`) into
//! PostgreSQL as users run it: killed with `kill -9` mid-stream and restarted, it loses nothing
//! and records nothing twice, each key in publish order, and the queue is drained. Messages a
//! dead consumer held unacknowledged are requeued by RabbitMQ when its connection closes, at
//! their original place, and are recorded before anything newer. Test messages are published by
//! the relay's own RabbitMQ sink (message id, persistence, `outbox-*` headers).

#![allow(clippy::unwrap_used)]

mod common;
#[path = "common/inbox.rs"]
mod inboxkit;

use inboxkit::{workload, Inbox};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{sigterm, wait_exit};
use futures::StreamExt;
use lapin::options::{
    BasicConsumeOptions, BasicQosOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionProperties};
use outbox_core::sink::{
    HEADER_AGGREGATE_ID, HEADER_AGGREGATE_TYPE, HEADER_EVENT_TYPE, HEADER_MESSAGE_ID,
};
use outbox_core::{Envelope, Sink};
use outbox_sinks::amqp::{AmqpConfig, AmqpSink};
use uuid::Uuid;

fn amqp_url() -> String {
    std::env::var("OUTBOX_TEST_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into())
}

fn outbox() -> Command {
    common::outbox_command(&std::env::temp_dir())
}

/// A durable queue of its own, written by the relay's RabbitMQ sink through the default
/// exchange.
struct Queue {
    name: String,
    conn: Connection,
    sink: AmqpSink,
}

impl Queue {
    async fn new() -> Self {
        let name = outbox_testkit::unique_name("ibx");
        let conn = Connection::connect(&amqp_url(), ConnectionProperties::default())
            .await
            .expect("RabbitMQ must be running: scripts/services.sh starts it");
        let ch = conn.create_channel().await.unwrap();
        ch.queue_declare(
            name.as_str().into(),
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
        let sink = AmqpSink::connect(AmqpConfig::from_url(&amqp_url()).unwrap())
            .await
            .unwrap();
        Self { name, conn, sink }
    }

    fn source(&self) -> String {
        format!("{}?queue={}", amqp_url(), self.name)
    }

    /// Publishes like `outbox relay` does, through its own sink.
    async fn publish(&self, msgs: &[(Uuid, String, i64)]) {
        for chunk in msgs.chunks(500) {
            let batch: Vec<Envelope> = chunk
                .iter()
                .map(|(id, key, n)| Envelope {
                    id: *id,
                    destination: self.name.clone(),
                    key: key.clone(),
                    headers: vec![
                        (HEADER_MESSAGE_ID.into(), id.to_string()),
                        (HEADER_EVENT_TYPE.into(), "order.paid".into()),
                        (HEADER_AGGREGATE_TYPE.into(), "order".into()),
                        (HEADER_AGGREGATE_ID.into(), key.clone()),
                    ],
                    payload: serde_json::json!({ "n": n }).to_string().into(),
                    created_at: chrono::Utc::now(),
                })
                .collect();
            for r in self.sink.publish(&batch).await {
                r.unwrap();
            }
        }
    }

    /// (ready, consumers) of the queue.
    async fn counts(&self) -> (u32, u32) {
        let ch = self.conn.create_channel().await.unwrap();
        let q = ch
            .queue_declare(
                self.name.as_str().into(),
                QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .unwrap();
        let _ = ch.close(200, "OK".into()).await;
        (q.message_count(), q.consumer_count())
    }

    async fn drop_all(self) {
        let ch = self.conn.create_channel().await.unwrap();
        let _ = ch
            .queue_delete(self.name.as_str().into(), QueueDeleteOptions::default())
            .await;
        let _ = self.conn.close(200, "OK".into()).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inbox_killed_with_sigkill_mid_stream_from_rabbitmq_loses_nothing_and_records_nothing_twice(
) {
    let inbox = Inbox::new().await;
    let queue = Queue::new().await;
    let msgs = workload(20, 150, 0);
    queue.publish(&msgs).await;
    let mut a = inbox.daemon(&queue.source(), 100);
    inbox.wait_count(600, Duration::from_secs(60)).await;
    a.kill().unwrap(); // SIGKILL: the batch in hand is neither committed nor acknowledged
    a.wait().unwrap();
    assert!(
        inbox.count().await < msgs.len() as i64,
        "the daemon finished before it was killed: nothing tested"
    );
    let more = workload(20, 10, 150);
    queue.publish(&more).await;
    let all: Vec<_> = msgs.iter().chain(&more).cloned().collect();
    let mut b = inbox.daemon(&queue.source(), 100);
    inbox
        .wait_count(all.len() as i64, Duration::from_secs(60))
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    inbox.check(&all).await;
    sigterm(&b);
    assert!(wait_exit(&mut b, Duration::from_secs(15)).success());
    // Acknowledged, not requeued when the daemon's connection closed.
    assert_eq!(queue.counts().await, (0, 0), "the queue drained");
    queue.drop_all().await;
    inbox.drop_all().await;
}

/// A consumer took 30 messages and died without acknowledging them (its connection closes, as
/// a killed process's does): RabbitMQ puts them back at their place at the head of the queue,
/// and the daemon records them before anything newer, every key in publish order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_a_dead_consumer_held_in_rabbitmq_are_recorded_before_anything_newer() {
    let inbox = Inbox::new().await;
    let queue = Queue::new().await;
    let msgs = workload(5, 40, 0);
    queue.publish(&msgs).await;
    let dead = Connection::connect(&amqp_url(), ConnectionProperties::default())
        .await
        .unwrap();
    let ch = dead.create_channel().await.unwrap();
    ch.basic_qos(30, BasicQosOptions::default()).await.unwrap();
    let mut consumer = ch
        .basic_consume(
            queue.name.as_str().into(),
            "dead".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    for _ in 0..30 {
        tokio::time::timeout(Duration::from_secs(10), consumer.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
    }
    assert_eq!(queue.counts().await.0, 170, "30 held by the dead consumer");
    drop(consumer);
    let _ = dead.close(320, "killed".into()).await;
    let mut d = inbox.daemon(&queue.source(), 100);
    inbox
        .wait_count(msgs.len() as i64, Duration::from_secs(60))
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    inbox.check(&msgs).await;
    let redelivered: Vec<serde_json::Value> = sqlx::query_scalar(&format!(
        "SELECT payload FROM {}.inbox_messages ORDER BY seq LIMIT 30",
        inbox.schema
    ))
    .fetch_all(&inbox.pool)
    .await
    .unwrap();
    assert!(
        redelivered.iter().all(|p| p["n"].as_i64().unwrap() < 6),
        "the 30 held messages (n 0..5 of each key) came first: {redelivered:?}"
    );
    sigterm(&d);
    assert!(wait_exit(&mut d, Duration::from_secs(15)).success());
    assert_eq!(queue.counts().await, (0, 0));
    queue.drop_all().await;
    inbox.drop_all().await;
}

/// URL and configuration mistakes stop `outbox inbox` with an error that names the problem,
/// and never shows the password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_rabbitmq_source_is_a_clear_error_without_the_password() {
    let inbox = Inbox::new().await;
    let missing = outbox_testkit::unique_name("ibx_missing");
    for (source, says) in [
        (
            "amqp://guest:guest@127.0.0.1:5672/%2f".to_string(),
            "name the queue",
        ),
        (format!("{}?queue=q&bogus=1", amqp_url()), "`bogus`"),
        (format!("{}?queue={missing}", amqp_url()), "no queue"),
        (
            "amqp://guest:hunter2@127.0.0.1:5672/%2f?queue=q".to_string(),
            "ACCESS_REFUSED",
        ),
    ] {
        let mut child = outbox()
            .args([
                "inbox",
                "--database-url",
                &common::database_url(),
                "--schema",
                &inbox.schema,
            ])
            .env("OUTBOX_INBOX_SOURCE", &source)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let status = wait_exit(&mut child, Duration::from_secs(30));
        let mut err = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
        assert!(!status.success(), "{source}: {err}");
        assert!(err.contains(says), "{source}: {err}");
        assert!(!err.contains("hunter2"), "{err}");
    }
    inbox.drop_all().await;
}
