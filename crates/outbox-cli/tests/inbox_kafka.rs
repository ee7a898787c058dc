//! `outbox inbox` consuming Kafka (tansu on 127.0.0.1:9092, or `OUTBOX_TEST_KAFKA_URL`) into
//! PostgreSQL as users run it: killed with `kill -9` mid-stream and restarted, it loses nothing
//! and records nothing twice, each key in publish order, and the group's committed offsets reach
//! the end of every partition. Records a dead consumer of the group fetched and never committed
//! are recorded first; records before the committed offset are not read again. Test messages
//! are produced by the relay's own Kafka sink, with the relay's headers.

#![allow(clippy::unwrap_used)]

mod common;
#[path = "common/inbox.rs"]
mod inboxkit;

use inboxkit::{workload, Inbox};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{sigterm, wait_exit};
use outbox_core::sink::{
    HEADER_AGGREGATE_ID, HEADER_AGGREGATE_TYPE, HEADER_EVENT_TYPE, HEADER_MESSAGE_ID,
};
use outbox_core::{Envelope, Sink};
use outbox_sinks::kafka::{client_config, create_topic, delete_topic, KafkaConfig, KafkaSink};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::{Offset, TopicPartitionList};
use uuid::Uuid;

fn kafka_url() -> String {
    std::env::var("OUTBOX_TEST_KAFKA_URL").unwrap_or_else(|_| "kafka://127.0.0.1:9092".into())
}

fn brokers() -> String {
    KafkaConfig::from_url(&kafka_url()).unwrap().brokers
}

fn outbox() -> Command {
    common::outbox_command(&std::env::temp_dir())
}

/// A topic of its own with three partitions, written by the relay's Kafka sink.
struct Topic {
    name: String,
    partitions: i32,
    sink: Arc<KafkaSink>,
}

impl Topic {
    async fn new() -> Self {
        let name = outbox_testkit::unique_name("ibx");
        create_topic(&brokers(), &name, 3)
            .await
            .expect("the Kafka broker (tansu) must be running: scripts/services.sh starts it");
        let sink = KafkaSink::connect(KafkaConfig::from_url(&kafka_url()).unwrap()).unwrap();
        Self {
            name,
            partitions: 3,
            sink: Arc::new(sink),
        }
    }

    fn source(&self) -> String {
        format!("{}?topic={}", kafka_url(), self.name)
    }

    /// Publishes like `outbox relay` does: the relay's headers, the aggregate id as record key
    /// (so a key's messages share a partition), through the relay's own sink.
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

    /// A consumer of group `outbox-inbox` with every partition assigned at the group's
    /// committed offsets (the beginning where there are none), like the daemon's.
    fn consumer(&self) -> BaseConsumer {
        let c: BaseConsumer = client_config(&brokers())
            .set("group.id", "outbox-inbox")
            .set("enable.auto.commit", "false")
            .set("auto.offset.reset", "earliest")
            .create()
            .unwrap();
        let mut tpl = TopicPartitionList::new();
        for p in 0..self.partitions {
            tpl.add_partition_offset(&self.name, p, Offset::Stored)
                .unwrap();
        }
        c.assign(&tpl).unwrap();
        c
    }

    /// The offset after the last record of each partition, found by reading the `total`
    /// records of the topic from its start (tansu 0.6's high watermark, from ListOffsets, lags
    /// behind the log end: it cannot be used for this).
    fn ends(&self, total: usize) -> Vec<i64> {
        use rdkafka::Message;
        let c: BaseConsumer = client_config(&brokers())
            .set("group.id", format!("outbox-test-{}", Uuid::now_v7()))
            .set("enable.auto.commit", "false")
            .create()
            .unwrap();
        let mut tpl = TopicPartitionList::new();
        for p in 0..self.partitions {
            tpl.add_partition_offset(&self.name, p, Offset::Beginning)
                .unwrap();
        }
        c.assign(&tpl).unwrap();
        let mut ends = vec![0; self.partitions as usize];
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut seen = 0;
        while seen < total {
            assert!(Instant::now() < deadline, "read only {seen} of {total}");
            if let Some(Ok(m)) = c.poll(Duration::from_millis(100)) {
                ends[m.partition() as usize] = m.offset() + 1;
                seen += 1;
            }
        }
        ends
    }

    /// The committed offset of each partition for group `outbox-inbox` (-1: none).
    fn committed(&self) -> Vec<i64> {
        let c = self.consumer();
        let mut tpl = TopicPartitionList::new();
        for p in 0..self.partitions {
            tpl.add_partition(&self.name, p);
        }
        let committed = c.committed_offsets(tpl, Duration::from_secs(10)).unwrap();
        (0..self.partitions)
            .map(
                |p| match committed.find_partition(&self.name, p).map(|e| e.offset()) {
                    Some(Offset::Offset(n)) => n,
                    _ => -1,
                },
            )
            .collect()
    }

    /// Commits the end of every partition for group `outbox-inbox`, the topic holding `total`
    /// records: as if all of them had been ingested.
    fn commit_end(&self, total: usize) {
        let c = self.consumer();
        let mut tpl = TopicPartitionList::new();
        for (p, end) in self.ends(total).into_iter().enumerate() {
            tpl.add_partition_offset(&self.name, p as i32, Offset::Offset(end))
                .unwrap();
        }
        c.commit(&tpl, CommitMode::Sync).unwrap();
    }

    async fn drop_all(self) {
        let _ = delete_topic(&brokers(), &self.name).await;
    }
}

/// Waits until the group's committed offset is the end of every partition of `topic`, which
/// holds `total` records.
async fn wait_drained(topic: &Topic, total: usize, limit: Duration) {
    let ends = tokio::task::block_in_place(|| topic.ends(total));
    let deadline = Instant::now() + limit;
    loop {
        let committed = tokio::task::block_in_place(|| topic.committed());
        if committed == ends {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "committed offsets {committed:?} did not reach the ends {ends:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inbox_killed_with_sigkill_mid_stream_from_kafka_loses_nothing_and_records_nothing_twice() {
    let inbox = Inbox::new().await;
    let topic = Topic::new().await;
    let msgs = workload(20, 150, 0);
    topic.publish(&msgs).await;
    let mut a = inbox.daemon(&topic.source(), 100);
    inbox.wait_count(600, Duration::from_secs(60)).await;
    a.kill().unwrap(); // SIGKILL: the batch in hand is neither committed nor acknowledged
    a.wait().unwrap();
    let at_kill = inbox.count().await;
    assert!(
        at_kill < msgs.len() as i64,
        "the daemon finished before it was killed: nothing tested"
    );
    // More arrive while no daemon runs.
    let more = workload(20, 10, 150);
    topic.publish(&more).await;
    let all: Vec<_> = msgs.iter().chain(&more).cloned().collect();
    let mut b = inbox.daemon(&topic.source(), 100);
    inbox
        .wait_count(all.len() as i64, Duration::from_secs(60))
        .await;
    wait_drained(&topic, all.len(), Duration::from_secs(30)).await;
    inbox.check(&all).await;
    sigterm(&b);
    assert!(wait_exit(&mut b, Duration::from_secs(15)).success());
    topic.drop_all().await;
    inbox.drop_all().await;
}

/// A consumer of the daemon's group fetched records and died without committing them: the
/// daemon records them before anything newer, every key in publish order; records before the
/// group's committed offset (ingested earlier) are not read again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_a_dead_consumer_fetched_from_kafka_are_recorded_before_anything_newer() {
    let inbox = Inbox::new().await;
    let topic = Topic::new().await;
    let earlier = workload(5, 10, 0);
    topic.publish(&earlier).await;
    tokio::task::block_in_place(|| topic.commit_end(earlier.len()));
    let msgs = workload(5, 40, 10);
    topic.publish(&msgs).await;
    // The dead consumer: fetches 30 records from the committed offsets, commits nothing.
    tokio::task::block_in_place(|| {
        let c = topic.consumer();
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut fetched = 0;
        while fetched < 30 {
            assert!(Instant::now() < deadline, "fetched only {fetched}");
            if let Some(Ok(_)) = c.poll(Duration::from_millis(100)) {
                fetched += 1;
            }
        }
    });
    let mut d = inbox.daemon(&topic.source(), 100);
    inbox
        .wait_count(msgs.len() as i64, Duration::from_secs(60))
        .await;
    wait_drained(&topic, earlier.len() + msgs.len(), Duration::from_secs(30)).await;
    inbox.check(&msgs).await;
    sigterm(&d);
    assert!(wait_exit(&mut d, Duration::from_secs(15)).success());
    topic.drop_all().await;
    inbox.drop_all().await;
}

/// URL and configuration mistakes stop `outbox inbox` at once with an error that names the
/// problem, and never shows the password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_kafka_source_is_a_clear_error_without_the_password() {
    let inbox = Inbox::new().await;
    let missing = outbox_testkit::unique_name("ibx_missing");
    for (source, says) in [
        (
            "kafka://app:hunter2@127.0.0.1:9092?topic=orders".to_string(),
            "credentials",
        ),
        (kafka_url(), "name the topic"),
        (format!("{}?topic=t&bogus=1", kafka_url()), "`bogus`"),
        (format!("{}?topic={missing}", kafka_url()), "no topic"),
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
