//! Kafka (tansu): a topic of three partitions and a consumer group per channel.

use std::time::{Duration, Instant};

use async_trait::async_trait;
use uuid::Uuid;

use super::{env_or, settle, with_password, SETTLE};
use crate::source_suite::{Channel, Mistake, Order, SourceFixture, SECRET};
use crate::unique_name;

/// Kafka (tansu, `OUTBOX_TEST_KAFKA_URL`): a topic of three partitions per channel, the group
/// `outbox-inbox`; drained when the group's committed offsets reach every partition's end.
pub struct Kafka(String);

impl Kafka {
    /// The shared broker.
    pub fn new() -> Self {
        Self(env_or("OUTBOX_TEST_KAFKA_URL", "kafka://127.0.0.1:9092"))
    }

    fn brokers(&self) -> String {
        outbox_sinks::kafka::KafkaConfig::from_url(&self.0)
            .unwrap()
            .brokers
    }
}

/// A topic of its own with three partitions.
pub struct KafkaChannel {
    url: String,
    brokers: String,
    /// The topic's name.
    pub topic: String,
    partitions: i32,
}

impl KafkaChannel {
    /// A consumer of group `outbox-inbox` with every partition assigned at the group's
    /// committed offsets.
    fn consumer(&self) -> rdkafka::consumer::BaseConsumer {
        use rdkafka::consumer::Consumer;
        let c: rdkafka::consumer::BaseConsumer = outbox_sinks::kafka::client_config(&self.brokers)
            .set("group.id", "outbox-inbox")
            .set("enable.auto.commit", "false")
            .create()
            .unwrap();
        let mut tpl = rdkafka::TopicPartitionList::new();
        for p in 0..self.partitions {
            tpl.add_partition_offset(&self.topic, p, rdkafka::Offset::Stored)
                .unwrap();
        }
        c.assign(&tpl).unwrap();
        c
    }

    /// The offset after the last record of each partition, found by reading the `total`
    /// records of the topic from its start (tansu 0.6's high watermark, from ListOffsets, lags
    /// behind the log end: it cannot be used for this).
    fn ends(&self, total: usize) -> Vec<i64> {
        use rdkafka::consumer::Consumer;
        use rdkafka::Message;
        let c: rdkafka::consumer::BaseConsumer = outbox_sinks::kafka::client_config(&self.brokers)
            .set("group.id", format!("outbox-test-{}", Uuid::now_v7()))
            .set("enable.auto.commit", "false")
            .create()
            .unwrap();
        let mut tpl = rdkafka::TopicPartitionList::new();
        for p in 0..self.partitions {
            tpl.add_partition_offset(&self.topic, p, rdkafka::Offset::Beginning)
                .unwrap();
        }
        c.assign(&tpl).unwrap();
        let mut ends = vec![0; self.partitions as usize];
        let deadline = Instant::now() + SETTLE;
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
        use rdkafka::consumer::Consumer;
        let mut tpl = rdkafka::TopicPartitionList::new();
        for p in 0..self.partitions {
            tpl.add_partition(&self.topic, p);
        }
        let committed = self
            .consumer()
            .committed_offsets(tpl, Duration::from_secs(10))
            .unwrap();
        (0..self.partitions)
            .map(
                |p| match committed.find_partition(&self.topic, p).map(|e| e.offset()) {
                    Some(rdkafka::Offset::Offset(n)) => n,
                    _ => -1,
                },
            )
            .collect()
    }
}

#[async_trait]
impl Channel for KafkaChannel {
    fn source_url(&self) -> String {
        format!("{}?topic={}", self.url, self.topic)
    }
    fn sink_url(&self) -> String {
        self.url.clone()
    }
    fn destination(&self) -> String {
        self.topic.clone()
    }
    async fn assert_drained(&mut self, published: usize) {
        let me = &*self;
        let ends = &tokio::task::block_in_place(|| me.ends(published));
        settle("the group's committed offsets", || async move {
            let committed = tokio::task::block_in_place(|| me.committed());
            (committed != *ends).then(|| format!("committed {committed:?}, ends {ends:?}"))
        })
        .await;
    }
    async fn cleanup(self: Box<Self>) {
        let _ = outbox_sinks::kafka::delete_topic(&self.brokers, &self.topic).await;
    }
}

#[async_trait]
impl SourceFixture for Kafka {
    async fn channel(&self, tag: &str) -> Box<dyn Channel> {
        let topic = unique_name(tag);
        outbox_sinks::kafka::create_topic(&self.brokers(), &topic, 3)
            .await
            .expect("the Kafka broker (tansu) must be running: scripts/services.sh starts it");
        Box::new(KafkaChannel {
            url: self.0.clone(),
            brokers: self.brokers(),
            topic,
            partitions: 3,
        })
    }
    fn order(&self) -> Order {
        // Per partition, and a key's messages share one partition.
        Order::PerKey
    }
    fn mistakes(&self) -> Vec<Mistake> {
        let missing = unique_name("ibx_missing");
        vec![
            Mistake::new(
                format!("{}?topic=orders", with_password(&self.0, "app")),
                "credentials",
            ),
            Mistake::new(self.0.clone(), "name the topic"),
            Mistake::new(format!("{}?topic=t&bogus={SECRET}", self.0), "`bogus`"),
            Mistake::new(format!("{}?topic={missing}", self.0), "no topic"),
        ]
    }
}
