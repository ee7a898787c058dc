//! Headers as SQS and SNS message attributes, bodies, sizes and FIFO ids.
//!
//! Both services take at most ten attributes per message, each a non-empty value under a name
//! of `A-Z a-z 0-9 _ - .` (no leading, trailing or doubled `.`, nothing starting with `AWS.`
//! or `Amazon.`). An envelope carries the relay's four `outbox-*` headers and the row's own;
//! when they do not fit one attribute each, the row's headers travel together as one JSON
//! object in the attribute [`PACKED_HEADERS`] (see [`attributes`]).

use outbox_core::{Envelope, SinkError};

/// Most attributes SQS and SNS take on one message (SNS also for raw delivery to SQS).
pub(crate) const MAX_ATTRIBUTES: usize = 10;

/// The attribute carrying a row's headers as one JSON object when they do not fit one
/// attribute each. `outbox-` is reserved for the relay, so no row header can clash with it.
pub const PACKED_HEADERS: &str = "outbox-headers";

/// The attribute data type every header is sent as.
pub(crate) const STRING: &str = "String";

/// Longest attribute name both services take.
const MAX_ATTRIBUTE_NAME: usize = 256;

/// Longest FIFO `MessageGroupId` (and `MessageDeduplicationId`).
const MAX_FIFO_ID: usize = 128;

/// The attributes of `e`, in header order (the relay's first).
///
/// Each header becomes one `String` attribute when all of them fit: at most
/// [`MAX_ATTRIBUTES`] and none empty (the services refuse an empty value). Otherwise the
/// relay's non-empty `outbox-*` headers stay one attribute each (at most four, the message id
/// always among them), a CloudEvent's `ce-*` and `content-type` too while they fit, and
/// everything else goes as one JSON object of name → value in
/// [`PACKED_HEADERS`]; the readers unpack it. Every row header name must be a valid attribute
/// name either way, so whether a row publishes does not depend on how many headers it has.
pub(crate) fn attributes(service: &str, e: &Envelope) -> Result<Vec<(String, String)>, SinkError> {
    for (name, value) in &e.headers {
        if let Some(why) = invalid_name(name) {
            return Err(SinkError::invalid(format!(
                "{service}: header `{}` cannot be a message attribute name: {why}",
                shorten(name)
            )));
        }
        if let Some(c) = value.chars().find(|&c| !allowed_char(c)) {
            return Err(SinkError::invalid(format!(
                "{service}: header `{}` holds the character {c:?}, which {service} does not \
                 accept",
                shorten(name)
            )));
        }
    }
    let fits = e.headers.len() <= MAX_ATTRIBUTES && e.headers.iter().all(|(_, v)| !v.is_empty());
    if fits {
        return Ok(e.headers.clone());
    }
    // A CloudEvent's attributes (`ce-*`, `content-type`) stay attributes too when they fit
    // beside the relay's and the packed one, so a CloudEvents consumer still sees them.
    let cloudevent = |name: &str| {
        name.get(..3).is_some_and(|p| p.eq_ignore_ascii_case("ce-"))
            || name.eq_ignore_ascii_case("content-type")
    };
    let kept = e
        .headers
        .iter()
        .filter(|(n, v)| (is_relay_header(n) || cloudevent(n)) && !v.is_empty())
        .count();
    let keep_events = kept < MAX_ATTRIBUTES;
    let mut attrs = Vec::with_capacity(5);
    let mut packed = serde_json::Map::new();
    for (name, value) in &e.headers {
        if (is_relay_header(name) || (keep_events && cloudevent(name))) && !value.is_empty() {
            attrs.push((name.clone(), value.clone()));
        } else {
            packed.insert(name.clone(), serde_json::Value::String(value.clone()));
        }
    }
    attrs.push((
        PACKED_HEADERS.to_string(),
        serde_json::Value::Object(packed).to_string(),
    ));
    Ok(attrs)
}

/// The relay's own headers (`outbox-message-id`, `outbox-event-type`, …).
fn is_relay_header(name: &str) -> bool {
    name.get(..7)
        .is_some_and(|p| p.eq_ignore_ascii_case("outbox-"))
}

/// Attributes as a consumer reads them back, with [`PACKED_HEADERS`] unpacked into one header
/// per entry (where the packed value is not a JSON object of strings, it is kept as it is).
pub(crate) fn unpack(attrs: Vec<(String, String)>) -> Vec<(String, String)> {
    let mut out = Vec::with_capacity(attrs.len());
    for (name, value) in attrs {
        if name == PACKED_HEADERS {
            if let Ok(serde_json::Value::Object(map)) = serde_json::from_str(&value) {
                for (k, v) in map {
                    match v {
                        serde_json::Value::String(s) => out.push((k, s)),
                        other => out.push((k, other.to_string())),
                    }
                }
                continue;
            }
        }
        out.push((name, value));
    }
    out
}

/// Why `name` is no SQS/SNS attribute name, if it is not one.
fn invalid_name(name: &str) -> Option<&'static str> {
    if name.is_empty() || name.len() > MAX_ATTRIBUTE_NAME {
        return Some("a name has 1 to 256 characters");
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
    {
        return Some("only A-Z, a-z, 0-9, `_`, `-` and `.` are allowed");
    }
    if name.starts_with('.') || name.ends_with('.') || name.contains("..") {
        return Some("a name may not start or end with `.` nor hold `..`");
    }
    let lower = name.to_ascii_lowercase();
    if lower.starts_with("aws.") || lower.starts_with("amazon.") {
        return Some("names starting with `AWS.` or `Amazon.` are reserved by AWS");
    }
    None
}

/// Whether SQS and SNS accept `c` in a body or an attribute value: tab, line feed, carriage
/// return and everything from U+0020 but U+FFFE and U+FFFF (Rust strings hold no surrogates).
fn allowed_char(c: char) -> bool {
    matches!(c, '\t' | '\n' | '\r') || (c >= ' ' && c != '\u{FFFE}' && c != '\u{FFFF}')
}

/// The body of `e`: its JSON payload as text, borrowed (the SDK's request takes an owned copy
/// when a batch call is built).
pub(crate) fn body<'a>(service: &str, e: &'a Envelope) -> Result<&'a str, SinkError> {
    let text = std::str::from_utf8(&e.payload)
        .map_err(|_| SinkError::invalid(format!("{service}: the payload is not UTF-8 text")))?;
    if text.is_empty() {
        return Err(SinkError::invalid(format!(
            "{service}: the payload is empty; {service} takes no empty message"
        )));
    }
    if let Some(c) = text.chars().find(|&c| !allowed_char(c)) {
        return Err(SinkError::invalid(format!(
            "{service}: the payload holds the character {c:?}, which {service} does not accept"
        )));
    }
    Ok(text)
}

/// The size SQS and SNS count against their limit: the body and, for every attribute, its
/// name, its type and its value, in bytes.
pub(crate) fn message_size(body: &str, attrs: &[(String, String)]) -> usize {
    body.len()
        + attrs
            .iter()
            .map(|(k, v)| k.len() + STRING.len() + v.len())
            .sum::<usize>()
}

/// The `MessageGroupId` of `e` on a FIFO queue or topic: its key (the aggregate id), which
/// must be 1 to 128 printable ASCII characters without spaces.
pub(crate) fn group_id<'a>(service: &str, e: &'a Envelope) -> Result<&'a str, SinkError> {
    let key = e.key.as_str();
    let ok =
        !key.is_empty() && key.len() <= MAX_FIFO_ID && key.bytes().all(|b| b.is_ascii_graphic());
    if ok {
        Ok(key)
    } else {
        Err(SinkError::invalid(format!(
            "{service}: the aggregate id `{}` cannot be a FIFO MessageGroupId (1 to 128 \
             printable ASCII characters, no spaces)",
            shorten(key)
        )))
    }
}

/// Whether `name` can name an SQS queue or an SNS topic: 1 to `max` characters of
/// `A-Z a-z 0-9 _ -`, with `.fifo` at the end of a FIFO one's (counted in `max`).
pub(crate) fn valid_name(name: &str, max: usize) -> bool {
    let stem = name.strip_suffix(".fifo").unwrap_or(name);
    !stem.is_empty()
        && name.len() <= max
        && stem
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// `destination` as the name of a queue or topic (`noun`) of `service`, which takes names of
/// at most `max` characters and otherwise addresses of the form `address` (`URL`, `ARN`); a
/// destination that is neither is an invalid message, since no queue or topic can have it.
pub(crate) fn name_of(
    service: &str,
    noun: &str,
    max: usize,
    address: &str,
    destination: &str,
) -> Result<String, SinkError> {
    if valid_name(destination, max) {
        return Ok(destination.to_string());
    }
    Err(SinkError::invalid(format!(
        "{service}: `{}` is not a {noun} name (1 to {max} characters of A-Z, a-z, 0-9, `_` and \
         `-`, and `.fifo` at the end of a FIFO {noun}'s) nor a {noun} {address}",
        shorten(destination)
    )))
}

/// Whether a queue or topic (name, URL or ARN) is FIFO: its name ends with `.fifo`.
pub(crate) fn is_fifo(destination: &str) -> bool {
    destination.ends_with(".fifo")
}

/// At most 100 characters of row data, for error messages.
pub(crate) fn shorten(s: &str) -> String {
    match s.char_indices().nth(100) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use outbox_core::sink::HEADER_MESSAGE_ID;

    fn envelope(headers: &[(&str, &str)]) -> Envelope {
        let mut all = vec![
            (
                HEADER_MESSAGE_ID.to_string(),
                "0190b3c2-0000-7000-8000-000000000001".to_string(),
            ),
            ("outbox-event-type".to_string(), "placed".to_string()),
            ("outbox-aggregate-type".to_string(), "order".to_string()),
            ("outbox-aggregate-id".to_string(), "o-1".to_string()),
        ];
        all.extend(headers.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        Envelope {
            id: uuid::Uuid::nil(),
            destination: "q".into(),
            key: "o-1".into(),
            headers: all,
            payload: bytes::Bytes::from_static(br#"{"n":1}"#),
            created_at: chrono::Utc::now(),
        }
    }

    #[test]
    fn headers_that_fit_are_one_attribute_each() {
        let e = envelope(&[("traceparent", "00-ab-cd-01"), ("tenant", "t1")]);
        let a = attributes("sqs", &e).unwrap();
        assert_eq!(a, e.headers);
        assert_eq!(unpack(a), e.headers);
    }

    #[test]
    fn too_many_or_empty_headers_are_packed_and_unpack_to_the_same_headers() {
        let many: Vec<(String, String)> =
            (0..7).map(|i| (format!("h{i}"), format!("v{i}"))).collect();
        let refs: Vec<(&str, &str)> = many.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let e = envelope(&refs);
        let a = attributes("sqs", &e).unwrap();
        assert_eq!(a.len(), 5, "{a:?}");
        assert_eq!(a[4].0, PACKED_HEADERS);
        assert_eq!(unpack(a), e.headers);

        let e = envelope(&[("empty", "")]);
        let a = attributes("sns", &e).unwrap();
        assert_eq!(a.len(), 5);
        assert!(a.iter().all(|(_, v)| !v.is_empty()));
        assert_eq!(unpack(a), e.headers);
    }

    #[test]
    fn a_cloudevents_attributes_stay_attributes_when_row_headers_are_packed() {
        let mut e = envelope(&[]);
        e.headers = [
            "ce-specversion",
            "ce-id",
            "ce-source",
            "ce-type",
            "ce-subject",
            "ce-time",
            "ce-traceparent",
            "content-type",
            "h1",
            "h2",
            "h3",
        ]
        .iter()
        .map(|n| (n.to_string(), "v".to_string()))
        .collect();
        let a = attributes("sqs", &e).unwrap();
        assert_eq!(a.len(), 9, "{a:?}");
        assert!(a.iter().any(|(k, _)| k == "ce-id"));
        assert_eq!(unpack(a).len(), e.headers.len());
    }

    #[test]
    fn invalid_attribute_names_and_values_are_invalid_messages() {
        for bad in ["a/b", "AWS.x", "amazon.trace", ".a", "a.", "a..b", "é"] {
            let e = attributes("sqs", &envelope(&[(bad, "v")])).unwrap_err();
            assert_eq!(e.kind, outbox_core::SinkErrorKind::Invalid, "{bad}");
        }
        assert!(attributes("sqs", &envelope(&[("x-AWS.y", "v")])).is_ok());
        let e = attributes("sqs", &envelope(&[("x", "a\u{1}b")])).unwrap_err();
        assert_eq!(e.kind, outbox_core::SinkErrorKind::Invalid);
    }

    #[test]
    fn fifo_group_ids_must_be_printable_ascii_up_to_128() {
        let mut e = envelope(&[]);
        assert_eq!(group_id("sqs", &e).unwrap(), "o-1");
        for bad in ["", "has space", "é", &"k".repeat(129)] {
            e.key = bad.to_string();
            assert!(group_id("sqs", &e).is_err(), "{bad}");
        }
    }

    #[test]
    fn sizes_count_body_names_types_and_values() {
        let a = vec![("ab".to_string(), "xyz".to_string())];
        assert_eq!(message_size("12345", &a), 5 + 2 + 6 + 3);
    }

    #[test]
    fn bodies_refuse_characters_the_services_refuse() {
        let mut e = envelope(&[]);
        assert_eq!(body("sqs", &e).unwrap(), r#"{"n":1}"#);
        e.payload = bytes::Bytes::from_static(b"\"a\x01\"");
        assert!(body("sqs", &e).is_err());
        e.payload = bytes::Bytes::from_static(b"\xff");
        assert!(body("sqs", &e).is_err());
    }
}
