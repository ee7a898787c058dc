//! [`InboxMessage`]: a message as the inbox records it and as handlers see it.

use base64::Engine as _;
use chrono::{DateTime, Utc};
use outbox_core::sink::{HEADER_AGGREGATE_ID, HEADER_EVENT_TYPE, HEADER_MESSAGE_ID};
use serde::Serialize;
use uuid::Uuid;

/// How the bytes of a message body are kept in the `payload` column (`jsonb` on PostgreSQL,
/// JSON text on SQLite), so a body that is not JSON is still recorded exactly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PayloadFormat {
    /// The body was JSON; `payload` is that JSON value (PostgreSQL normalises whitespace and
    /// key order, as it does for outbox payloads).
    Json,
    /// The body was UTF-8 text but not JSON; `payload` is a JSON string holding the text.
    Text,
    /// The body was not UTF-8; `payload` is a JSON string holding the bytes in standard
    /// base64.
    Base64,
}

impl PayloadFormat {
    /// `json`, `text` or `base64`: the `payload_format` column.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Json => "json",
            Self::Text => "text",
            Self::Base64 => "base64",
        }
    }

    /// The format a `payload_format` column value names (unknown values read as JSON).
    pub fn parse(s: &str) -> Self {
        match s {
            "text" => Self::Text,
            "base64" => Self::Base64,
            _ => Self::Json,
        }
    }
}

/// A message received from a broker (or handed to [`crate::ingest`] by an application).
///
/// Its `id` is the dedupe key of the whole receiving side: the inbox records an id once, and a
/// consumer's claim (`processed_messages`) is per id. Messages written by `outbox relay` carry
/// the outbox message id, fixed at write time, on every redelivery
/// ([`InboxMessage::from_broker`] reads it from the `outbox-message-id` header).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct InboxMessage {
    /// Message id: the `id` column and primary key of `inbox_messages`.
    pub id: Uuid,
    /// Where it came from (e.g. `nats:ORDERS`, `redis:orders`): the `source` column.
    pub source: String,
    /// Message type, which selects the handler (`outbox-event-type`, else the subject or
    /// stream field): the `type` column.
    pub message_type: String,
    /// Ordering key: messages of one key are handled one at a time, in the order they were
    /// ingested. The `key` column.
    pub key: String,
    /// The body as a JSON value (see [`PayloadFormat`]).
    pub payload: serde_json::Value,
    /// How `payload` holds the body.
    pub payload_format: PayloadFormat,
    /// The broker's headers (or attributes), as strings.
    pub headers: serde_json::Map<String, serde_json::Value>,
    /// Where the broker had it (NATS stream sequence, Redis entry id), for operators.
    pub source_position: Option<String>,
    /// When the inbox recorded it (set by the database; `None` before it is ingested).
    pub received_at: Option<DateTime<Utc>>,
}

impl InboxMessage {
    /// A message with a JSON payload.
    pub fn new(
        id: Uuid,
        source: impl Into<String>,
        message_type: impl Into<String>,
        key: impl Into<String>,
        payload: serde_json::Value,
    ) -> Self {
        Self {
            id,
            source: source.into(),
            message_type: message_type.into(),
            key: key.into(),
            payload,
            payload_format: PayloadFormat::Json,
            headers: serde_json::Map::new(),
            source_position: None,
            received_at: None,
        }
    }

    /// A message from the raw body and headers a broker delivered.
    ///
    /// - id: the `outbox-message-id` header when it is a UUID (messages from `outbox relay`
    ///   carry it), else `fallback_id` (a source derives a stable one from the broker's own
    ///   position, so every redelivery of the message gets the same id);
    /// - type: the `outbox-event-type` header, else `fallback_type` (the subject, a field);
    /// - key: the `outbox-aggregate-id` header, else `fallback_key`, else the id (a message
    ///   without a key is ordered with nothing);
    /// - payload: the body, as JSON when it parses, else as text or base64 (see
    ///   [`PayloadFormat`]).
    ///
    /// A CloudEvent (binary or structured mode, any binding; see docs/envelopes.md) is read as
    /// one: its `id` is the id (a UUIDv5 of `source` and `id` when it is not a UUID), its
    /// `type` the type, its `partitionkey` or `subject` the key, its `data` the payload, and
    /// its attributes are kept as `ce-<name>` headers.
    pub fn from_broker(
        source: &str,
        body: &[u8],
        headers: Vec<(String, String)>,
        fallback_id: Uuid,
        fallback_type: &str,
        fallback_key: Option<&str>,
    ) -> Self {
        let find = |name: &str| {
            headers
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.clone())
        };
        let event = crate::cloudevent::read(&headers, body);
        let id = match &event {
            Some(e) => e.id,
            None => find(HEADER_MESSAGE_ID)
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(fallback_id),
        };
        // PostgreSQL text cannot hold a NUL: one in a header or field must not make a message
        // that can never be recorded.
        let message_type = event
            .as_ref()
            .map(|e| e.ty.clone())
            .filter(|t| !t.is_empty())
            .or_else(|| find(HEADER_EVENT_TYPE))
            .unwrap_or_else(|| fallback_type.to_string())
            .replace('\0', "");
        let key = find(HEADER_AGGREGATE_ID)
            .or_else(|| event.as_ref().and_then(|e| e.key.clone()))
            .or_else(|| fallback_key.map(str::to_string))
            .unwrap_or_else(|| id.to_string())
            .replace('\0', "");
        let (payload, payload_format) = match event.as_ref().and_then(|e| e.data.as_deref()) {
            Some(data) => encode_body(data),
            None => encode_body(body),
        };
        let mut headers = headers;
        if let Some(e) = event {
            // Structured mode's attributes were in the body: kept as headers, like binary
            // mode's, under one naming.
            for a in e.attributes {
                if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case(&a.0)) {
                    headers.push(a);
                }
            }
        }
        let mut map = serde_json::Map::new();
        for (k, v) in headers {
            // PostgreSQL text and jsonb cannot hold a NUL.
            let (k, v) = (k.replace('\0', ""), v.replace('\0', ""));
            match map.get_mut(&k) {
                // A repeated header (NATS allows them) keeps every value, comma-separated.
                Some(serde_json::Value::String(prev)) => {
                    prev.push_str(", ");
                    prev.push_str(&v);
                }
                _ => {
                    map.insert(k, serde_json::Value::String(v));
                }
            }
        }
        Self {
            id,
            source: source.replace('\0', ""),
            message_type,
            key,
            payload,
            payload_format,
            headers: map,
            source_position: None,
            received_at: None,
        }
    }

    /// The body as the broker delivered it: the JSON text (as stored: PostgreSQL normalises
    /// it), the text, or the decoded bytes.
    pub fn body(&self) -> Vec<u8> {
        match (self.payload_format, &self.payload) {
            (PayloadFormat::Text, serde_json::Value::String(s)) => s.clone().into_bytes(),
            (PayloadFormat::Base64, serde_json::Value::String(s)) => {
                base64::engine::general_purpose::STANDARD
                    .decode(s)
                    .unwrap_or_default()
            }
            (_, v) => v.to_string().into_bytes(),
        }
    }

    /// The value of header `name` (compared without regard to case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .and_then(|(_, v)| v.as_str())
    }
}

/// A body as a JSON value and the format that says how to get the bytes back.
pub(crate) fn encode_body(body: &[u8]) -> (serde_json::Value, PayloadFormat) {
    // PostgreSQL's jsonb cannot hold a `\u0000` escape: such JSON is kept as its text.
    let nul_escape = body.windows(6).any(|w| w == b"\\u0000");
    if !nul_escape {
        if let Ok(v) = serde_json::from_slice::<serde_json::Value>(body) {
            return (v, PayloadFormat::Json);
        }
    }
    match std::str::from_utf8(body) {
        // A NUL cannot be stored in PostgreSQL text or jsonb: such text goes as base64.
        Ok(s) if !s.contains('\0') => (
            serde_json::Value::String(s.to_string()),
            PayloadFormat::Text,
        ),
        _ => (
            serde_json::Value::String(base64::engine::general_purpose::STANDARD.encode(body)),
            PayloadFormat::Base64,
        ),
    }
}

/// A stable id for a message that carries none: a UUIDv5 of the source and the broker's
/// position of the message, so every redelivery of it gets the same id.
pub fn position_id(source: &str, position: &str) -> Uuid {
    Uuid::new_v5(
        &Uuid::NAMESPACE_OID,
        format!("outbox-inbox:{source}:{position}").as_bytes(),
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn outbox_headers_give_id_type_and_key() {
        let id = Uuid::now_v7();
        let m = InboxMessage::from_broker(
            "nats:S",
            br#"{"n": 1}"#,
            vec![
                (HEADER_MESSAGE_ID.into(), id.to_string()),
                (HEADER_EVENT_TYPE.into(), "order.placed".into()),
                (HEADER_AGGREGATE_ID.into(), "o-1".into()),
                ("traceparent".into(), "00-1".into()),
            ],
            Uuid::nil(),
            "subject.x",
            None,
        );
        assert_eq!(m.id, id);
        assert_eq!(m.message_type, "order.placed");
        assert_eq!(m.key, "o-1");
        assert_eq!(m.payload, serde_json::json!({"n": 1}));
        assert_eq!(m.payload_format, PayloadFormat::Json);
        assert_eq!(m.header("TRACEPARENT"), Some("00-1"));
    }

    #[test]
    fn a_cloudevent_gives_id_type_key_and_its_data_as_the_payload() {
        let id = Uuid::now_v7();
        let body = format!(
            r#"{{"specversion":"1.0","id":"{id}","source":"/s","type":"order.placed",
                "subject":"o-9","time":"2026-12-06T09:00:00Z","data":{{"n":2}}}}"#
        );
        let m = InboxMessage::from_broker(
            "nats:S",
            body.as_bytes(),
            vec![],
            Uuid::nil(),
            "subject.x",
            None,
        );
        assert_eq!(
            (m.id, m.message_type.as_str(), m.key.as_str()),
            (id, "order.placed", "o-9")
        );
        assert_eq!(m.payload, serde_json::json!({"n": 2}));
        assert_eq!(m.header("ce-time"), Some("2026-12-06T09:00:00Z"));
        let binary = InboxMessage::from_broker(
            "kafka:t",
            br#"{"n":3}"#,
            vec![
                ("ce_specversion".into(), "1.0".into()),
                ("ce_id".into(), "evt-1".into()),
                ("ce_source".into(), "urn:a".into()),
                ("ce_type".into(), "t".into()),
            ],
            Uuid::nil(),
            "topic",
            Some("kafka-key"),
        );
        assert_ne!(binary.id, Uuid::nil());
        assert_eq!(
            (binary.message_type.as_str(), binary.key.as_str()),
            ("t", "kafka-key")
        );
        assert_eq!(binary.payload, serde_json::json!({"n": 3}));
    }

    #[test]
    fn a_message_without_headers_gets_stable_fallbacks() {
        let fallback = position_id("nats:S", "42");
        assert_eq!(fallback, position_id("nats:S", "42"));
        assert_ne!(fallback, position_id("nats:S", "43"));
        let m = InboxMessage::from_broker("nats:S", b"plain text", vec![], fallback, "subj", None);
        assert_eq!(m.id, fallback);
        assert_eq!(m.message_type, "subj");
        assert_eq!(m.key, fallback.to_string(), "no key: ordered with nothing");
        assert_eq!(m.payload_format, PayloadFormat::Text);
        assert_eq!(m.body(), b"plain text");
    }

    #[test]
    fn bodies_round_trip_whatever_they_hold() {
        for body in [&b"\xff\x00\x01"[..], b"a\0b", b"", b"[1,2]", b"\"s\""] {
            let (v, f) = encode_body(body);
            let m = InboxMessage {
                payload: v,
                payload_format: f,
                ..InboxMessage::new(Uuid::nil(), "s", "t", "k", serde_json::Value::Null)
            };
            if f == PayloadFormat::Json {
                let again: serde_json::Value = serde_json::from_slice(&m.body()).unwrap();
                assert_eq!(
                    again,
                    serde_json::from_slice::<serde_json::Value>(body).unwrap()
                );
            } else {
                assert_eq!(m.body(), body, "{f:?}");
            }
        }
        assert_eq!(encode_body(b"\xff").1, PayloadFormat::Base64);
        assert_eq!(encode_body(b"a\0b").1, PayloadFormat::Base64);
        assert_eq!(encode_body(br#"{"a":"\u0000"}"#).1, PayloadFormat::Text);
    }

    #[test]
    fn repeated_headers_keep_every_value() {
        let m = InboxMessage::from_broker(
            "s",
            b"{}",
            vec![("a".into(), "1".into()), ("a".into(), "2".into())],
            Uuid::nil(),
            "t",
            Some("k"),
        );
        assert_eq!(m.header("a"), Some("1, 2"));
        assert_eq!(m.key, "k");
    }
}
