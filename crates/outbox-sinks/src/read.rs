//! Independent readers of what reached a broker, and scratch destinations to publish into.
//!
//! `outbox verify`, `outbox demo`, `outbox bench` and the integration tests all check the relay
//! from the broker's side, through one [`Reader`] per sink. Each sink folder provides its own
//! (`nats/reader.rs`, `file/reader.rs`, …) and a [`Scratch`]: a stream, topic, queue or file
//! with a random suffix, so runs never share state and can go in parallel.
//!
//! A reader is a consumer of its own, separate from the relay: it sees exactly what any
//! consumer of the broker would, duplicates included (a broker without dedupe may deliver a
//! message twice; the checker counts that, it does not hide it).

use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use outbox_core::sink::{HEADER_AGGREGATE_ID, HEADER_MESSAGE_ID};
use outbox_core::Error;
use uuid::Uuid;

/// One message as a consumer of the broker sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Delivered {
    /// The message id (from the broker's dedupe field, or the `outbox-message-id` header).
    pub id: Uuid,
    /// Where it arrived: subject, topic, queue, stream or URL path.
    pub destination: String,
    /// The ordering key as the broker carries it (Kafka key, SQS group, `outbox-aggregate-id`).
    pub key: String,
    /// Headers or attributes, as the broker returned them.
    pub headers: Vec<(String, String)>,
    /// The payload, byte for byte.
    pub payload: Bytes,
}

impl Delivered {
    /// The value of header `name` (compared without regard to case), if present.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// A delivery read from headers: the id from `outbox-message-id`, the key from
    /// `outbox-aggregate-id`. `None` when the id is missing or not a UUID (an unreadable item).
    pub fn from_headers(
        destination: String,
        headers: Vec<(String, String)>,
        payload: Bytes,
    ) -> Option<Self> {
        let find = |name: &str| {
            headers
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.clone())
        };
        // CloudEvents binary mode on SQS/SNS and MQTT leaves the `outbox-*` duplicates out:
        // the id and the key are the `ce-id` and `ce-subject` attributes there (`id` and
        // `subject` user properties on MQTT).
        let id = find(HEADER_MESSAGE_ID)
            .or_else(|| find("ce-id"))
            .or_else(|| find("id"))?
            .parse()
            .ok()?;
        let key = find(HEADER_AGGREGATE_ID)
            .or_else(|| find("ce-subject"))
            .or_else(|| find("subject"))
            .unwrap_or_default();
        Some(Self {
            id,
            destination,
            key,
            headers,
            payload,
        })
    }
}

/// What one [`Reader::poll`] returns.
#[derive(Debug, Default)]
pub struct Polled {
    /// Messages that arrived since the last poll, in the order the broker gave them.
    pub delivered: Vec<Delivered>,
    /// Items that could not be read as messages (a torn line, a message without an id).
    pub unreadable: usize,
}

/// An independent consumer of one scratch destination.
#[async_trait]
pub trait Reader: Send {
    /// Everything that arrived since the last call, waiting at most about `wait` for the first
    /// item. Never fails half-way: what was read is returned, so nothing consumed is dropped;
    /// a broker that is down yields nothing until it is back (the reader reconnects).
    async fn poll(&mut self, wait: Duration) -> Polled;

    /// What this reader reads, for reports (`NATS JetStream stream OUTBOX_…`).
    fn describe(&self) -> String;

    /// Deletes the scratch destination (best effort: a failure leaves a named leftover).
    async fn cleanup(&mut self);

    /// A second reader of the same destination, from its start, where the broker keeps what
    /// was read (a Kafka topic's log): when a message is missing, it tells one the broker holds
    /// but the first reader skipped from one the broker does not have. `None` where reading
    /// takes messages away (queues) or the broker keeps no history to read again.
    async fn fresh_reader(&mut self) -> Option<Box<dyn Reader>> {
        None
    }
}

/// What a scratch destination is for; sinks size or name it accordingly.
#[derive(Debug, Clone)]
pub struct ScratchOptions {
    /// A short lower-case word naming the user (`verify`, `bench`, a test's name), part of
    /// every name made, with a random suffix after it.
    pub tag: String,
    /// Keep messages on disk where the broker offers the choice (NATS file storage); `false`
    /// for benchmarks that want the broker's memory storage.
    pub durable: bool,
    /// Partitions of a Kafka topic (and shards where a broker has them).
    pub partitions: u32,
    /// A FIFO queue or topic where the broker has both kinds (SQS, SNS).
    pub fifo: bool,
}

impl ScratchOptions {
    /// Durable, 8 partitions, not FIFO.
    pub fn new(tag: &str) -> Self {
        Self {
            tag: tag.to_ascii_lowercase(),
            durable: true,
            partitions: 8,
            fifo: false,
        }
    }

    /// `tag` and a random hex suffix joined by `_`: a name no other run uses.
    pub fn unique_name(&self) -> String {
        format!(
            "outbox_{}_{:012x}",
            self.tag,
            fastrand::u64(..) & 0xffff_ffff_ffff
        )
    }
}

/// A destination made for one run, the relay settings that publish into it, and a reader of it.
pub struct Scratch {
    /// The sink URL to give the relay (the caller's URL, with any option the scratch needs).
    pub sink_url: String,
    /// The destination template that routes every row into the scratch destination.
    pub destination: String,
    /// The independent consumer.
    pub reader: Box<dyn Reader>,
}

/// Makes a scratch destination on the broker `url` names, and a reader of it.
pub async fn scratch(url: &str, options: &ScratchOptions) -> Result<Scratch, Error> {
    match crate::registry::find(crate::SINKS, url).and_then(|k| k.scratch) {
        Some(make) => make(url, options).await,
        None => Err(Error::config(format!(
            "sink `{}`: no reader for scheme `{}` in this build; readers exist for: {}",
            outbox_core::redact::url(url),
            crate::registry::scheme(url),
            readable().join(", ")
        ))),
    }
}

/// URL schemes this build can read back.
pub fn readable() -> Vec<&'static str> {
    crate::SINKS
        .iter()
        .filter(|k| k.scratch.is_some())
        .flat_map(|k| k.listed.iter().copied())
        .collect()
}

/// Polls `reader` until `want` returns true for what was read so far or `limit` passes;
/// returns everything read. For tests and benches that wait for N messages.
pub async fn read_until(
    reader: &mut dyn Reader,
    limit: Duration,
    mut want: impl FnMut(&[Delivered]) -> bool,
) -> Polled {
    let deadline = tokio::time::Instant::now() + limit;
    let mut all = Polled::default();
    while !want(&all.delivered) && tokio::time::Instant::now() < deadline {
        let p = reader.poll(Duration::from_millis(250)).await;
        all.delivered.extend(p.delivered);
        all.unreadable += p.unreadable;
    }
    all
}
