//! [`KafkaReader`]: reads a scratch topic from its start with a consumer of its own.

use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use outbox_core::sink::HEADER_MESSAGE_ID;
use outbox_core::{Error, ErrorKind};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::message::{Headers, Message};
use rdkafka::producer::Producer;
use rdkafka::{Offset, TopicPartitionList};

use super::config::KafkaConfig;
use super::sink::client_config;
use crate::read::{Delivered, Polled, Reader, Scratch, ScratchOptions};

/// How long admin and metadata requests of the reader and the scratch helpers may take.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(10);

fn admin(brokers: &str) -> Result<AdminClient<DefaultClientContext>, Error> {
    client_config(brokers)
        .create()
        .map_err(|e| Error::with_source(ErrorKind::Config, format!("kafka: admin client: {e}"), e))
}

/// Creates topic `name` with `partitions` partitions and replication factor 1 (tests, benches
/// and `verify` run against one broker): the one place they make topics.
pub async fn create_topic(brokers: &str, name: &str, partitions: i32) -> Result<(), Error> {
    let admin = admin(brokers)?;
    let opts = AdminOptions::new().request_timeout(Some(ADMIN_TIMEOUT));
    let results = admin
        .create_topics(
            [&NewTopic::new(name, partitions, TopicReplication::Fixed(1))],
            &opts,
        )
        .await
        .map_err(|e| {
            Error::with_source(
                ErrorKind::Connection,
                format!("kafka: creating topic {name} (is the broker at {brokers} running?): {e}"),
                e,
            )
        })?;
    match results.into_iter().next() {
        Some(Ok(_)) | Some(Err((_, RDKafkaErrorCode::TopicAlreadyExists))) => Ok(()),
        Some(Err((_, code))) => Err(Error::new(
            ErrorKind::Connection,
            format!("kafka: creating topic {name}: {code}"),
        )),
        None => Err(Error::new(
            ErrorKind::Connection,
            format!("kafka: creating topic {name}: no answer"),
        )),
    }
}

/// Deletes topic `name` (best effort: the error says what is left behind).
pub async fn delete_topic(brokers: &str, name: &str) -> Result<(), Error> {
    let admin = admin(brokers)?;
    let opts = AdminOptions::new().request_timeout(Some(ADMIN_TIMEOUT));
    match admin.delete_topics(&[name], &opts).await {
        Ok(results) => match results.into_iter().next() {
            Some(Err((_, code))) => Err(Error::new(
                ErrorKind::Connection,
                format!("kafka: deleting topic {name}: {code}"),
            )),
            _ => Ok(()),
        },
        Err(e) => Err(Error::with_source(
            ErrorKind::Connection,
            format!("kafka: deleting topic {name}: {e}"),
            e,
        )),
    }
}

/// The number of partitions of `topic` (0: no such topic), waiting up to 10 s for a topic just
/// created to show its partitions.
///
/// It reads the whole topic listing, never a metadata request naming the topic: tansu 0.6
/// answers one for a missing topic with a topic entry without a name, which librdkafka 2.12
/// dereferences (a crash in its metadata cache). Every Kafka client of this workspace (the sink,
/// the reader, the inbox's source) checks a topic this way before using it.
pub async fn topic_partitions(brokers: &str, topic: &str) -> Result<usize, Error> {
    let name = topic.to_string();
    let client = client_config(brokers)
        .create::<rdkafka::producer::BaseProducer>()
        .map_err(|e| {
            Error::with_source(ErrorKind::Config, format!("kafka: metadata client: {e}"), e)
        })?;
    // librdkafka's metadata call blocks (bounded by its timeout): off the runtime's threads.
    tokio::task::spawn_blocking(move || {
        let give_up = std::time::Instant::now() + ADMIN_TIMEOUT;
        loop {
            let n = client
                .client()
                .fetch_metadata(None, ADMIN_TIMEOUT)
                .map(|md| {
                    md.topics()
                        .iter()
                        .find(|t| t.name() == name && t.error().is_none())
                        .map(|t| t.partitions().len())
                        .unwrap_or(0)
                });
            if !matches!(n, Ok(0)) || std::time::Instant::now() >= give_up {
                return n;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    })
    .await
    .map_err(|e| Error::new(ErrorKind::Connection, format!("kafka: metadata: {e}")))?
    .map_err(|e| {
        Error::with_source(
            ErrorKind::Connection,
            format!("kafka: metadata of topic {topic} (is the broker at {brokers} running?): {e}"),
            e,
        )
    })
}

/// A consumer of every partition of one topic from its first offset, in no group (partitions
/// assigned, nothing committed): every message once, each partition in log order.
pub struct KafkaReader {
    brokers: String,
    topic: String,
    /// `None` once [`Reader::cleanup`] closed it.
    consumer: Option<StreamConsumer>,
}

impl KafkaReader {
    /// A reader of `topic` on `brokers` from its start.
    pub async fn open(brokers: &str, topic: &str) -> Result<Self, Error> {
        let consumer: StreamConsumer = client_config(brokers)
            // Required by librdkafka even without a group protocol; unique, never committed.
            .set(
                "group.id",
                format!("outbox-reader-{}", uuid::Uuid::now_v7()),
            )
            .set("enable.auto.commit", "false")
            .set("auto.offset.reset", "earliest")
            .create()
            .map_err(|e| {
                Error::with_source(ErrorKind::Config, format!("kafka: consumer: {e}"), e)
            })?;
        let partitions = topic_partitions(brokers, topic).await?;
        if partitions == 0 {
            return Err(Error::config(format!(
                "kafka: no topic {topic} on {brokers}"
            )));
        }
        let mut assignment = TopicPartitionList::new();
        for p in 0..partitions {
            let p = i32::try_from(p).unwrap_or(i32::MAX);
            assignment
                .add_partition_offset(topic, p, Offset::Beginning)
                .map_err(|e| Error::with_source(ErrorKind::Config, format!("kafka: {e}"), e))?;
        }
        consumer
            .assign(&assignment)
            .map_err(|e| Error::with_source(ErrorKind::Config, format!("kafka: assign: {e}"), e))?;
        Ok(Self {
            brokers: brokers.to_string(),
            topic: topic.to_string(),
            consumer: Some(consumer),
        })
    }
}

/// The headers of a consumed record as (name, value) strings, in record order (a value that is
/// not UTF-8 is read lossily, a null value as empty): what the sink wrote, read back.
pub fn record_headers(m: &impl Message) -> Vec<(String, String)> {
    m.headers()
        .map(|h| {
            h.iter()
                .map(|h| {
                    (
                        h.key.to_string(),
                        String::from_utf8_lossy(h.value.unwrap_or_default()).into_owned(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The delivery a consumed record stands for: key from the record key, id from the
/// `outbox-message-id` header. `None` without a readable id.
fn delivered(m: &impl Message) -> Option<Delivered> {
    let headers = record_headers(m);
    let id = headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(HEADER_MESSAGE_ID))
        .and_then(|(_, v)| v.parse().ok())?;
    Some(Delivered {
        id,
        destination: m.topic().to_string(),
        key: String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned(),
        headers,
        payload: Bytes::copy_from_slice(m.payload().unwrap_or_default()),
    })
}

#[async_trait]
impl Reader for KafkaReader {
    async fn poll(&mut self, wait: Duration) -> Polled {
        let mut out = Polled::default();
        let Some(consumer) = &self.consumer else {
            return out;
        };
        // Bounded, so a caller polling a busy topic gets control back regularly.
        let until = tokio::time::Instant::now() + wait.max(Duration::from_millis(20));
        while tokio::time::Instant::now() < until {
            match tokio::time::timeout(Duration::from_millis(20), consumer.recv()).await {
                Ok(Ok(m)) => match delivered(&m) {
                    Some(d) => out.delivered.push(d),
                    None => out.unreadable += 1,
                },
                // A broker going away surfaces as a consumer error; librdkafka reconnects and
                // resumes from the next offset, so nothing consumed is lost: try again.
                Ok(Err(_)) => {}
                Err(_) if out.delivered.is_empty() && out.unreadable == 0 => {}
                Err(_) => break,
            }
        }
        out
    }

    fn describe(&self) -> String {
        format!("Kafka topic {}", self.topic)
    }

    async fn fresh_reader(&mut self) -> Option<Box<dyn Reader>> {
        self.consumer.as_ref()?;
        let reader = KafkaReader::open(&self.brokers, &self.topic).await.ok()?;
        Some(Box::new(reader))
    }

    async fn cleanup(&mut self) {
        // Close the consumer before the topic goes: a client that knows a deleted topic asks
        // tansu about it, and tansu 0.6 answers with a topic entry without a name, which
        // librdkafka 2.12 dereferences (a crash in its metadata cache). Closing blocks.
        if let Some(consumer) = self.consumer.take() {
            let _ = tokio::task::spawn_blocking(move || drop(consumer)).await;
        }
        if let Err(error) = delete_topic(&self.brokers, &self.topic).await {
            tracing::warn!(topic = %self.topic, %error, "could not delete a scratch topic");
        }
    }
}

/// A topic `outbox_<tag>_<suffix>` with `options.partitions` partitions and a reader of it; the
/// relay publishes every row to that topic.
pub(crate) async fn scratch(url: &str, options: &ScratchOptions) -> Result<Scratch, Error> {
    let cfg = KafkaConfig::from_url(url)?;
    let topic = options.unique_name();
    let partitions = i32::try_from(options.partitions.max(1)).unwrap_or(1);
    create_topic(&cfg.brokers, &topic, partitions).await?;
    let reader = match KafkaReader::open(&cfg.brokers, &topic).await {
        Ok(r) => r,
        Err(e) => {
            let _ = delete_topic(&cfg.brokers, &topic).await;
            return Err(e);
        }
    };
    Ok(Scratch {
        sink_url: url.to_string(),
        destination: topic,
        reader: Box::new(reader),
    })
}
