//! The `Sink` trait: where the relay publishes, and what an acknowledgement means.

use async_trait::async_trait;
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
    /// Payload as JSON text.
    pub payload: String,
    /// When the row was written.
    pub created_at: DateTime<Utc>,
}

/// A failed publish of one message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct SinkError {
    /// Whether a later attempt may succeed (broker down, timeout) or never will (payload too big).
    pub retriable: bool,
    /// What failed; never contains the payload or a password.
    pub message: String,
}

impl SinkError {
    /// A failure worth retrying later.
    pub fn transient(message: impl Into<String>) -> Self {
        Self {
            retriable: true,
            message: crate::redact::sanitize(&message.into()),
        }
    }

    /// A failure no retry will fix; the message is marked `failed` at once.
    pub fn permanent(message: impl Into<String>) -> Self {
        Self {
            retriable: false,
            message: crate::redact::sanitize(&message.into()),
        }
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
/// Order: the relay never gives `publish` two messages of the same key in one call, and calls
/// it again only after every result of the previous call is in; so a sink need not order
/// anything itself and should publish the whole slice concurrently.
#[async_trait]
pub trait Sink: Send + Sync {
    /// Short name for logs and metrics, e.g. `nats`.
    fn name(&self) -> &str;

    /// Publishes `batch` with all acknowledgements in flight at once and returns one result per
    /// envelope, in the same order.
    async fn publish(&self, batch: &[Envelope]) -> Vec<Result<(), SinkError>>;
}

#[async_trait]
impl<S: Sink + ?Sized> Sink for std::sync::Arc<S> {
    fn name(&self) -> &str {
        (**self).name()
    }
    async fn publish(&self, batch: &[Envelope]) -> Vec<Result<(), SinkError>> {
        (**self).publish(batch).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
