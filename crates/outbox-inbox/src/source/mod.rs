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

/// One source as the registry knows it: what `open`, `check` and `available` read, so no
/// function matches a URL scheme of its own. Each source file defines `pub(super) const KIND`.
pub struct SourceKind {
    /// The URL schemes it answers to, without `:` (`nats` and `tls`).
    pub schemes: &'static [&'static str],
    /// How it is listed to users (`nats://`).
    pub listed: &'static str,
    /// Parses the URL and connects.
    pub open: for<'a> fn(&'a str, &'a SourceOptions) -> Opening<'a>,
    /// Checks the URL without contacting anything.
    pub check: fn(&str) -> Result<()>,
}

/// A source being opened.
pub type Opening<'a> = futures::future::BoxFuture<'a, Result<Box<dyn Source>>>;

/// Every source this build has, one line per broker, in the order they are listed to users.
pub static SOURCES: &[SourceKind] = &[
    #[cfg(feature = "nats")]
    nats::KIND,
    #[cfg(feature = "redis")]
    redis::KIND,
    #[cfg(feature = "kafka")]
    kafka::KIND,
    #[cfg(feature = "amqp")]
    amqp::KIND,
    #[cfg(feature = "sqs")]
    sqs::KIND,
    #[cfg(feature = "mqtt")]
    mqtt::KIND,
];

/// Boxes an open future for [`SourceKind::open`].
#[cfg(any(
    feature = "nats",
    feature = "redis",
    feature = "kafka",
    feature = "amqp",
    feature = "sqs",
    feature = "mqtt"
))]
fn boxed<'a, S: Source + 'static>(
    open: impl std::future::Future<Output = Result<S>> + Send + 'a,
) -> Opening<'a> {
    Box::pin(async move { Ok(Box::new(open.await?) as Box<dyn Source>) })
}

/// The scheme of `url`: what comes before the first `:` (empty without one).
fn scheme(url: &str) -> &str {
    url.split_once(':').map(|(s, _)| s).unwrap_or("")
}

fn find(url: &str) -> Option<&'static SourceKind> {
    let scheme = scheme(url);
    SOURCES.iter().find(|k| k.schemes.contains(&scheme))
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
    match find(url) {
        Some(kind) => (kind.open)(url, options).await,
        None => Err(unknown_scheme(url)),
    }
}

/// Checks the source URL `url` without contacting anything: its scheme is one this build reads
/// and its options parse. `outbox inbox` runs this before it connects to the database, so a
/// misspelt source is reported first.
pub fn check(url: &str) -> Result<()> {
    match find(url) {
        Some(kind) => (kind.check)(url),
        None => Err(unknown_scheme(url)),
    }
}

fn unknown_scheme(url: &str) -> Error {
    Error::config(format!(
        "source `{}`: unknown or disabled source scheme `{}`; this build reads: {}",
        outbox_core::redact::url(url),
        scheme(url),
        available().join(", ")
    ))
}

/// Source URL schemes this build can consume from.
pub fn available() -> Vec<&'static str> {
    SOURCES.iter().map(|k| k.listed).collect()
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
