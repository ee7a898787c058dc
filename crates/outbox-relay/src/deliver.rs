//! Turning claimed rows into envelopes and ordering them into waves (one message per key each).

use std::collections::HashMap;

use outbox_core::sink::{
    HEADER_AGGREGATE_ID, HEADER_AGGREGATE_TYPE, HEADER_EVENT_TYPE, HEADER_MESSAGE_ID,
};
use outbox_core::{DestinationTemplate, Envelope, Message};

/// Builds the envelope of `m`, or says why the row cannot be published as stored.
pub(crate) fn envelope(m: &Message, template: &DestinationTemplate) -> Result<Envelope, String> {
    let destination = template.render(m);
    if destination.is_empty() {
        return Err(
            "the destination rendered empty; set `topic` or fix the destination template".into(),
        );
    }
    let mut headers = vec![
        (HEADER_MESSAGE_ID.to_string(), m.id.to_string()),
        (HEADER_EVENT_TYPE.to_string(), m.event_type.clone()),
        (HEADER_AGGREGATE_TYPE.to_string(), m.aggregate_type.clone()),
        (HEADER_AGGREGATE_ID.to_string(), m.aggregate_id.clone()),
    ];
    if !m.headers.is_empty() && m.headers != "{}" {
        match serde_json::from_str::<serde_json::Value>(&m.headers) {
            Ok(serde_json::Value::Object(map)) => {
                for (k, v) in map {
                    let v = match v {
                        serde_json::Value::String(s) => s,
                        other => other.to_string(),
                    };
                    headers.push((k, v));
                }
            }
            Ok(_) | Err(_) => return Err("the row's `headers` is not a JSON object".into()),
        }
    }
    Ok(Envelope {
        id: m.id,
        destination,
        key: m.aggregate_id.clone(),
        headers,
        payload: m.payload.clone(),
        created_at: m.created_at,
    })
}

/// Splits indexes of `batch` (already in sequence order) into waves: wave i holds the i-th
/// message of every key. Publishing wave i+1 only after wave i is acknowledged keeps at most one
/// message per key in flight, so a failure can never let a later message overtake it.
pub(crate) fn waves(batch: &[Message]) -> Vec<Vec<usize>> {
    let mut depth: HashMap<&str, usize> = HashMap::with_capacity(batch.len());
    let mut waves: Vec<Vec<usize>> = Vec::new();
    for (i, m) in batch.iter().enumerate() {
        let d = depth.entry(m.aggregate_id.as_str()).or_insert(0);
        if waves.len() <= *d {
            waves.push(Vec::new());
        }
        waves[*d].push(i);
        *d += 1;
    }
    waves
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(seq: i64, key: &str, headers: &str) -> Message {
        Message {
            seq,
            id: uuid::Uuid::now_v7(),
            aggregate_type: "order".into(),
            aggregate_id: key.into(),
            event_type: "placed".into(),
            payload: "{\"n\":1}".into(),
            headers: headers.into(),
            topic: None,
            created_at: chrono::Utc::now(),
            attempts: 0,
        }
    }

    #[test]
    fn waves_hold_one_message_per_key_in_order() {
        let b = vec![
            msg(1, "a", "{}"),
            msg(2, "b", "{}"),
            msg(3, "a", "{}"),
            msg(4, "a", "{}"),
            msg(5, "c", "{}"),
        ];
        assert_eq!(waves(&b), vec![vec![0, 1, 4], vec![2], vec![3]]);
    }

    #[test]
    fn envelope_carries_ids_and_row_headers() {
        let m = msg(1, "k", r#"{"traceparent":"00-abc-def-01","n":2}"#);
        let e = envelope(&m, &DestinationTemplate::default()).unwrap();
        assert_eq!(e.destination, "order.placed");
        assert_eq!(e.key, "k");
        assert!(e
            .headers
            .contains(&(HEADER_MESSAGE_ID.into(), m.id.to_string())));
        assert!(e
            .headers
            .contains(&("traceparent".into(), "00-abc-def-01".into())));
        assert!(e.headers.contains(&("n".into(), "2".into())));
    }

    #[test]
    fn malformed_headers_are_reported_not_dropped() {
        let m = msg(1, "k", "[1,2]");
        assert!(envelope(&m, &DestinationTemplate::default())
            .unwrap_err()
            .contains("headers"));
    }
}
