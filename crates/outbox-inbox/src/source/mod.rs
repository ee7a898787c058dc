//! Sources of the ingest daemon: brokers `outbox inbox --source URL` consumes from, one file and
//! one cargo feature per broker (like the sinks).
//!
//! Every source acknowledges only what it is told to, after the daemon's insert committed, and
//! hands out messages in the broker's order. Because the inbox queues messages for processing in
//! the order they are ingested, a source must also bring back, **before anything newer**,
//! what a dead predecessor fetched and never acknowledged ([`Source::recover`]): otherwise a
//! message redelivered late would be handled after later messages of its key.

#[cfg(feature = "amqp")]
mod amqp;
#[cfg(feature = "kafka")]
mod kafka;
#[cfg(feature = "mqtt")]
mod mqtt;
#[cfg(feature = "nats")]
mod nats;
#[cfg(feature = "redis")]
mod redis;
#[cfg(feature = "sqs")]
mod sqs;

use std::time::Duration;

use async_trait::async_trait;
use outbox_core::{Error, Result};

use crate::message::InboxMessage;

#[cfg(feature = "amqp")]
pub use self::amqp::{AmqpSource, AmqpSourceConfig};
#[cfg(feature = "kafka")]
pub use self::kafka::{KafkaSource, KafkaSourceConfig, KafkaStart};
#[cfg(feature = "mqtt")]
pub use self::mqtt::{MqttSource, MqttSourceConfig};
#[cfg(feature = "nats")]
pub use self::nats::{NatsSource, NatsSourceConfig};
#[cfg(feature = "redis")]
pub use self::redis::{RedisSource, RedisSourceConfig};
#[cfg(feature = "sqs")]
pub use self::sqs::{SqsSource, SqsSourceConfig};

/// One message a source delivered, and what acknowledging it takes.
pub struct Delivery {
    /// The message as the inbox records it.
    pub message: InboxMessage,
    /// What [`Source::ack`] needs for it.
    pub ack: AckToken,
}

impl std::fmt::Debug for Delivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Delivery")
            .field("id", &self.message.id)
            .field("position", &self.message.source_position)
            .finish_non_exhaustive()
    }
}

/// What a source needs to acknowledge one delivery (opaque).
pub struct AckToken(pub(crate) AckInner);

pub(crate) enum AckInner {
    #[cfg(feature = "nats")]
    Nats(Box<async_nats::jetstream::Message>),
    #[cfg(feature = "redis")]
    Redis(String),
    /// The record's partition and offset (committing offset + 1 acknowledges it and every
    /// earlier record of its partition).
    #[cfg(feature = "kafka")]
    Kafka { partition: i32, offset: i64 },
    /// The channel the delivery came on (counted by the source) and its delivery tag there.
    #[cfg(feature = "amqp")]
    Amqp { generation: u64, tag: u64 },
    /// An SQS receipt handle.
    #[cfg(feature = "sqs")]
    Sqs(String),
    /// The connection (its CONNACK count) an MQTT message came on, and the message.
    #[cfg(feature = "mqtt")]
    Mqtt(u64, Box<rumqttc::v5::mqttbytes::v5::Publish>),
}

/// How long a source may redeliver a message, as far as it can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceRetention {
    /// It keeps messages this long (NATS stream `max_age`, SQS `MessageRetentionPeriod`).
    For(Duration),
    /// It keeps messages without a time limit.
    Unlimited,
    /// It cannot tell (Redis streams are trimmed by length).
    Unknown,
}

/// A broker the ingest daemon consumes from.
#[async_trait]
pub trait Source: Send {
    /// The `source` column of the messages it delivers, e.g. `nats:ORDERS`.
    fn name(&self) -> &str;

    /// What it reads, for logs (no credentials).
    fn describe(&self) -> String;

    /// Called once before the first fetch: makes sure what a dead predecessor fetched and never
    /// acknowledged is delivered again before anything newer.
    async fn recover(&mut self) -> Result<()>;

    /// Up to `max` messages in the broker's order; an empty batch when none is there now.
    async fn fetch(&mut self, max: usize) -> Result<Vec<Delivery>>;

    /// Acknowledges the deliveries of `acks`, whose insert committed. An acknowledgement that
    /// is lost makes the broker deliver the message again: the inbox absorbs it.
    async fn ack(&mut self, acks: Vec<AckToken>) -> Result<()>;

    /// How long the broker may redeliver a message, to compare with the inbox retention.
    async fn retention(&mut self) -> Result<SourceRetention>;
}

/// Options every source takes from the daemon.
#[derive(Debug, Clone)]
pub struct SourceOptions {
    /// Messages per fetch (the daemon's batch).
    pub batch: usize,
}

/// Opens the source `url` names: `nats://host:4222?stream=S[&durable=D][&subject=F]
/// [&ack_wait=30s][&name=N]` or `redis://host:6379?stream=K[&group=G][&consumer=C][&start=0]
/// [&name=N]` or `kafka://host:9092[,host:9092]?topic=T[&group=G][&start=earliest|latest]
/// [&name=N]` or `amqp[s]://[user:pass@]host[:port][/vhost]?queue=Q[&name=N][&ack_timeout=5s]
/// [&heartbeat=…]` or `sqs://?queue=NAME_OR_URL[&region=R][&endpoint=URL][&visibility_timeout=60s]
/// [&wait=1s][&name=N]` or `mqtt://[user:pass@]host[:port]?topic=FILTER[&client_id=outbox-inbox]
/// [&session_expiry=7d][&keep_alive=30s][&ack_timeout=5s][&name=N]`. Unknown schemes and
/// sources left out of this build are config errors.
pub async fn open(url: &str, options: &SourceOptions) -> Result<Box<dyn Source>> {
    let scheme = url.split_once(':').map(|(s, _)| s).unwrap_or("");
    let _ = options;
    match scheme {
        #[cfg(feature = "nats")]
        "nats" | "tls" => Ok(Box::new(
            NatsSource::connect(NatsSourceConfig::from_url(url)?, options.batch).await?,
        )),
        #[cfg(feature = "redis")]
        "redis" | "rediss" => Ok(Box::new(
            RedisSource::connect(RedisSourceConfig::from_url(url)?).await?,
        )),
        #[cfg(feature = "amqp")]
        "amqp" | "amqps" => Ok(Box::new(
            AmqpSource::connect(AmqpSourceConfig::from_url(url)?, options.batch).await?,
        )),
        #[cfg(feature = "kafka")]
        "kafka" => Ok(Box::new(
            KafkaSource::connect(KafkaSourceConfig::from_url(url)?).await?,
        )),
        #[cfg(feature = "mqtt")]
        "mqtt" | "mqtts" => Ok(Box::new(MqttSource::new(
            MqttSourceConfig::from_url(url)?,
            options.batch,
        ))),
        #[cfg(feature = "sqs")]
        "sqs" => Ok(Box::new(
            SqsSource::connect(SqsSourceConfig::from_url(url)?).await?,
        )),
        _ => Err(unknown_scheme(url, scheme)),
    }
}

/// Checks the source URL `url` without contacting anything: its scheme is one this build reads
/// and its options parse. `outbox inbox` runs this before it connects to the database, so a
/// misspelt source is reported first.
pub fn check(url: &str) -> Result<()> {
    let scheme = url.split_once(':').map(|(s, _)| s).unwrap_or("");
    match scheme {
        #[cfg(feature = "nats")]
        "nats" | "tls" => NatsSourceConfig::from_url(url).map(|_| ()),
        #[cfg(feature = "redis")]
        "redis" | "rediss" => RedisSourceConfig::from_url(url).map(|_| ()),
        #[cfg(feature = "amqp")]
        "amqp" | "amqps" => AmqpSourceConfig::from_url(url).map(|_| ()),
        #[cfg(feature = "kafka")]
        "kafka" => KafkaSourceConfig::from_url(url).map(|_| ()),
        #[cfg(feature = "mqtt")]
        "mqtt" | "mqtts" => MqttSourceConfig::from_url(url).map(|_| ()),
        #[cfg(feature = "sqs")]
        "sqs" => SqsSourceConfig::from_url(url).map(|_| ()),
        _ => Err(unknown_scheme(url, scheme)),
    }
}

fn unknown_scheme(url: &str, scheme: &str) -> Error {
    Error::config(format!(
        "source `{}`: unknown or disabled source scheme `{scheme}`; this build reads: {}",
        outbox_core::redact::url(url),
        available().join(", ")
    ))
}

/// Source URL schemes this build can consume from.
pub fn available() -> Vec<&'static str> {
    let all: &[&str] = &[
        #[cfg(feature = "nats")]
        "nats://",
        #[cfg(feature = "redis")]
        "redis://",
        #[cfg(feature = "kafka")]
        "kafka://",
        #[cfg(feature = "amqp")]
        "amqp://",
        #[cfg(feature = "sqs")]
        "sqs://",
        #[cfg(feature = "mqtt")]
        "mqtt://",
    ];
    all.to_vec()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[tokio::test]
    async fn an_unknown_scheme_names_what_this_build_reads() {
        let e = open("pulsar://u:pw@h:6650", &SourceOptions { batch: 10 })
            .await
            .err()
            .unwrap();
        assert_eq!(e.kind(), outbox_core::ErrorKind::Config);
        assert!(e.to_string().contains("nats://"), "{e}");
        assert!(!e.to_string().contains("pw"), "{e}");
    }
}
