//! Reading CloudEvents 1.0 from what a broker delivered, whoever produced them (the relay's
//! `envelope=cloudevents` routes, an official SDK, Knative, …), in binary and structured mode.
//!
//! Binary mode is recognised by a `specversion` attribute header under any binding's prefix
//! (`ce_` Kafka, `ce-` HTTP and NATS, `cloudEvents:` / `cloudEvents_` AMQP, bare on MQTT);
//! structured mode by an `application/cloudevents+json` content type, or, where the protocol
//! carries no content type (NATS, MQTT user properties), by a JSON object body holding
//! `specversion`, `id`, `source` and `type`. The CloudEvent `id` is the dedupe id: as it is
//! when it is a UUID, else a UUIDv5 of `source` and `id` (the pair the specification makes
//! unique), the same on every redelivery.

use base64::Engine as _;
use uuid::Uuid;

/// A CloudEvent as the inbox records it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Read {
    /// The dedupe id.
    pub id: Uuid,
    /// `type`.
    pub ty: String,
    /// `partitionkey`, else `subject`.
    pub key: Option<String>,
    /// Every attribute but `data`, named `ce-<attribute>`, for the handler to read.
    pub attributes: Vec<(String, String)>,
    /// `data` as bytes, when the event is structured (binary mode's data is the body itself).
    pub data: Option<Vec<u8>>,
}

/// Prefixes of attribute headers in binary mode, by binding (compared without regard to case).
const PREFIXES: &[&str] = &["ce_", "ce-", "cloudevents:", "cloudevents_", ""];

/// The CloudEvent in `headers` and `body`, if they hold one.
pub(crate) fn read(headers: &[(String, String)], body: &[u8]) -> Option<Read> {
    binary(headers).or_else(|| structured(headers, body))
}

fn binary(headers: &[(String, String)]) -> Option<Read> {
    let prefix = PREFIXES.iter().find(|p| {
        headers
            .iter()
            .any(|(k, _)| strip(k, p).is_some_and(|n| n.eq_ignore_ascii_case("specversion")))
    })?;
    let mut attributes = Vec::new();
    for (k, v) in headers {
        let Some(name) = strip(k, prefix) else {
            continue;
        };
        // The bare (MQTT) form: only CloudEvents attribute names, nothing else a property holds.
        if prefix.is_empty() && !is_attribute_name(name) {
            continue;
        }
        let v = if *prefix == "ce-" {
            percent_encoding::percent_decode_str(v)
                .decode_utf8_lossy()
                .into_owned()
        } else {
            v.clone()
        };
        attributes.push((name.to_ascii_lowercase(), v));
    }
    if let Some((_, ct)) = headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("content-type"))
    {
        if !attributes.iter().any(|(n, _)| n == "datacontenttype") {
            attributes.push(("datacontenttype".into(), ct.clone()));
        }
    }
    finish(attributes, None)
}

fn structured(headers: &[(String, String)], body: &[u8]) -> Option<Read> {
    let declared = headers.iter().any(|(k, v)| {
        k.eq_ignore_ascii_case("content-type")
            && v.trim_start()
                .to_ascii_lowercase()
                .starts_with("application/cloudevents+json")
    });
    // Cheap test first: only a JSON object naming `specversion` can be an event.
    if !declared && body.trim_ascii_start().first() != Some(&b'{') {
        return None;
    }
    let serde_json::Value::Object(mut event) = serde_json::from_slice(body).ok()? else {
        return None;
    };
    if !event.contains_key("specversion") {
        return None;
    }
    let data = match (event.remove("data"), event.remove("data_base64")) {
        (Some(serde_json::Value::String(s)), _) if !is_json_type(&event) => Some(s.into_bytes()),
        (Some(v), _) => Some(v.to_string().into_bytes()),
        (None, Some(serde_json::Value::String(b))) => Some(
            base64::engine::general_purpose::STANDARD
                .decode(b.as_bytes())
                .ok()?,
        ),
        _ => Some(Vec::new()),
    };
    let attributes = event
        .into_iter()
        .map(|(k, v)| {
            let v = match v {
                serde_json::Value::String(s) => s,
                other => other.to_string(),
            };
            (k.to_ascii_lowercase(), v)
        })
        .collect();
    finish(attributes, data)
}

/// Whether the event's `datacontenttype` is JSON (absent means JSON in the JSON format), so a
/// string `data` is a JSON string rather than text.
fn is_json_type(event: &serde_json::Map<String, serde_json::Value>) -> bool {
    match event.get("datacontenttype").and_then(|v| v.as_str()) {
        None => true,
        Some(t) => {
            let t = t.to_ascii_lowercase();
            t.starts_with("application/json") || t.contains("+json")
        }
    }
}

fn finish(attributes: Vec<(String, String)>, data: Option<Vec<u8>>) -> Option<Read> {
    let get = |n: &str| {
        attributes
            .iter()
            .find(|(k, _)| k == n)
            .map(|(_, v)| v.clone())
    };
    let raw_id = get("id").filter(|s| !s.is_empty())?;
    let source = get("source").unwrap_or_default();
    let id = raw_id.trim().parse().unwrap_or_else(|_| {
        Uuid::new_v5(
            &Uuid::NAMESPACE_URL,
            format!("cloudevents:{source}\n{raw_id}").as_bytes(),
        )
    });
    Some(Read {
        id,
        ty: get("type").unwrap_or_default(),
        key: get("partitionkey")
            .or_else(|| get("subject"))
            .filter(|k| !k.is_empty()),
        attributes: attributes
            .into_iter()
            .map(|(k, v)| (format!("ce-{k}"), v))
            .collect(),
        data,
    })
}

/// `name` without `prefix` (compared without regard to case), if it starts with it.
fn strip<'a>(name: &'a str, prefix: &str) -> Option<&'a str> {
    let head = name.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix)
        .then(|| &name[prefix.len()..])
        .filter(|n| !n.is_empty())
}

/// Attribute names MQTT carries bare: the core ones and the extensions the relay writes.
fn is_attribute_name(name: &str) -> bool {
    [
        "specversion",
        "id",
        "source",
        "type",
        "subject",
        "time",
        "datacontenttype",
        "dataschema",
        "traceparent",
        "tracestate",
        "partitionkey",
    ]
    .iter()
    .any(|a| a.eq_ignore_ascii_case(name))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn h(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn binary_mode_is_read_under_every_binding_prefix() {
        let id = Uuid::now_v7();
        for (p, subject) in [
            ("ce_", "a b"),
            ("ce-", "a%20b"),
            ("cloudEvents:", "a b"),
            ("cloudEvents_", "a b"),
            ("", "a b"),
        ] {
            let n = |a: &str| format!("{p}{a}");
            let headers = h(&[
                (&n("specversion"), "1.0"),
                (&n("id"), &id.to_string()),
                (&n("source"), "/s"),
                (&n("type"), "order.placed"),
                (&n("subject"), subject),
                ("content-type", "application/json"),
                ("other", "x"),
            ]);
            let r = read(&headers, b"{}").unwrap();
            assert_eq!(r.id, id, "{p}");
            assert_eq!(r.ty, "order.placed");
            assert_eq!(r.key.as_deref(), Some("a b"), "{p}");
            assert!(r.data.is_none());
            assert!(r
                .attributes
                .contains(&("ce-datacontenttype".into(), "application/json".into())));
            assert!(!r.attributes.iter().any(|(k, _)| k == "ce-other"), "{p}");
        }
    }

    #[test]
    fn structured_mode_is_read_from_the_body_and_a_string_id_gets_a_stable_uuid() {
        let body = br#"{"specversion":"1.0","id":"A234-1234","source":"urn:x","type":"t",
            "partitionkey":"k1","subject":"s","data":{"n":1}}"#;
        let declared = h(&[(
            "content-type",
            "application/cloudevents+json; charset=utf-8",
        )]);
        let a = read(&declared, body).unwrap();
        let b = read(&[], body).unwrap();
        assert_eq!(
            a, b,
            "NATS and MQTT carry no content type: the body says it"
        );
        assert_eq!(a.id, read(&[], body).unwrap().id, "same event, same id");
        assert_eq!(a.key.as_deref(), Some("k1"), "partitionkey before subject");
        assert_eq!(a.data.as_deref(), Some(&br#"{"n":1}"#[..]));
        let other_source = br#"{"specversion":"1.0","id":"A234-1234","source":"urn:y","type":"t"}"#;
        assert_ne!(read(&[], other_source).unwrap().id, a.id);
        let b64 = br#"{"specversion":"1.0","id":"1","source":"s","type":"t","data_base64":"AAE="}"#;
        assert_eq!(read(&[], b64).unwrap().data.as_deref(), Some(&[0u8, 1][..]));
        let text = br#"{"specversion":"1.0","id":"1","source":"s","type":"t",
            "datacontenttype":"text/plain","data":"hi"}"#;
        assert_eq!(read(&[], text).unwrap().data.as_deref(), Some(&b"hi"[..]));
    }

    #[test]
    fn ordinary_messages_are_not_events() {
        assert!(read(&h(&[("outbox-message-id", "x")]), br#"{"id":"1"}"#).is_none());
        assert!(read(&[], b"plain").is_none());
        assert!(
            read(&h(&[("ce_specversion", "1.0")]), b"{}").is_none(),
            "no id"
        );
    }
}
