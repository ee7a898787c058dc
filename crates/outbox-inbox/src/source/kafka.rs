//! [`KafkaSource`]: every partition of one Kafka topic, its offsets committed to a consumer
//! group only after the ingest committed.
//!
//! Records written by the Kafka sink of `outbox relay` carry the `outbox-message-id`,
//! `outbox-event-type` and `outbox-aggregate-id` headers and the aggregate id as record key;
//! other records are read as well: type = the topic, key = the record key, and a stable id made
//! from the topic, partition and offset.
//!
//! **Order across crashes.** Kafka keeps order per partition, and the sink sends every message
//! of a key to one partition, so per-partition order is per-key order. The source assigns
//! itself every partition of the topic (no group rebalancing: one daemon ingests a source at a
//! time, see the daemon) and commits, after each batch committed in the inbox, the offset after
//! the last record of that batch in each partition. [`Source::recover`] rewinds every partition
//! to its committed offset: what a dead predecessor (or this daemon before it lost its database
//! connection) fetched and never committed is simply read again, first, because it sits right
//! after that offset. Kafka needs no redelivery timer for that, so recovery waits for nothing.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use outbox_core::options::{QueryOptions, Role};
use outbox_core::{Error, ErrorKind, Result};
use outbox_sinks::kafka::{client_config, parse_brokers, record_headers, topic_partitions};
use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use tracing::info;

use super::{AckInner, AckToken, Delivery, Source, SourceRetention};
use crate::message::{position_id, InboxMessage};

/// Default consumer group (where the committed offsets live).
pub const DEFAULT_GROUP: &str = "outbox-inbox";

/// Longest wait for one request to the broker (committed offsets, a commit, the topic's
/// configuration): a broker that never answers becomes an error, not a hang.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a fetch waits for the first record before it answers "nothing now" (the daemon
/// polls again, backing off while the topic is idle).
const FIRST_RECORD_WAIT: Duration = Duration::from_millis(100);
/// How long a fetch that has records waits for one more before it hands out what it has:
/// records librdkafka already prefetched arrive at once.
const NEXT_RECORD_WAIT: Duration = Duration::from_millis(5);

/// Where a group without a committed offset for a partition starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KafkaStart {
    /// The partition's first record still kept (the default: nothing already in the topic is
    /// skipped).
    Earliest,
    /// Only records written after the daemon first assigned the partition.
    Latest,
}

/// Where and how to consume.
#[derive(Debug, Clone)]
pub struct KafkaSourceConfig {
    /// Bootstrap servers (`host:port,…`), parsed like the sink's.
    pub brokers: String,
    /// The topic; every one of its partitions is consumed.
    pub topic: String,
    /// The consumer group whose committed offsets say where to resume.
    pub group: String,
    /// Where a partition without a committed offset starts.
    pub start: KafkaStart,
    /// The `source` column: `kafka:<topic>` unless given.
    pub name: String,
}

impl KafkaSourceConfig {
    /// Parses `kafka://host:port[,host:port…]?topic=T[&group=G][&start=earliest|latest]
    /// [&name=N]`.
    pub fn from_url(url: &str) -> Result<Self> {
        let brokers = parse_brokers(url)?;
        let (_, o) =
            QueryOptions::from_url(Role::Source, url, &["topic", "group", "start", "name"])?;
        let topic = o.str("topic");
        let group = o.non_empty("group")?.unwrap_or(DEFAULT_GROUP).to_string();
        // earliest: the whole topic (the default); latest: new records only.
        let start = o
            .one_of(
                "start",
                &[
                    ("earliest", KafkaStart::Earliest),
                    ("latest", KafkaStart::Latest),
                ],
            )?
            .unwrap_or(KafkaStart::Earliest);
        let name = o.non_empty("name")?;
        let topic = topic.filter(|s| !s.is_empty()).ok_or_else(|| {
            Error::config(format!(
                "source `{}`: name the topic, e.g. kafka://127.0.0.1:9092?topic=orders",
                outbox_core::redact::url(url)
            ))
        })?;
        let valid = topic.len() <= 249
            && topic != "."
            && topic != ".."
            && topic
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
        if !valid {
            return Err(Error::config(format!(
                "source option topic=`{topic}`: not a Kafka topic name (1 to 249 of a-z, A-Z, \
                 0-9, `.`, `_`, `-`)"
            )));
        }
        Ok(Self {
            brokers,
            name: name.map_or_else(|| format!("kafka:{topic}"), str::to_string),
            topic: topic.to_string(),
            group,
            start,
        })
    }
}

/// Every partition of a Kafka topic as an inbox source, offsets committed after the ingest.
pub struct KafkaSource {
    cfg: KafkaSourceConfig,
    /// Shared with the blocking threads that commit and read committed offsets.
    consumer: Arc<StreamConsumer>,
    /// Partitions assigned by the last [`Source::recover`].
    partitions: usize,
}

fn kafka_error(what: &str, e: impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::Connection, format!("kafka source: {what}: {e}"))
}

/// Runs a blocking librdkafka call off the runtime's threads, for at most `REQUEST_TIMEOUT`
/// (librdkafka's own timeouts bound it too; this one holds even if they do not).
async fn blocking<T: Send + 'static>(
    what: &str,
    f: impl FnOnce() -> std::result::Result<T, rdkafka::error::KafkaError> + Send + 'static,
) -> Result<T> {
    match tokio::time::timeout(
        REQUEST_TIMEOUT + Duration::from_secs(1),
        tokio::task::spawn_blocking(f),
    )
    .await
    {
        Ok(Ok(Ok(v))) => Ok(v),
        Ok(Ok(Err(e))) => Err(kafka_error(what, e)),
        Ok(Err(e)) => Err(kafka_error(what, e)),
        Err(_) => Err(kafka_error(
            what,
            format!("no answer from the broker within {REQUEST_TIMEOUT:?}"),
        )),
    }
}

impl KafkaSource {
    /// Checks that the topic exists and creates the consumer (which connects in the
    /// background). A missing topic is a config error: the source never creates one.
    pub async fn connect(cfg: KafkaSourceConfig) -> Result<Self> {
        let partitions = topic_partitions(&cfg.brokers, &cfg.topic).await?;
        if partitions == 0 {
            return Err(Error::config(format!(
                "kafka source: no topic `{}` on {} (create it first; the source only reads)",
                cfg.topic, cfg.brokers
            )));
        }
        let consumer: StreamConsumer = client_config(&cfg.brokers)
            .set("client.id", "outbox-inbox")
            .set("group.id", &cfg.group)
            // Offsets are committed by `ack` alone, after the insert committed.
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set(
                "auto.offset.reset",
                match cfg.start {
                    KafkaStart::Earliest => "earliest",
                    KafkaStart::Latest => "latest",
                },
            )
            .create()
            .map_err(|e| {
                Error::with_source(ErrorKind::Config, format!("kafka source: consumer: {e}"), e)
            })?;
        Ok(Self {
            cfg,
            consumer: Arc::new(consumer),
            partitions: 0,
        })
    }

    fn delivery(&self, m: &impl Message) -> Delivery {
        let (partition, offset) = (m.partition(), m.offset());
        let position = format!("{partition}:{offset}");
        let key = m.key().map(|k| String::from_utf8_lossy(k).into_owned());
        let mut message = InboxMessage::from_broker(
            &self.cfg.name,
            m.payload().unwrap_or_default(),
            record_headers(m),
            position_id(&format!("kafka:{}", self.cfg.topic), &position),
            &self.cfg.topic,
            key.as_deref(),
        );
        message.source_position = Some(position);
        Delivery {
            message,
            ack: AckToken(AckInner::Kafka { partition, offset }),
        }
    }
}

#[async_trait]
impl Source for KafkaSource {
    fn name(&self) -> &str {
        &self.cfg.name
    }

    fn describe(&self) -> String {
        format!(
            "Kafka topic {} (group {}) at {}",
            self.cfg.topic, self.cfg.group, self.cfg.brokers
        )
    }

    /// Assigns every partition of the topic at its committed offset (or `start` where the
    /// group has none), dropping whatever was fetched before: records fetched and never
    /// committed, by a dead daemon or by this one, are read again first.
    async fn recover(&mut self) -> Result<()> {
        let partitions = topic_partitions(&self.cfg.brokers, &self.cfg.topic).await?;
        if partitions == 0 {
            return Err(kafka_error(
                "recovering",
                format!("topic `{}` is gone", self.cfg.topic),
            ));
        }
        let mut wanted = TopicPartitionList::new();
        for p in 0..i32::try_from(partitions).unwrap_or(i32::MAX) {
            wanted.add_partition(&self.cfg.topic, p);
        }
        let consumer = self.consumer.clone();
        let committed = blocking("reading the committed offsets", move || {
            consumer.committed_offsets(wanted, REQUEST_TIMEOUT)
        })
        .await?;
        let mut assignment = TopicPartitionList::new();
        let mut resume = BTreeMap::new();
        for e in committed.elements() {
            let offset = match e.offset() {
                Offset::Offset(n) => {
                    resume.insert(e.partition(), n.to_string());
                    Offset::Offset(n)
                }
                // No committed offset yet: `start`.
                _ => {
                    resume.insert(e.partition(), "start".to_string());
                    match self.cfg.start {
                        KafkaStart::Earliest => Offset::Beginning,
                        KafkaStart::Latest => Offset::End,
                    }
                }
            };
            assignment
                .add_partition_offset(&self.cfg.topic, e.partition(), offset)
                .map_err(|e| kafka_error("assigning", e))?;
        }
        // Unassign first: records prefetched under the old assignment are dropped with it,
        // so the next fetch starts exactly at the committed offsets.
        self.consumer
            .unassign()
            .map_err(|e| kafka_error("unassigning", e))?;
        self.consumer
            .assign(&assignment)
            .map_err(|e| kafka_error("assigning", e))?;
        self.partitions = partitions;
        info!(source = %self.cfg.name, partitions, resume_at = ?resume,
              "resuming every partition at the group's committed offset: records fetched and never committed come first");
        Ok(())
    }

    async fn fetch(&mut self, max: usize) -> Result<Vec<Delivery>> {
        let mut out = Vec::new();
        while out.len() < max.max(1) {
            let wait = if out.is_empty() {
                FIRST_RECORD_WAIT
            } else {
                NEXT_RECORD_WAIT
            };
            match tokio::time::timeout(wait, self.consumer.recv()).await {
                Err(_) => break,
                Ok(Ok(m)) => out.push(self.delivery(&m)),
                // An error is not a record (librdkafka reconnects and fetches on from the next
                // offset): hand out what came before it, or report it.
                Ok(Err(e)) if out.is_empty() => return Err(kafka_error("fetch", e)),
                Ok(Err(_)) => break,
            }
        }
        Ok(out)
    }

    /// Commits, per partition, the offset after the last record of `acks` (a commit covers
    /// every earlier offset of the partition: the daemon acknowledges whole batches, in
    /// order).
    async fn ack(&mut self, acks: Vec<AckToken>) -> Result<()> {
        let mut next: BTreeMap<i32, i64> = BTreeMap::new();
        for a in acks {
            #[allow(irrefutable_let_patterns)]
            if let AckInner::Kafka { partition, offset } = a.0 {
                let e = next.entry(partition).or_insert(offset + 1);
                *e = (*e).max(offset + 1);
            }
        }
        if next.is_empty() {
            return Ok(());
        }
        let mut tpl = TopicPartitionList::new();
        for (p, o) in &next {
            tpl.add_partition_offset(&self.cfg.topic, *p, Offset::Offset(*o))
                .map_err(|e| kafka_error("committing", e))?;
        }
        let consumer = self.consumer.clone();
        blocking("committing offsets", move || {
            consumer.commit(&tpl, CommitMode::Sync)
        })
        .await
    }

    /// The topic's `retention.ms` (`-1`: unlimited).
    async fn retention(&mut self) -> Result<SourceRetention> {
        let admin: AdminClient<DefaultClientContext> = client_config(&self.cfg.brokers)
            .create()
            .map_err(|e| kafka_error("admin client", e))?;
        let opts = AdminOptions::new().request_timeout(Some(REQUEST_TIMEOUT));
        let described = tokio::time::timeout(
            REQUEST_TIMEOUT + Duration::from_secs(1),
            admin.describe_configs([&ResourceSpecifier::Topic(&self.cfg.topic)], &opts),
        )
        .await
        .map_err(|_| kafka_error("describing the topic", "no answer"))?
        .map_err(|e| kafka_error("describing the topic", e))?;
        let value = described
            .into_iter()
            .next()
            .and_then(|r| r.ok())
            .and_then(|r| {
                r.get("retention.ms")
                    .and_then(|e| e.value.clone())
                    .and_then(|v| v.parse::<i64>().ok())
            });
        Ok(match value {
            Some(ms) if ms < 0 => SourceRetention::Unlimited,
            Some(ms) => SourceRetention::For(Duration::from_millis(ms.unsigned_abs())),
            None => SourceRetention::Unknown,
        })
    }
}

/// This source's entry in [`super::SOURCES`].
pub(super) const KIND: super::SourceKind = super::SourceKind {
    schemes: &["kafka"],
    listed: "kafka://",
    open: |url, _| {
        super::boxed(async move { KafkaSource::connect(KafkaSourceConfig::from_url(url)?).await })
    },
    check: |url| KafkaSourceConfig::from_url(url).map(|_| ()),
};

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn url_options_parse() {
        let c = KafkaSourceConfig::from_url(
            "kafka://127.0.0.1:9092,k2:9093?topic=orders&group=g&start=latest&name=n",
        )
        .unwrap();
        assert_eq!(c.brokers, "127.0.0.1:9092,k2:9093");
        assert_eq!(
            (c.topic.as_str(), c.group.as_str(), c.name.as_str()),
            ("orders", "g", "n")
        );
        assert_eq!(c.start, KafkaStart::Latest);
        let d = KafkaSourceConfig::from_url("kafka://h:9092?topic=orders").unwrap();
        assert_eq!(
            (d.group.as_str(), d.name.as_str(), d.start),
            (DEFAULT_GROUP, "kafka:orders", KafkaStart::Earliest)
        );
    }

    #[test]
    fn bad_urls_are_config_errors_that_name_the_problem() {
        for (url, says) in [
            ("kafka://h:9092", "name the topic"),
            ("kafka://h:9092?topic=a b", "not a Kafka topic name"),
            ("kafka://h:9092?topic=t&start=now", "start=`now`"),
            ("kafka://h:9092?topic=t&bogus=1", "`bogus` is not known"),
            ("kafka://a,,b?topic=t", "is not a host:port"),
        ] {
            let e = KafkaSourceConfig::from_url(url).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Config);
            assert!(e.to_string().contains(says), "{url}: {e}");
        }
        let e = KafkaSourceConfig::from_url("kafka://app:hunter2@h:9092?topic=t")
            .unwrap_err()
            .to_string();
        assert!(e.contains("credentials") && !e.contains("hunter2"), "{e}");
    }
}
