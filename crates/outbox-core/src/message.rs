//! The outbox message: what an application enqueues and what the relay claims.

use bytes::Bytes;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// A message an application writes in its own transaction.
///
/// The id is fixed here, at write time (UUIDv7, time-ordered), and every redelivery carries it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NewMessage {
    /// Message id; every delivery of this message carries it, so consumers can dedupe.
    pub id: Uuid,
    /// Kind of aggregate the event is about, e.g. `payment`.
    pub aggregate_type: String,
    /// Aggregate id; it is the ordering key and the broker partition key.
    pub aggregate_id: String,
    /// Event type, e.g. `payment.created`.
    pub event_type: String,
    /// JSON payload, published verbatim.
    pub payload: serde_json::Value,
    /// Extra headers (string values), published beside the relay's own.
    pub headers: serde_json::Map<String, serde_json::Value>,
    /// Optional destination that overrides the relay's template for this message.
    pub topic: Option<String>,
}

impl NewMessage {
    /// A message with a fresh UUIDv7 id, no extra headers and no topic override.
    pub fn new(
        aggregate_type: impl Into<String>,
        aggregate_id: impl Into<String>,
        event_type: impl Into<String>,
        payload: serde_json::Value,
    ) -> Self {
        Self {
            id: Uuid::now_v7(),
            aggregate_type: aggregate_type.into(),
            aggregate_id: aggregate_id.into(),
            event_type: event_type.into(),
            payload,
            headers: serde_json::Map::new(),
            topic: None,
        }
    }

    /// Adds a header (for example `traceparent`).
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers
            .insert(name.into(), serde_json::Value::String(value.into()));
        self
    }

    /// Records the W3C trace context the message was written under: `traceparent` (checked) and
    /// `tracestate`, in the headers every sink forwards. For a context taken from elsewhere (an
    /// incoming request's headers); with the `otel` feature, [`NewMessage::with_current_trace`]
    /// takes the current span's.
    pub fn trace_context(
        self,
        traceparent: &str,
        tracestate: Option<&str>,
    ) -> Result<Self, crate::Error> {
        let parent = crate::trace::TraceParent::parse(traceparent)
            .map_err(|e| crate::Error::new(crate::ErrorKind::Malformed, e))?;
        let m = self.header(crate::trace::HEADER_TRACEPARENT, parent.to_string());
        Ok(match tracestate.filter(|s| !s.trim().is_empty()) {
            Some(state) => m.header(crate::trace::HEADER_TRACESTATE, state.trim()),
            None => m,
        })
    }

    /// Records the current OpenTelemetry span's trace context (`traceparent`, `tracestate`),
    /// so the relay's publish span links to it and the consumer's handler continues its trace.
    /// Outside a valid span the message is left as it is.
    #[cfg(feature = "otel")]
    pub fn with_current_trace(self) -> Self {
        match crate::trace::current() {
            Some((parent, state)) => {
                let m = self.header(crate::trace::HEADER_TRACEPARENT, parent.to_string());
                match state {
                    Some(state) => m.header(crate::trace::HEADER_TRACESTATE, state),
                    None => m,
                }
            }
            None => self,
        }
    }

    /// Sets a per-message destination that wins over the relay's template.
    pub fn topic(mut self, topic: impl Into<String>) -> Self {
        self.topic = Some(topic.into());
        self
    }
}

/// A pending message as the relay claimed it.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    /// Store-assigned sequence: the order of messages within one ordering key.
    pub seq: i64,
    /// Message id fixed at write time.
    pub id: Uuid,
    /// Kind of aggregate.
    pub aggregate_type: String,
    /// Ordering key.
    pub aggregate_id: String,
    /// Event type.
    pub event_type: String,
    /// The payload as JSON text (UTF-8), as the store returns it (PostgreSQL `jsonb` normalises
    /// key order and whitespace); published byte for byte. Held once: the envelope and the sink
    /// share these bytes (cloning a `Bytes` counts a reference, it copies nothing).
    pub payload: Bytes,
    /// The row's own headers as JSON text (expected to be an object).
    pub headers: String,
    /// Per-row destination override.
    pub topic: Option<String>,
    /// When the row was written.
    pub created_at: DateTime<Utc>,
    /// Delivery attempts made before this claim.
    pub attempts: i32,
}
