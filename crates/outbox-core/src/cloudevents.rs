//! CloudEvents 1.0: the attributes of a message and how each protocol binding lays them out.
//!
//! A pure mapping from the [`Envelope`] the relay builds (its `outbox-*` headers, the row's own
//! headers, the payload) to the envelope a sink publishes when a route asks for
//! `envelope=cloudevents` (binary content mode) or `envelope=cloudevents-structured`
//! (`application/cloudevents+json`). Nothing here talks to a broker: each sink publishes the
//! headers it is given, and reads `content-type` out of them where its protocol has a property
//! of its own for it (HTTP, AMQP, MQTT 5). docs/envelopes.md has the table.
//!
//! | attribute | from |
//! | --- | --- |
//! | `specversion` | `1.0` |
//! | `id` | the message id |
//! | `source` | the route's `source` (a URI-reference, checked at start) |
//! | `type` | the event type |
//! | `subject` | the aggregate id |
//! | `time` | `created_at` (RFC 3339, UTC) |
//! | `datacontenttype` | `application/json` (the payload is the row's JSON) |
//! | `traceparent`, `tracestate` | the row's headers of these names (distributed tracing extension) |
//! | `partitionkey` | the aggregate id, on Kafka only (partitioning extension) |

use std::fmt;

use bytes::Bytes;
use chrono::SecondsFormat;

use crate::sink::{Envelope, HEADER_EVENT_TYPE};
use crate::trace::{HEADER_TRACEPARENT, HEADER_TRACESTATE};

/// The CloudEvents version the relay speaks.
pub const SPEC_VERSION: &str = "1.0";
/// `datacontenttype` of every event: payloads are the row's JSON.
pub const DATA_CONTENT_TYPE: &str = "application/json";
/// The media type of the structured content mode's JSON event format.
pub const STRUCTURED_CONTENT_TYPE: &str = "application/cloudevents+json";
/// The header the envelope carries the content type in; sinks with a property of their own
/// for it (HTTP `Content-Type`, AMQP `content_type`, MQTT 5 Content Type) move it there.
pub const HEADER_CONTENT_TYPE: &str = "content-type";

/// The content type an envelope's headers carry (the CloudEvents formats set it), for sinks
/// whose protocol has a property of its own for it.
pub fn content_type(headers: &[(String, String)]) -> Option<&str> {
    headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(HEADER_CONTENT_TYPE))
        .map(|(_, v)| v.as_str())
}

/// Binary (attributes in the protocol's headers, the payload as it is) or structured (the
/// whole event as one JSON document).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Attributes as headers, the payload byte for byte (the CloudEvents default of a route).
    Binary,
    /// `application/cloudevents+json`: attributes and `data` in the body.
    Structured,
}

/// How one family of sinks carries attributes in binary mode, after the CloudEvents protocol
/// bindings (or, where the specification has none, the convention docs/envelopes.md states).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Binding {
    /// Kafka: `ce_` headers, `content-type` header, `partitionkey` extension.
    Kafka,
    /// HTTP (webhooks): `ce-` headers, percent-encoded values, `Content-Type`.
    Http,
    /// AMQP (RabbitMQ): `cloudEvents:` application properties (headers table), `content_type`.
    Amqp,
    /// MQTT 5: user properties named after the attributes, the Content Type property.
    Mqtt,
    /// NATS: `ce-` headers as the HTTP binding writes them, `content-type` header.
    Nats,
    /// SQS and SNS message attributes: `ce-` names (ten attributes at most per message, so the
    /// relay's `outbox-*` duplicates are left out).
    Attributes,
    /// Redis Streams, files, stdout: `ce_` entries in the headers object.
    Fields,
}

impl Binding {
    /// The binding of the sink named `name` (its [`Sink::name`](crate::Sink::name)).
    pub fn for_sink(name: &str) -> Self {
        match name {
            "kafka" => Self::Kafka,
            "http" => Self::Http,
            "amqp" | "rabbitmq" => Self::Amqp,
            "mqtt" => Self::Mqtt,
            "nats" => Self::Nats,
            "sqs" | "sns" => Self::Attributes,
            _ => Self::Fields,
        }
    }

    /// The prefix of attribute header names.
    pub fn prefix(self) -> &'static str {
        match self {
            Self::Kafka | Self::Fields => "ce_",
            Self::Http | Self::Nats | Self::Attributes => "ce-",
            Self::Amqp => "cloudEvents:",
            Self::Mqtt => "",
        }
    }

    /// Whether values are percent-encoded as the HTTP binding requires (space, `"`, `%` and
    /// anything outside printable ASCII).
    fn percent_encodes(self) -> bool {
        matches!(self, Self::Http | Self::Nats)
    }

    /// Whether the relay's `outbox-*` headers travel beside the attributes in binary mode: not
    /// on SQS/SNS (ten attributes at most) nor on MQTT, where a receiver reads every user
    /// property as an attribute and `outbox-message-id` is not a valid attribute name.
    fn keeps_relay_headers(self) -> bool {
        !matches!(self, Self::Attributes | Self::Mqtt)
    }
}

/// A route's CloudEvents settings, checked when the relay starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloudEvents {
    /// Content mode.
    pub mode: Mode,
    /// The `source` attribute of every event of the route.
    source: String,
}

/// The `source` of a route that sets none.
pub const DEFAULT_SOURCE: &str = "/outbox";

impl CloudEvents {
    /// Settings for `mode` with `source`, which must be a URI-reference (RFC 3986).
    pub fn new(mode: Mode, source: &str) -> Result<Self, String> {
        check_uri_reference(source)?;
        Ok(Self {
            mode,
            source: source.to_string(),
        })
    }

    /// The `source` attribute.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The envelope `binding` publishes for `e` (an envelope as the relay builds it: its
    /// `outbox-*` headers first, then the row's). Refused, with the reason, when a row header
    /// would pass for an attribute (`ce_*`, `ce-*`, `cloudEvents:*`, `content-type`, or on
    /// MQTT an attribute's bare name) or, in structured mode, when the payload is not JSON.
    pub fn apply(&self, binding: Binding, e: &Envelope) -> Result<Envelope, String> {
        let a = Attributes::of(self, binding, e)?;
        let mut out = e.clone();
        match self.mode {
            Mode::Binary => {
                let prefix = binding.prefix();
                let encode = |v: &str| {
                    if binding.percent_encodes() {
                        percent_encode(v)
                    } else {
                        v.to_string()
                    }
                };
                let mut headers = Vec::with_capacity(e.headers.len() + 10);
                for (name, value) in a.pairs() {
                    headers.push((format!("{prefix}{name}"), encode(value)));
                }
                headers.push((
                    HEADER_CONTENT_TYPE.to_string(),
                    DATA_CONTENT_TYPE.to_string(),
                ));
                headers.extend(a.rest(binding, true));
                out.headers = headers;
            }
            Mode::Structured => {
                let mut headers = vec![(
                    HEADER_CONTENT_TYPE.to_string(),
                    STRUCTURED_CONTENT_TYPE.to_string(),
                )];
                headers.extend(a.rest(binding, false));
                out.payload = a.structured(&e.payload)?;
                out.headers = headers;
            }
        }
        Ok(out)
    }
}

/// The attributes of one event, borrowed from its envelope.
struct Attributes<'e> {
    id: String,
    source: &'e str,
    ty: &'e str,
    subject: &'e str,
    time: String,
    traceparent: Option<&'e str>,
    tracestate: Option<&'e str>,
    partitionkey: Option<&'e str>,
    /// Every header of the envelope but the trace context.
    others: Vec<&'e (String, String)>,
}

/// Names a row header may not take in CloudEvents mode on MQTT, where attributes go unprefixed.
const ATTRIBUTE_NAMES: &[&str] = &[
    "specversion",
    "id",
    "source",
    "type",
    "subject",
    "time",
    "datacontenttype",
    "dataschema",
    "partitionkey",
];

impl<'e> Attributes<'e> {
    fn of(ce: &'e CloudEvents, binding: Binding, e: &'e Envelope) -> Result<Self, String> {
        let mut ty = None;
        let mut traceparent = None;
        let mut tracestate = None;
        let mut others = Vec::with_capacity(e.headers.len());
        for h in &e.headers {
            let name = h.0.as_str();
            if name == HEADER_EVENT_TYPE {
                ty = Some(h.1.as_str());
            }
            if name.eq_ignore_ascii_case(HEADER_TRACEPARENT) {
                traceparent = Some(h.1.as_str());
                continue;
            }
            if name.eq_ignore_ascii_case(HEADER_TRACESTATE) {
                tracestate = Some(h.1.as_str());
                continue;
            }
            if let Some(why) = clash(binding, ce.mode, name) {
                return Err(format!(
                    "the row's `headers` sets `{name}`, which {why} in CloudEvents mode; rename it"
                ));
            }
            others.push(h);
        }
        let ty = ty.filter(|t| !t.is_empty()).ok_or_else(|| {
            "the row's `event_type` is empty; it is the CloudEvents `type`, which may not be"
                .to_string()
        })?;
        Ok(Self {
            id: e.id.to_string(),
            source: ce.source(),
            ty,
            subject: &e.key,
            time: e.created_at.to_rfc3339_opts(SecondsFormat::AutoSi, true),
            traceparent,
            tracestate,
            partitionkey: (binding == Binding::Kafka).then_some(e.key.as_str()),
            others,
        })
    }

    /// Attribute names and values for binary mode, `datacontenttype` aside (each binding has
    /// a content-type header or property of its own for it). `subject` is left out when the
    /// aggregate id is empty: the specification forbids an empty one.
    fn pairs(&self) -> Vec<(&'static str, &str)> {
        let mut v = vec![
            ("specversion", SPEC_VERSION),
            ("id", self.id.as_str()),
            ("source", self.source),
            ("type", self.ty),
        ];
        if !self.subject.is_empty() {
            v.push(("subject", self.subject));
        }
        v.push(("time", self.time.as_str()));
        v.extend(self.traceparent.map(|t| ("traceparent", t)));
        v.extend(self.tracestate.map(|t| ("tracestate", t)));
        v.extend(self.partitionkey.map(|k| ("partitionkey", k)));
        v
    }

    /// The headers that travel beside the event: the relay's `outbox-*` (except in binary mode
    /// on SQS and SNS), the row's own, and the W3C trace context under its own names as well
    /// (except in binary mode on MQTT, where those names are the attributes, and on SQS/SNS, to
    /// stay within ten attributes).
    fn rest(&self, binding: Binding, binary: bool) -> Vec<(String, String)> {
        let mut out = Vec::with_capacity(self.others.len() + 2);
        for (name, value) in &self.others {
            if binary && crate::sink::is_reserved_header(name) && !binding.keeps_relay_headers() {
                continue;
            }
            out.push((name.clone(), value.clone()));
        }
        if !(binary && matches!(binding, Binding::Mqtt | Binding::Attributes)) {
            out.extend(
                self.traceparent
                    .map(|t| (HEADER_TRACEPARENT.to_string(), t.to_string())),
            );
            out.extend(
                self.tracestate
                    .map(|t| (HEADER_TRACESTATE.to_string(), t.to_string())),
            );
        }
        out
    }

    /// The JSON event format: every attribute, and `data` as the payload's own JSON.
    fn structured(&self, payload: &[u8]) -> Result<Bytes, String> {
        if serde_json::from_slice::<serde::de::IgnoredAny>(payload).is_err() {
            return Err(
                "the payload is not JSON, so it cannot be the `data` of a structured CloudEvent"
                    .into(),
            );
        }
        let mut out = Vec::with_capacity(payload.len() + 320);
        out.push(b'{');
        let mut first = true;
        let mut field = |out: &mut Vec<u8>, name: &str, value: &str| {
            if !first {
                out.push(b',');
            }
            first = false;
            // Strings always serialise.
            out.extend(serde_json::to_vec(name).unwrap_or_default());
            out.push(b':');
            out.extend(serde_json::to_vec(value).unwrap_or_default());
        };
        for (name, value) in self.pairs() {
            field(&mut out, name, value);
        }
        field(&mut out, "datacontenttype", DATA_CONTENT_TYPE);
        out.extend_from_slice(b",\"data\":");
        out.extend_from_slice(payload);
        out.push(b'}');
        Ok(Bytes::from(out))
    }
}

/// Why a row header named `name` cannot travel with a CloudEvent on `binding` in `mode`, if
/// it cannot.
fn clash(binding: Binding, mode: Mode, name: &str) -> Option<&'static str> {
    if crate::sink::is_reserved_header(name) {
        // The relay's own headers (already checked when the envelope was built).
        return None;
    }
    let lower = name.to_ascii_lowercase();
    if lower == HEADER_CONTENT_TYPE {
        return Some("is the event's content type");
    }
    if ["ce_", "ce-", "cloudevents:", "cloudevents_"]
        .iter()
        .any(|p| lower.starts_with(p))
    {
        return Some("would pass for a CloudEvents attribute");
    }
    if binding == Binding::Mqtt && ATTRIBUTE_NAMES.contains(&lower.as_str()) {
        return Some("is a CloudEvents attribute's name (MQTT user properties carry them bare)");
    }
    let extension_name = !name.is_empty()
        && name.len() <= 20
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    if binding == Binding::Mqtt && mode == Mode::Binary && !extension_name {
        return Some(
            "is not a valid CloudEvents attribute name (a-z, 0-9, at most 20), and MQTT binary \
             mode makes every user property an attribute",
        );
    }
    None
}

/// Percent-encodes `value` as the HTTP binding requires of header values: space, `"`, `%` and
/// every byte outside printable ASCII.
pub fn percent_encode(value: &str) -> String {
    const SET: &percent_encoding::AsciiSet =
        &percent_encoding::CONTROLS.add(b' ').add(b'"').add(b'%');
    percent_encoding::utf8_percent_encode(value, SET).to_string()
}

/// Checks that `s` is a URI-reference (RFC 3986): a non-empty string of URI characters, `%`
/// only before two hex digits, and a scheme (when one is given) of a letter followed by
/// letters, digits, `+`, `-` or `.`.
pub fn check_uri_reference(s: &str) -> Result<(), String> {
    let bad = |why: &str| {
        Err(format!(
            "source `{}` is not a URI-reference: {why}",
            shown(s)
        ))
    };
    if s.is_empty() {
        return bad("it is empty");
    }
    let bytes = s.as_bytes();
    for (i, &b) in bytes.iter().enumerate() {
        let ok = b.is_ascii_alphanumeric() || b"-._~:/?#[]@!$&'()*+,;=%".contains(&b);
        if !ok {
            return bad(&format!(
                "the character {:?} must be percent-encoded",
                b as char
            ));
        }
        if b == b'%'
            && !(bytes.get(i + 1).is_some_and(u8::is_ascii_hexdigit)
                && bytes.get(i + 2).is_some_and(u8::is_ascii_hexdigit))
        {
            return bad("`%` must start a percent-encoded byte (two hex digits)");
        }
    }
    let head_end = s.find(['/', '?', '#']).unwrap_or(s.len());
    if let Some(colon) = s[..head_end].find(':') {
        let scheme = &s[..colon];
        let valid = scheme
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic())
            && scheme
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c));
        if !valid {
            return bad(
                "the part before the first `:` is not a scheme (a relative reference \
                        with a `:` in its first segment must start with `./`)",
            );
        }
    }
    Ok(())
}

/// At most 100 characters, for messages.
fn shown(s: &str) -> String {
    match s.char_indices().nth(100) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mode::Binary => "binary",
            Mode::Structured => "structured",
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::sink::{HEADER_AGGREGATE_ID, HEADER_AGGREGATE_TYPE, HEADER_MESSAGE_ID};
    use chrono::TimeZone;

    fn envelope(extra: &[(&str, &str)]) -> Envelope {
        let id = uuid::Uuid::parse_str("0190f3c4-2b1e-7cc0-8a41-6f0e3b7d2a10").unwrap();
        let mut headers = vec![
            (HEADER_MESSAGE_ID.to_string(), id.to_string()),
            (HEADER_EVENT_TYPE.to_string(), "payment.created".to_string()),
            (HEADER_AGGREGATE_TYPE.to_string(), "payment".to_string()),
            (HEADER_AGGREGATE_ID.to_string(), "pay 1/é".to_string()),
        ];
        headers.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        Envelope {
            id,
            destination: "payments".into(),
            key: "pay 1/é".into(),
            headers,
            payload: Bytes::from_static(br#"{"amount":12}"#),
            created_at: chrono::Utc
                .with_ymd_and_hms(2026, 12, 6, 9, 30, 1)
                .unwrap()
                .checked_add_signed(chrono::Duration::microseconds(123_456))
                .unwrap(),
        }
    }

    fn header<'a>(e: &'a Envelope, name: &str) -> Option<&'a str> {
        e.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    const TP: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

    #[test]
    fn kafka_binary_mode_maps_every_attribute_to_a_ce_header() {
        let ce = CloudEvents::new(Mode::Binary, "/payments/eu").unwrap();
        let e = envelope(&[
            ("traceparent", TP),
            ("tracestate", "a=1"),
            ("x-tenant", "7"),
        ]);
        let out = ce.apply(Binding::Kafka, &e).unwrap();
        for (name, value) in [
            ("ce_specversion", "1.0"),
            ("ce_id", "0190f3c4-2b1e-7cc0-8a41-6f0e3b7d2a10"),
            ("ce_source", "/payments/eu"),
            ("ce_type", "payment.created"),
            ("ce_subject", "pay 1/é"),
            ("ce_time", "2026-12-06T09:30:01.123456Z"),
            ("ce_traceparent", TP),
            ("ce_tracestate", "a=1"),
            ("ce_partitionkey", "pay 1/é"),
            ("content-type", "application/json"),
            // Beside the event: the relay's headers, the row's, the trace context.
            (HEADER_MESSAGE_ID, "0190f3c4-2b1e-7cc0-8a41-6f0e3b7d2a10"),
            ("x-tenant", "7"),
            ("traceparent", TP),
        ] {
            assert_eq!(header(&out, name), Some(value), "{name}");
        }
        assert_eq!(
            out.payload, e.payload,
            "binary mode leaves the payload as it is"
        );
        assert_eq!(out.key, e.key);
    }

    #[test]
    fn http_values_are_percent_encoded_and_other_bindings_use_their_prefix() {
        let ce = CloudEvents::new(Mode::Binary, "urn:shop:payments").unwrap();
        let e = envelope(&[]);
        let http = ce.apply(Binding::Http, &e).unwrap();
        assert_eq!(header(&http, "ce-subject"), Some("pay%201/%C3%A9"));
        assert_eq!(header(&http, "ce-source"), Some("urn:shop:payments"));
        assert_eq!(header(&http, "ce-partitionkey"), None, "Kafka only");
        let amqp = ce.apply(Binding::Amqp, &e).unwrap();
        assert_eq!(header(&amqp, "cloudEvents:type"), Some("payment.created"));
        assert_eq!(header(&amqp, "cloudEvents:subject"), Some("pay 1/é"));
        let mqtt = ce.apply(Binding::Mqtt, &e).unwrap();
        assert_eq!(header(&mqtt, "specversion"), Some("1.0"));
        assert_eq!(header(&mqtt, "id"), Some(e.id.to_string().as_str()));
        let sqs = ce
            .apply(Binding::Attributes, &envelope(&[("traceparent", TP)]))
            .unwrap();
        assert_eq!(header(&sqs, "ce-id"), Some(e.id.to_string().as_str()));
        assert!(sqs.headers.len() <= 10, "{:?}", sqs.headers);
        assert!(sqs.headers.iter().all(|(k, _)| !k.starts_with("outbox-")));
        let redis = ce.apply(Binding::Fields, &e).unwrap();
        assert_eq!(
            header(&redis, "ce_time"),
            Some("2026-12-06T09:30:01.123456Z")
        );
    }

    #[test]
    fn structured_mode_is_one_json_event_with_the_payload_as_data() {
        let ce = CloudEvents::new(Mode::Structured, "https://shop.example/payments").unwrap();
        let e = envelope(&[("traceparent", TP)]);
        let out = ce.apply(Binding::Kafka, &e).unwrap();
        assert_eq!(header(&out, "content-type"), Some(STRUCTURED_CONTENT_TYPE));
        assert_eq!(header(&out, "ce_id"), None);
        let v: serde_json::Value = serde_json::from_slice(&out.payload).unwrap();
        assert_eq!(
            v,
            serde_json::json!({
                "specversion": "1.0",
                "id": e.id.to_string(),
                "source": "https://shop.example/payments",
                "type": "payment.created",
                "subject": "pay 1/é",
                "time": "2026-12-06T09:30:01.123456Z",
                "traceparent": TP,
                "partitionkey": "pay 1/é",
                "datacontenttype": "application/json",
                "data": {"amount": 12},
            })
        );
        let mut bad = envelope(&[]);
        bad.payload = Bytes::from_static(b"not json");
        assert!(ce
            .apply(Binding::Kafka, &bad)
            .unwrap_err()
            .contains("not JSON"));
    }

    #[test]
    fn row_headers_that_would_pass_for_attributes_are_refused() {
        let ce = CloudEvents::new(Mode::Binary, "/s").unwrap();
        for (binding, name) in [
            (Binding::Kafka, "ce_id"),
            (Binding::Http, "CE-Source"),
            (Binding::Amqp, "cloudEvents:type"),
            (Binding::Kafka, "Content-Type"),
            (Binding::Mqtt, "subject"),
        ] {
            let err = ce.apply(binding, &envelope(&[(name, "x")])).unwrap_err();
            assert!(err.contains(name), "{name}: {err}");
        }
        assert!(ce
            .apply(Binding::Kafka, &envelope(&[("subject", "x")]))
            .is_ok());
        // MQTT binary mode: every user property is an attribute, so only attribute names.
        let err = ce
            .apply(Binding::Mqtt, &envelope(&[("x-tenant", "7")]))
            .unwrap_err();
        assert!(err.contains("x-tenant"), "{err}");
        let ok = ce
            .apply(Binding::Mqtt, &envelope(&[("tenant", "7")]))
            .unwrap();
        assert!(ok.headers.iter().all(|(k, _)| !k.starts_with("outbox-")));
        let structured = CloudEvents::new(Mode::Structured, "/s").unwrap();
        assert!(structured
            .apply(Binding::Mqtt, &envelope(&[("x-tenant", "7")]))
            .is_ok());
    }

    #[test]
    fn an_empty_aggregate_id_leaves_subject_out() {
        let ce = CloudEvents::new(Mode::Binary, "/s").unwrap();
        let mut e = envelope(&[]);
        e.key.clear();
        let out = ce.apply(Binding::Http, &e).unwrap();
        assert_eq!(header(&out, "ce-subject"), None);
    }

    #[test]
    fn sources_must_be_uri_references() {
        for ok in [
            "/outbox",
            "urn:shop:payments",
            "https://shop.example/p?x=1#f",
            "payments",
            "./a:b",
            "%2F",
            "mailto:a@b",
        ] {
            assert!(check_uri_reference(ok).is_ok(), "{ok}");
        }
        for bad in ["", "a b", "1x:y", "%zz", "é", "a\nb", "<x>"] {
            assert!(check_uri_reference(bad).is_err(), "{bad:?}");
        }
    }
}
