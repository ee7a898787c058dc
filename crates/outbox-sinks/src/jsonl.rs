//! The JSON-lines record shared by the `file:` and `stdout:` sinks: one object per message.

use chrono::{DateTime, Utc};
#[cfg(test)]
use outbox_core::SinkErrorKind;
use outbox_core::{Envelope, SinkError};
use serde::Serialize;
use serde_json::value::RawValue;
use uuid::Uuid;

#[derive(Serialize)]
struct Record<'a> {
    id: Uuid,
    destination: &'a str,
    key: &'a str,
    headers: std::collections::BTreeMap<&'a str, &'a str>,
    payload: &'a RawValue,
    created_at: DateTime<Utc>,
}

/// Replaces `line` with the JSON object and newline of `e`. A payload that is not JSON is an
/// invalid message: it would make the file unreadable. The payload is embedded from the envelope
/// as it is, never parsed into a value or copied into another string.
pub(crate) fn encode_one(e: &Envelope, line: &mut Vec<u8>) -> Result<(), SinkError> {
    line.clear();
    let payload: &RawValue = serde_json::from_slice(&e.payload)
        .map_err(|_| SinkError::invalid(format!("message {}: payload is not valid JSON", e.id)))?;
    let headers = e.header_map();
    let rec = Record {
        id: e.id,
        destination: &e.destination,
        key: &e.key,
        headers,
        payload,
        created_at: e.created_at,
    };
    if let Err(err) = serde_json::to_writer(&mut *line, &rec) {
        line.clear();
        return Err(SinkError::invalid(format!(
            "message {}: cannot encode: {err}",
            e.id
        )));
    }
    line.push(b'\n');
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(payload: &str) -> Envelope {
        Envelope {
            id: Uuid::now_v7(),
            destination: "payment.created".into(),
            key: "p-1".into(),
            headers: vec![("outbox-event-type".into(), "created".into())],
            payload: payload.to_string().into(),
            created_at: Utc::now(),
        }
    }

    fn encode(batch: &[Envelope], out: &mut Vec<u8>) -> Vec<Result<(), SinkError>> {
        let mut line = Vec::new();
        batch
            .iter()
            .map(|e| {
                encode_one(e, &mut line)?;
                out.extend_from_slice(&line);
                Ok(())
            })
            .collect()
    }

    #[test]
    fn one_object_per_line_with_the_payload_embedded_as_json() {
        let mut out = Vec::new();
        let r = encode(&[env(r#"{"amount":10}"#), env("[1,2]")], &mut out);
        assert!(r.iter().all(Result::is_ok));
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0]["payload"]["amount"], 10);
        assert_eq!(lines[0]["destination"], "payment.created");
        assert_eq!(lines[0]["key"], "p-1");
        assert_eq!(lines[0]["headers"]["outbox-event-type"], "created");
        assert!(lines[0]["created_at"].is_string());
        assert!(lines[0]["id"].is_string());
    }

    #[test]
    fn invalid_json_payload_is_an_invalid_message_and_writes_nothing() {
        let mut out = Vec::new();
        let r = encode(&[env("not json")], &mut out);
        assert_eq!(r[0].as_ref().unwrap_err().kind, SinkErrorKind::Invalid);
        assert!(out.is_empty());
    }
}
