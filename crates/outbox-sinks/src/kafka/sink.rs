//! [`KafkaSink`]: an idempotent librdkafka producer (`acks=all`) that keeps each key's order
//! itself, so the relay may give it several messages of one key in one call.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::future::{join_all, BoxFuture, Shared};
use futures::FutureExt;
use outbox_core::{Envelope, Error, ErrorKind, Sink, SinkError, SinkErrorKind};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use tracing::{info, warn};
use uuid::Uuid;

use super::config::KafkaConfig;
use super::error::{classify, classify_code, missing_topic};

/// Messages librdkafka may hold at once (64 workers × a 10,000-row batch), instead of its
/// default 100,000: the relay's `--batch-bytes` bounds what it claims, this only keeps the
/// client from refusing a batch the relay already holds.
const MAX_QUEUED_MESSAGES: &str = "1000000";

/// A delivery report as the sink waits for it: shared, so a retry of a message whose earlier
/// copy is still queued in librdkafka waits for that copy instead of producing a second one.
type Waiting = Shared<BoxFuture<'static, Result<(), SinkError>>>;

/// The settings every Kafka client of the workspace starts from (the inbox's consumer too):
/// bootstrap servers, and never creating a topic by asking about it.
pub fn client_config(brokers: &str) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", brokers)
        .set("client.id", "outbox-relay")
        // Only the admin API or an operator creates topics (`?create_topics=true`); a metadata
        // request must never create one with the broker's defaults by accident.
        .set("allow.auto.create.topics", "false");
    c
}

/// The producer: idempotent with `acks=all`, which makes librdkafka keep the produce order per
/// partition across its own retries and drop its own retried duplicates (broker-side, by
/// producer id and sequence number).
///
/// Two settings turn that into the guarantee [`Sink::orders_keys`] asks for, that a failed
/// message is never overtaken by a later one of its key:
/// - `message.timeout.ms=0` (no local timeout). librdkafka's gap-less guarantee does not cover
///   messages that time out in its queue: a timed-out message k would leave a gap that k+1
///   could fill (INTRODUCTION.md, "Message timeout considerations"). The sink waits
///   `ack_timeout` for a call instead, and leaves what is still queued to be delivered in order.
/// - `enable.gapless.guarantee=true`. Without it, a batch failing with a permanent error makes
///   librdkafka bump its epoch and send the next batches anyway (a gap); with it, the error is
///   fatal and fails every queued message instead, and the sink replaces the producer.
fn producer_config(cfg: &KafkaConfig) -> ClientConfig {
    let mut c = client_config(&cfg.brokers);
    c.set("enable.idempotence", "true")
        .set("acks", "all")
        .set("enable.gapless.guarantee", "true")
        .set("message.timeout.ms", "0")
        .set("linger.ms", cfg.linger.as_millis().to_string())
        .set(
            "max.in.flight.requests.per.connection",
            cfg.max_in_flight.to_string(),
        )
        .set("queue.buffering.max.messages", MAX_QUEUED_MESSAGES)
        // The Java client's partitioner: a key lands in the same partition whichever client
        // produced it (Kafka Streams, Connect and Java producers co-partition with the relay).
        .set("partitioner", "murmur2_random");
    c
}

/// A topic name Kafka accepts: 1 to 249 of `[a-zA-Z0-9._-]`, not `.` or `..`.
fn valid_topic(topic: &str) -> Result<(), SinkError> {
    let ok = !topic.is_empty()
        && topic.len() <= 249
        && topic != "."
        && topic != ".."
        && topic
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(SinkError::invalid(format!(
            "kafka: `{topic}` is not a valid topic name (1 to 249 of a-z, A-Z, 0-9, `.`, `_`, `-`)"
        )))
    }
}

/// What the sink knows about a destination topic at the start of a call.
#[derive(Debug, Clone, PartialEq)]
enum TopicCheck {
    /// The broker listed it.
    Exists,
    /// The broker said it does not exist (and the sink did not create it): the reason.
    Missing(String),
    /// The broker did not answer: not produced (a topic librdkafka has not seen yet makes it
    /// ask the broker about that topic by name; see `check_topics`), retried as an outage.
    Unknown,
}

/// The delivery reports a call still waits for: put into the sink's `pending` map when dropped,
/// whether the call ended (its ack timeout) or was dropped (the relay's deadline).
struct Unsettled<'a> {
    pending: &'a Mutex<HashMap<Uuid, (Waiting, Instant)>>,
    waits: Vec<(Uuid, Waiting)>,
}

impl Drop for Unsettled<'_> {
    fn drop(&mut self) {
        if self.waits.is_empty() {
            return;
        }
        let mut pending = lock(self.pending);
        let now = Instant::now();
        for (id, w) in self.waits.drain(..) {
            pending.entry(id).or_insert((w, now));
        }
    }
}

/// What became of the copy of a message that an earlier call left queued.
enum Earlier {
    /// Still waiting for its delivery report.
    Queued(Waiting),
    /// Written: the retry is answered `Ok` without producing again.
    Acknowledged,
    /// Not written (a fatal error purged it): produced again.
    Failed,
}

/// One envelope of a call while the sink works on it.
enum Slot {
    /// Settled without waiting (refused on enqueue, or an earlier copy already acknowledged).
    Done(Result<(), SinkError>),
    /// Waiting for a delivery report.
    Waiting(Waiting),
}

/// Kafka sink. The key is the envelope's key (the aggregate id), the topic its destination,
/// the headers Kafka record headers; the message id travels in `outbox-message-id`.
///
/// **Acknowledgement:** `Ok` only for a message whose delivery report says the partition
/// leader wrote it with every in-sync replica (`acks=all`).
///
/// **Order:** the sink orders a key itself ([`Sink::orders_keys`]): messages of one key for one
/// topic go to one partition in call order, and a message the sink reports failed is either not
/// written, with every later message of its key in the producer not written either (the gap-less
/// guarantee stops the producer), or still queued ahead of them (an ack timeout): so the relay
/// may keep many messages of one key in flight.
///
/// **Dedupe:** librdkafka's retries are deduplicated by the broker (idempotent producer). A
/// message whose call ended before its acknowledgement stays queued; when the relay publishes
/// it again, the sink waits for that copy rather than producing a second. Only a relay restart
/// (or a takeover) can write a message twice, with the same `outbox-message-id`.
pub struct KafkaSink {
    cfg: KafkaConfig,
    /// Replaced after a fatal error (which the gap-less guarantee makes of any permanent one).
    producer: Mutex<Arc<FutureProducer>>,
    /// For `?create_topics=true`.
    admin: Option<AdminClient<DefaultClientContext>>,
    /// Topics the broker listed: checked once, then trusted (a deleted topic fails its messages
    /// in librdkafka as an unknown topic).
    topics: Mutex<HashSet<String>>,
    /// Messages whose call ended before their delivery report, by id.
    pending: Mutex<HashMap<Uuid, (Waiting, Instant)>>,
}

/// Locks `m`, recovering the data of a poisoned lock (a panicking holder cannot leave these
/// maps half-updated: every update is a single insert or remove).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl KafkaSink {
    /// Creates the producer. It connects in the background: a broker that is down at start is
    /// an outage (publishes fail as unavailable and are retried), not an error here.
    pub fn connect(cfg: KafkaConfig) -> Result<Self, Error> {
        let producer = Self::new_producer(&cfg)?;
        let admin = if cfg.create_topics {
            Some(
                client_config(&cfg.brokers)
                    .create::<AdminClient<DefaultClientContext>>()
                    .map_err(|e| {
                        Error::with_source(
                            ErrorKind::Config,
                            format!("kafka: admin client: {e}"),
                            e,
                        )
                    })?,
            )
        } else {
            None
        };
        Ok(Self {
            cfg,
            producer: Mutex::new(Arc::new(producer)),
            admin,
            topics: Mutex::default(),
            pending: Mutex::default(),
        })
    }

    fn new_producer(cfg: &KafkaConfig) -> Result<FutureProducer, Error> {
        producer_config(cfg).create().map_err(|e| {
            Error::with_source(
                ErrorKind::Config,
                format!("kafka: cannot create a producer for {}: {e}", cfg.brokers),
                e,
            )
        })
    }

    fn producer(&self) -> Arc<FutureProducer> {
        lock(&self.producer).clone()
    }

    /// Replaces `old` (if it is still the current producer) with a new one: after a fatal
    /// error librdkafka's producer refuses everything. The old one is dropped on a blocking
    /// thread: its drop purges and flushes for up to half a second.
    fn replace_producer(&self, old: &Arc<FutureProducer>, why: &str) {
        let mut current = lock(&self.producer);
        if !Arc::ptr_eq(&current, old) {
            return;
        }
        match Self::new_producer(&self.cfg) {
            Ok(p) => {
                warn!(sink = "kafka", reason = %why, "producer stopped after a fatal error; replaced, its messages are retried");
                let retired = std::mem::replace(&mut *current, Arc::new(p));
                drop(current);
                tokio::task::spawn_blocking(move || drop(retired));
            }
            Err(error) => warn!(sink = "kafka", %error, "could not replace the producer"),
        }
    }

    /// Whether each of `topics` exists, asking the broker about the ones not known yet (and
    /// creating them with `?create_topics=true`), within `budget`.
    async fn check_topics(
        &self,
        topics: HashSet<&str>,
        budget: Duration,
    ) -> HashMap<String, TopicCheck> {
        let unknown: Vec<String> = {
            let known = lock(&self.topics);
            topics
                .into_iter()
                .filter(|t| !known.contains(*t))
                .map(str::to_string)
                .collect()
        };
        let mut out = HashMap::new();
        if unknown.is_empty() {
            return out;
        }
        // One request for the whole topic list, never one naming a topic that may not exist:
        // tansu answers those with a topic entry without a name, which librdkafka 2.12
        // dereferences (a crash in its metadata cache); a listing holds only existing topics.
        let producer = self.producer();
        let listing = tokio::task::spawn_blocking(move || {
            producer.client().fetch_metadata(None, budget).map(|md| {
                md.topics()
                    .iter()
                    .map(|m| {
                        let state = match m.error().map(RDKafkaErrorCode::from) {
                            None if !m.partitions().is_empty() => None,
                            None => Some(RDKafkaErrorCode::UnknownTopicOrPartition),
                            Some(code) => Some(code),
                        };
                        (m.name().to_string(), state)
                    })
                    .collect::<HashMap<String, Option<RDKafkaErrorCode>>>()
            })
        })
        .await;
        let listed: Vec<(String, TopicCheck)> = match listing {
            Ok(Ok(listing)) => unknown
                .into_iter()
                .map(|t| {
                    let check = match listing.get(&t) {
                        Some(None) => TopicCheck::Exists,
                        None | Some(Some(RDKafkaErrorCode::UnknownTopicOrPartition)) => {
                            TopicCheck::Missing(missing_topic(&t))
                        }
                        Some(Some(code)) => {
                            let e = classify_code(&t, *code);
                            if e.kind == SinkErrorKind::Unavailable {
                                TopicCheck::Unknown
                            } else {
                                TopicCheck::Missing(e.message)
                            }
                        }
                    };
                    (t, check)
                })
                .collect(),
            _ => unknown
                .into_iter()
                .map(|t| (t, TopicCheck::Unknown))
                .collect(),
        };
        for (topic, mut check) in listed {
            if let (TopicCheck::Missing(_), Some(admin)) = (&check, &self.admin) {
                check = self.create_topic(admin, &topic, budget).await;
            }
            if check == TopicCheck::Exists {
                lock(&self.topics).insert(topic.clone());
            }
            out.insert(topic, check);
        }
        out
    }

    async fn create_topic(
        &self,
        admin: &AdminClient<DefaultClientContext>,
        topic: &str,
        budget: Duration,
    ) -> TopicCheck {
        let new = NewTopic::new(
            topic,
            self.cfg.partitions,
            TopicReplication::Fixed(self.cfg.replication_factor),
        );
        let opts = AdminOptions::new().request_timeout(Some(budget));
        match admin.create_topics([&new], &opts).await {
            Ok(results) => match results.into_iter().next() {
                Some(Ok(_)) | Some(Err((_, RDKafkaErrorCode::TopicAlreadyExists))) => {
                    info!(sink = "kafka", %topic, "created topic");
                    TopicCheck::Exists
                }
                Some(Err((_, code))) => TopicCheck::Missing(format!(
                    "kafka: topic `{topic}` does not exist and creating it failed: {code}"
                )),
                None => TopicCheck::Unknown,
            },
            Err(_) => TopicCheck::Unknown,
        }
    }

    /// Enqueues `e` in `producer`: a shared wait for its delivery report, or why it was refused.
    fn produce(producer: &FutureProducer, e: &Envelope) -> Result<Waiting, (SinkError, bool)> {
        let mut headers = OwnedHeaders::new_with_capacity(e.headers.len());
        for (k, v) in &e.headers {
            headers = headers.insert(Header {
                key: k,
                value: Some(v.as_bytes()),
            });
        }
        // librdkafka copies key and payload into its queue (it owns what it retries).
        let record = FutureRecord::to(&e.destination)
            .key(e.key.as_bytes())
            .payload(&e.payload[..])
            .headers(headers);
        match producer.send_result(record) {
            Ok(delivery) => {
                let topic: Arc<str> = Arc::from(e.destination.as_str());
                Ok(async move {
                    match delivery.await {
                        Ok(Ok(_)) => Ok(()),
                        Ok(Err((err, _message))) => Err(classify(&topic, &err)),
                        Err(_canceled) => Err(SinkError::unavailable(format!(
                            "kafka: the producer closed before acknowledging the message for \
                             topic `{topic}`; retried"
                        ))),
                    }
                }
                .boxed()
                .shared())
            }
            Err((err, _record)) => {
                let fatal = err.rdkafka_error_code() == Some(RDKafkaErrorCode::Fatal);
                Err((classify(&e.destination, &err), fatal))
            }
        }
    }

    /// Forgets settled entries of calls that ended long ago and were never asked about again
    /// (their rows went to another relay, or were redriven): bounds the map.
    fn prune_pending(&self) {
        let mut pending = lock(&self.pending);
        if pending.len() < 10_000 {
            return;
        }
        let old = Instant::now() - Duration::from_secs(600);
        pending.retain(|_, (w, since)| *since > old || w.clone().now_or_never().is_none());
    }
}

#[async_trait]
impl Sink for KafkaSink {
    fn name(&self) -> &str {
        "kafka"
    }

    fn ack_timeout(&self) -> Option<Duration> {
        Some(self.cfg.ack_timeout)
    }

    fn orders_keys(&self) -> bool {
        true
    }

    async fn publish(&self, batch: &[Envelope]) -> Vec<Result<(), SinkError>> {
        let deadline = tokio::time::Instant::now() + self.cfg.ack_timeout;
        // A producer that hit a fatal error refuses everything: replace it before using it
        // (the call that saw the error may have been dropped before it could).
        let current = self.producer();
        if let Some((code, reason)) = current.client().fatal_error() {
            self.replace_producer(&current, &format!("{code}: {reason}"));
        }
        let topics: HashSet<&str> = batch
            .iter()
            .map(|e| e.destination.as_str())
            .filter(|t| valid_topic(t).is_ok())
            .collect();
        let checked = self.check_topics(topics, self.cfg.ack_timeout / 2).await;
        let producer = self.producer();
        let mut fatal = false;

        // Each key's messages for one topic form a run: the first one that fails stops the rest
        // of its run in this call, so nothing later of that key is produced behind a failure.
        let mut stopped: HashMap<(&str, &str), SinkError> = HashMap::new();
        // Retried messages whose copy from an earlier call may still be queued, and what became
        // of that copy (polled once now; a shared future only knows what it was polled for).
        // Retried messages whose copy from an earlier call may still be queued, and what became
        // of that copy.
        let earlier = self.earlier_copies(batch);
        // A message produced again must not go *before* a later message of its run whose copy
        // is still queued from before: that copy would be written first. The last such
        // message per run:
        let mut last_queued: HashMap<(&str, &str), usize> = HashMap::new();
        for (i, e) in batch.iter().enumerate() {
            if matches!(earlier.get(&e.id), Some(Earlier::Queued(_))) {
                last_queued.insert((e.destination.as_str(), e.key.as_str()), i);
            }
        }

        let mut slots = Vec::with_capacity(batch.len());
        for (i, e) in batch.iter().enumerate() {
            let run = (e.destination.as_str(), e.key.as_str());
            if let Some(head) = stopped.get(&run) {
                let kind = match head.kind {
                    SinkErrorKind::Invalid => SinkErrorKind::Rejected,
                    k => k,
                };
                slots.push(Slot::Done(Err(SinkError::new(
                    kind,
                    format!(
                        "kafka: not produced: an earlier message of its key for topic `{}` \
                         failed in this call ({})",
                        e.destination, head.message
                    ),
                ))));
                continue;
            }
            let slot = if let Err(err) = valid_topic(&e.destination) {
                Slot::Done(Err(err))
            } else if let Some(TopicCheck::Missing(why)) = checked.get(&e.destination) {
                Slot::Done(Err(SinkError::rejected(why.clone())))
            } else if let Some(TopicCheck::Unknown) = checked.get(&e.destination) {
                Slot::Done(Err(SinkError::unavailable(format!(
                    "kafka: the broker did not say whether topic `{}` exists (is it down?); \
                     retried",
                    e.destination
                ))))
            } else {
                match earlier.get(&e.id) {
                    // Still queued: wait for that copy.
                    Some(Earlier::Queued(w)) => Slot::Waiting(w.clone()),
                    // Acknowledged after its call had ended: nothing to send again.
                    Some(Earlier::Acknowledged) => Slot::Done(Ok(())),
                    // Failed, or never queued: produce it now, unless a later message of its
                    // run is still queued from before (it would be written ahead of this one).
                    _ if last_queued.get(&run).is_some_and(|&j| j > i) => {
                        Slot::Done(Err(SinkError::unavailable(format!(
                            "kafka: not produced yet: a later message of its key for topic `{}` \
                             is still queued from an earlier attempt; retried once it is \
                             acknowledged",
                            e.destination
                        ))))
                    }
                    _ => match Self::produce(&producer, e) {
                        Ok(w) => Slot::Waiting(w),
                        Err((err, is_fatal)) => {
                            fatal |= is_fatal;
                            Slot::Done(Err(err))
                        }
                    },
                }
            };
            if let Slot::Done(Err(err)) = &slot {
                stopped.insert(run, err.clone());
            }
            slots.push(slot);
        }

        // Until they settle, the copies this call waits for are handed to `pending` should the
        // call be dropped (the relay's deadline), so a retry waits for them too.
        let mut unsettled = Unsettled {
            pending: &self.pending,
            waits: batch
                .iter()
                .zip(&slots)
                .filter_map(|(e, slot)| match slot {
                    Slot::Waiting(w) => Some((e.id, w.clone())),
                    Slot::Done(_) => None,
                })
                .collect(),
        };
        let results = wait_for(slots, deadline, self.cfg.ack_timeout).await;

        // Remember what is still queued; forget what this call settled.
        let still: HashSet<Uuid> = batch
            .iter()
            .zip(&results)
            .filter(|(_, (_, queued))| *queued)
            .map(|(e, _)| e.id)
            .collect();
        unsettled.waits.retain(|(id, _)| still.contains(id));
        if !earlier.is_empty() {
            let mut pending = lock(&self.pending);
            for id in earlier.keys().filter(|id| !still.contains(id)) {
                pending.remove(id);
            }
        }
        drop(unsettled);
        self.prune_pending();

        if let Some((code, reason)) = producer.client().fatal_error() {
            self.replace_producer(&producer, &format!("{code}: {reason}"));
        } else if fatal {
            self.replace_producer(&producer, "the producer refused messages as fatal");
        }
        results.into_iter().map(|(r, _)| r).collect()
    }
}

impl KafkaSink {
    /// For each message of `batch` whose copy from an earlier call is remembered in `pending`,
    /// what became of that copy (polled once now: a shared future only knows what it was
    /// polled for).
    fn earlier_copies(&self, batch: &[Envelope]) -> HashMap<Uuid, Earlier> {
        let pending = lock(&self.pending);
        if pending.is_empty() {
            return HashMap::new();
        }
        batch
            .iter()
            .filter_map(|e| pending.get(&e.id).map(|(w, _)| (e.id, w.clone())))
            .map(|(id, w)| match w.clone().now_or_never() {
                None => (id, Earlier::Queued(w)),
                Some(Ok(())) => (id, Earlier::Acknowledged),
                Some(Err(_)) => (id, Earlier::Failed),
            })
            .collect()
    }
}

/// Each slot's result, waiting for the acknowledgements until `deadline`; `true` beside a
/// result whose copy is still queued in the producer (no acknowledgement in time).
async fn wait_for(
    slots: Vec<Slot>,
    deadline: tokio::time::Instant,
    timeout: Duration,
) -> Vec<(Result<(), SinkError>, bool)> {
    join_all(slots.into_iter().map(|slot| async move {
        match slot {
            Slot::Done(r) => (r, false),
            Slot::Waiting(w) => match tokio::time::timeout_at(deadline, w).await {
                Ok(r) => (r, false),
                Err(_) => (
                    Err(SinkError::unavailable(format!(
                        "kafka: no acknowledgement within {timeout:?} (ack_timeout); the \
                         message stays queued in the producer and a retry waits for it"
                    ))),
                    true,
                ),
            },
        }
    }))
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_topics_are_invalid_messages() {
        assert!(valid_topic("orders.placed").is_ok());
        assert!(valid_topic("outbox_test-1").is_ok());
        for bad in ["", ".", "..", "a b", "a/b", "ünï", &"x".repeat(250)] {
            let e = valid_topic(bad).unwrap_err();
            assert_eq!(e.kind, SinkErrorKind::Invalid, "{bad:?}");
        }
    }
}
