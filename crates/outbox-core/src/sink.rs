//! The `Sink` trait: where the relay publishes, and what an acknowledgement means.

use async_trait::async_trait;
use bytes::Bytes;
use chrono::{DateTime, Utc};
use uuid::Uuid;

/// Header carrying the message id on every sink that has headers.
pub const HEADER_MESSAGE_ID: &str = "outbox-message-id";
/// Header carrying the event type.
pub const HEADER_EVENT_TYPE: &str = "outbox-event-type";
/// Header carrying the aggregate type.
pub const HEADER_AGGREGATE_TYPE: &str = "outbox-aggregate-type";
/// Header carrying the aggregate id (the ordering key).
pub const HEADER_AGGREGATE_ID: &str = "outbox-aggregate-id";

/// Prefixes of header names that belong to the relay and the brokers, compared without regard
/// to case: the relay's own `outbox-*` headers (message id, event type, key) and NATS's
/// `Nats-*` (`Nats-Msg-Id` is the dedupe key, `Nats-Expected-*` are publish preconditions,
/// `Nats-TTL` and `Nats-Rollup` change the stream). A row's own headers may not set them: the
/// row ends `failed` with the header's name instead of silently overriding the relay.
pub const RESERVED_HEADER_PREFIXES: &[&str] = &["outbox-", "nats-"];

/// Whether a row may not set the header `name` (see [`RESERVED_HEADER_PREFIXES`]).
pub fn is_reserved_header(name: &str) -> bool {
    RESERVED_HEADER_PREFIXES.iter().any(|p| {
        name.get(..p.len())
            .is_some_and(|head| head.eq_ignore_ascii_case(p))
    })
}

/// One message ready to publish: routed, with its headers resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct Envelope {
    /// Message id, identical on every redelivery: sinks use it for broker-side dedupe.
    pub id: Uuid,
    /// Rendered destination (subject, topic, queue, stream …).
    pub destination: String,
    /// Ordering / partition key (the aggregate id).
    pub key: String,
    /// Headers: the relay's own (`outbox-*`) followed by the row's.
    pub headers: Vec<(String, String)>,
    /// Payload as JSON text (UTF-8), shared with the claimed [`Message`](crate::Message): a
    /// sink passes it on (NATS takes `Bytes` as they are) or borrows it, never copies it whole.
    pub payload: Bytes,
    /// When the row was written.
    pub created_at: DateTime<Utc>,
}

impl Envelope {
    /// The headers as a map of names to values, borrowed from the envelope: serialised, it is
    /// the JSON object of strings that sinks without a header map of their own carry (Redis
    /// Streams, webhooks, JSON lines). Names sorted; a later duplicate wins.
    pub fn header_map(&self) -> std::collections::BTreeMap<&str, &str> {
        self.headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect()
    }
}

/// What a failed publish says: whether the broker is at fault or this message is (after
/// vector's `RetryLogic`). The relay's backoff, the `failed` state and the circuit breaker each
/// read it:
///
/// | kind | circuit breaker | attempts | ends `failed` |
/// | --- | --- | --- | --- |
/// | [`Unavailable`](Self::Unavailable) | counts | spent, except by a probe of an open circuit | after `max_attempts` |
/// | [`Rejected`](Self::Rejected) | never counts | spent, also by a probe | after `max_attempts` |
/// | [`Invalid`](Self::Invalid) | never counts | spent | at once |
///
/// The choice for rejections: a refusal that someone can fix without touching the message (a
/// stream created, a permission granted) is retried with backoff, so a brief misconfiguration
/// does not fail a whole burst of messages; a message the broker can never take as it is fails at
/// once, since no retry can help it. Either way only this message (and the later ones of its
/// key) waits: other subjects keep flowing, and the circuit stays closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SinkErrorKind {
    /// The broker could not be reached or did not answer in time: connection refused or lost,
    /// no acknowledgement within the ack timeout or the relay's publish deadline, a broker-wide
    /// outage. Says nothing about the message.
    Unavailable,
    /// The broker answered and refused this message, for a reason that can be fixed without
    /// changing it: no stream captures its subject, permission denied, a stream limit reached,
    /// or a refusal the sink does not recognise.
    Rejected,
    /// The message can never be published as it is: its payload is larger than the broker
    /// accepts, its subject or a header is not valid for the broker, or its payload cannot be
    /// encoded by the sink.
    Invalid,
}

impl SinkErrorKind {
    /// `unavailable`, `rejected` or `invalid`.
    pub fn as_str(self) -> &'static str {
        match self {
            SinkErrorKind::Unavailable => "unavailable",
            SinkErrorKind::Rejected => "rejected",
            SinkErrorKind::Invalid => "invalid",
        }
    }
}

impl std::fmt::Display for SinkErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A failed publish of one message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct SinkError {
    /// Whether the broker or the message is at fault; see [`SinkErrorKind`].
    pub kind: SinkErrorKind,
    /// What failed; never contains the payload or a password.
    pub message: String,
    /// The broker asked not to be sent this message again before this long (an HTTP
    /// `Retry-After`): the relay waits at least that long, never less than its own backoff.
    pub retry_after: Option<std::time::Duration>,
}

impl SinkError {
    /// A new error of `kind`; `message` is sanitised (control characters and credentials out).
    pub fn new(kind: SinkErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: crate::redact::sanitize(&message.into()),
            retry_after: None,
        }
    }

    /// The same error, with the broker's own wait before the next attempt (capped at an hour:
    /// a far-off date must not park a message for days).
    pub fn with_retry_after(mut self, wait: std::time::Duration) -> Self {
        self.retry_after = Some(wait.min(std::time::Duration::from_secs(3600)));
        self
    }

    /// The broker is unreachable or did not answer in time.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(SinkErrorKind::Unavailable, message)
    }

    /// The broker refused this message for a reason that can be fixed without changing it.
    pub fn rejected(message: impl Into<String>) -> Self {
        Self::new(SinkErrorKind::Rejected, message)
    }

    /// The message can never be published as it is; it ends `failed` at once.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(SinkErrorKind::Invalid, message)
    }

    /// Whether a later attempt may succeed (so the message is retried within its budget).
    pub fn retriable(&self) -> bool {
        self.kind != SinkErrorKind::Invalid
    }

    /// Whether this failure says the broker, not the message, is at fault: only these count
    /// towards the circuit breaker.
    pub fn is_unavailable(&self) -> bool {
        self.kind == SinkErrorKind::Unavailable
    }
}

/// A broker the relay publishes to.
///
/// **Delivery guarantee: at least once.** `publish` returns `Ok` for a message only after the
/// broker acknowledged it (as durably as that broker promises). The relay may call `publish`
/// again with a message that was already accepted (after a crash or a timeout), always with the
/// same [`Envelope::id`]; sinks pass that id to the broker's own dedupe where one exists, and
/// consumers must tolerate duplicates.
///
/// Order: unless the sink [orders keys itself](Sink::orders_keys), the relay never gives
/// `publish` two messages of the same key in one call, and calls it again only after every
/// result of the previous call is in; so such a sink need not order anything itself and should
/// publish the whole slice concurrently.
#[async_trait]
pub trait Sink: Send + Sync {
    /// Short name for logs and metrics, e.g. `nats`.
    fn name(&self) -> &str;

    /// How long this sink waits for its broker to acknowledge a message, when it has such a
    /// setting (NATS `ack_timeout`). The relay gives every `publish` call this long and a
    /// quarter more (so the sink reports its own timeouts, with what it knows about them), never
    /// more than a third of its lease, then counts each message of the call still without an
    /// answer as [`SinkErrorKind::Unavailable`]. Sinks without one (local files, stdout) get a
    /// third of the lease.
    fn ack_timeout(&self) -> Option<std::time::Duration> {
        None
    }

    /// Whether this sink keeps the order of several messages of one key itself, so the relay may
    /// keep them in flight together (default `false`: one message per key per call, each sent
    /// only after the previous one was acknowledged, one round trip per message of a hot key).
    ///
    /// A sink returning `true` may be given, in one `publish` call, several messages with the
    /// same [`Envelope::key`] and the same [`Envelope::destination`] (a *run*), in `seq` order;
    /// messages of one key for different destinations still go one call after another. For
    /// every run the sink guarantees:
    ///
    /// 1. the broker writes its messages in call order (after any copy of them an earlier call
    ///    left in flight);
    /// 2. when the sink reports message *j* failed, no later message of the run is written
    ///    ahead of *j*: either nothing from *j* on was written (the sink stopped the run, or
    ///    its client failed them together), or *j* is still in flight ahead of them and will be
    ///    written first (a timeout).
    ///
    /// The relay then takes each run's results in order up to its first failure: that message
    /// is retried (or fails) as usual and parks its key; the later ones of the key get no
    /// outcome, whatever the sink said, and are published again after it with the same ids. A
    /// consumer may so see a message twice, but first deliveries stay in `seq` order.
    fn orders_keys(&self) -> bool {
        false
    }

    /// Publishes `batch` with all acknowledgements in flight at once and returns one result per
    /// envelope, in the same order.
    ///
    /// The relay may drop the returned future when its deadline passes: a sink must leave no
    /// state behind that a dropped call could corrupt, and must not block the async runtime's
    /// threads (blocking I/O belongs on a thread of its own).
    async fn publish(&self, batch: &[Envelope]) -> Vec<Result<(), SinkError>>;
}

#[async_trait]
impl<S: Sink + ?Sized> Sink for std::sync::Arc<S> {
    fn name(&self) -> &str {
        (**self).name()
    }
    fn ack_timeout(&self) -> Option<std::time::Duration> {
        (**self).ack_timeout()
    }
    fn orders_keys(&self) -> bool {
        (**self).orders_keys()
    }
    async fn publish(&self, batch: &[Envelope]) -> Vec<Result<(), SinkError>> {
        (**self).publish(batch).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_map_borrows_every_header_sorted_with_a_later_duplicate_winning() {
        let e = Envelope {
            id: Uuid::nil(),
            destination: "d".into(),
            key: "k".into(),
            headers: vec![
                (HEADER_MESSAGE_ID.into(), "m".into()),
                ("traceparent".into(), "00-a-b-01".into()),
                ("b".into(), "1".into()),
                ("b".into(), "2".into()),
            ],
            payload: Bytes::from_static(b"{}"),
            created_at: Utc::now(),
        };
        let json = serde_json::to_string(&e.header_map()).unwrap_or_default();
        assert_eq!(
            json,
            r#"{"b":"2","outbox-message-id":"m","traceparent":"00-a-b-01"}"#
        );
    }

    #[test]
    fn relay_and_nats_header_names_are_reserved_in_any_case() {
        for name in [
            HEADER_MESSAGE_ID,
            "Outbox-Message-Id",
            "OUTBOX-anything",
            "Nats-Msg-Id",
            "nats-expected-last-sequence",
            "NATS-TTL",
        ] {
            assert!(is_reserved_header(name), "{name}");
        }
        for name in [
            "traceparent",
            "outbox",
            "nats",
            "x-outbox-id",
            "natsy-id",
            "é-x",
            "",
        ] {
            assert!(!is_reserved_header(name), "{name}");
        }
    }
}
