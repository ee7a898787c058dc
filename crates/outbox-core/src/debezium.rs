//! `envelope=debezium`: what Debezium's Outbox Event Router (the `EventRouter` SMT) produces,
//! so consumers written for it keep working when the relay replaces Kafka Connect.
//!
//! With its defaults, for a row (`id`, `aggregatetype`, `aggregateid`, `type`, `payload`):
//!
//! | Event Router | here |
//! | --- | --- |
//! | topic `outbox.event.<aggregatetype>` (`route.by.field`, `route.topic.replacement`) | the route's destination template, built from the same two options |
//! | record key: `aggregateid` | the aggregate id (every sink's key) |
//! | header `id`: the row's `id` | header `id` = the message id |
//! | value: `payload` (a JSON string with the JsonConverter; the JSON itself with `table.expand.json.payload=true`) | the same |
//! | `table.fields.additional.placement=<column>:header\|envelope[:alias]` | the same; a column other than the four is the row's header of that name (the adopted Debezium table copies extra columns there) |
//!
//! Placement `partition` is refused at start (a sink chooses the partition from the key).

use bytes::Bytes;

use crate::routing::DestinationTemplate;
use crate::sink::{Envelope, HEADER_AGGREGATE_TYPE, HEADER_EVENT_TYPE};

/// The header the Event Router puts the event id in.
pub const HEADER_ID: &str = "id";
/// `route.topic.replacement`'s default.
pub const DEFAULT_TOPIC_REPLACEMENT: &str = "outbox.event.${routedByValue}";

/// Where an additional field goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// A header named after the alias.
    Header,
    /// A field of the value, which becomes `{"payload": …, <alias>: …}`.
    Envelope,
}

/// One entry of `table.fields.additional.placement`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Additional {
    /// Column (`type`, `aggregatetype`, `aggregateid`, `id`, or a row header's name).
    pub column: String,
    /// Where it goes.
    pub placement: Placement,
    /// Its name there (the column's by default).
    pub alias: String,
}

/// A route's Event Router settings, checked when the relay starts.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Debezium {
    /// `table.expand.json.payload`: the payload's JSON as the value instead of a JSON string.
    pub expand_json_payload: bool,
    /// `table.fields.additional.placement`.
    pub additional: Vec<Additional>,
    /// `route.by.field`.
    pub route_by_field: String,
    /// `route.topic.replacement`.
    pub topic_replacement: String,
}

impl Debezium {
    /// Settings from the Event Router's option names (those left out take its defaults).
    pub fn from_options<'a>(
        options: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<Self, String> {
        let mut d = Self {
            route_by_field: "aggregatetype".into(),
            topic_replacement: DEFAULT_TOPIC_REPLACEMENT.into(),
            ..Self::default()
        };
        for (k, v) in options {
            match k {
                "route.by.field" => d.route_by_field = v.to_string(),
                "route.topic.replacement" => d.topic_replacement = v.to_string(),
                "table.expand.json.payload" => {
                    d.expand_json_payload = crate::options::parse_bool(v)
                        .map_err(|e| format!("table.expand.json.payload: {e}"))?
                }
                "table.fields.additional.placement" => d.additional = parse_additional(v)?,
                other => {
                    return Err(format!(
                        "`{}` is not an Event Router option the relay takes; use \
                         route.by.field, route.topic.replacement, table.expand.json.payload, \
                         table.fields.additional.placement",
                        crate::redact::sanitize(other)
                    ))
                }
            }
        }
        d.destination()?;
        Ok(d)
    }

    /// The destination template `route.by.field` and `route.topic.replacement` make.
    pub fn destination(&self) -> Result<DestinationTemplate, String> {
        let field = match self.route_by_field.as_str() {
            "aggregatetype" => "{aggregate_type}",
            "aggregateid" => "{aggregate_id}",
            "type" => "{event_type}",
            other => {
                return Err(format!(
                    "route.by.field `{}`: the relay routes by aggregatetype, aggregateid or type",
                    crate::redact::sanitize(other)
                ))
            }
        };
        if self.topic_replacement.contains(['{', '}'].as_slice())
            && !self.topic_replacement.contains("${routedByValue}")
        {
            return Err(
                "route.topic.replacement may hold `${routedByValue}` and no other braces".into(),
            );
        }
        let template = self.topic_replacement.replace("${routedByValue}", field);
        DestinationTemplate::parse(&template).map_err(|e| format!("route.topic.replacement: {e}"))
    }

    /// `e` as the Event Router lays it out, or why the row cannot be.
    pub fn apply(&self, e: &Envelope) -> Result<Envelope, String> {
        let mut out = e.clone();
        if e.headers.iter().any(|(k, _)| k == HEADER_ID) {
            return Err(
                "the row's `headers` sets `id`, the Event Router's event id header; \
                        rename it"
                    .into(),
            );
        }
        let payload_text = std::str::from_utf8(&e.payload)
            .map_err(|_| "the payload is not UTF-8 text".to_string())?;
        let payload: serde_json::Value = if self.expand_json_payload {
            serde_json::from_str(payload_text)
                .map_err(|_| "table.expand.json.payload: the payload is not JSON".to_string())?
        } else {
            serde_json::Value::String(payload_text.to_string())
        };
        let mut headers = vec![(HEADER_ID.to_string(), e.id.to_string())];
        let mut envelope = serde_json::Map::new();
        for a in &self.additional {
            let value = self.column(e, &a.column);
            match a.placement {
                Placement::Header => {
                    if let Some(v) = value {
                        headers.push((a.alias.clone(), v));
                    }
                }
                Placement::Envelope => {
                    envelope.insert(
                        a.alias.clone(),
                        value.map_or(serde_json::Value::Null, serde_json::Value::String),
                    );
                }
            }
        }
        headers.extend(e.headers.iter().cloned());
        out.headers = headers;
        out.payload = if envelope.is_empty() && self.expand_json_payload {
            // The payload's own bytes, as stored.
            e.payload.clone()
        } else {
            let value = if envelope.is_empty() {
                payload
            } else {
                let mut m = serde_json::Map::new();
                m.insert("payload".into(), payload);
                m.extend(envelope);
                serde_json::Value::Object(m)
            };
            Bytes::from(value.to_string())
        };
        Ok(out)
    }

    fn column(&self, e: &Envelope, column: &str) -> Option<String> {
        let header = |name: &str| {
            e.headers
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        };
        match column {
            "id" => Some(e.id.to_string()),
            "aggregateid" => Some(e.key.clone()),
            "aggregatetype" => header(HEADER_AGGREGATE_TYPE),
            "type" => header(HEADER_EVENT_TYPE),
            other => header(other),
        }
    }
}

/// `column:placement[:alias]`, comma-separated.
fn parse_additional(text: &str) -> Result<Vec<Additional>, String> {
    text.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|entry| {
            let mut parts = entry.split(':');
            let column = parts.next().unwrap_or("").trim();
            let placement = match parts.next().map(str::trim) {
                Some("header") => Placement::Header,
                Some("envelope") => Placement::Envelope,
                Some("partition") => {
                    return Err(format!(
                        "table.fields.additional.placement `{entry}`: placement `partition` is \
                         not supported (the sink picks the partition from the key)"
                    ))
                }
                _ => {
                    return Err(format!(
                        "table.fields.additional.placement `{entry}`: write \
                         column:header|envelope[:alias]"
                    ))
                }
            };
            let alias = parts.next().map(str::trim).unwrap_or(column).to_string();
            if column.is_empty() || alias.is_empty() || parts.next().is_some() {
                return Err(format!(
                    "table.fields.additional.placement `{entry}`: write \
                     column:header|envelope[:alias]"
                ));
            }
            Ok(Additional {
                column: column.to_string(),
                placement,
                alias,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::sink::{HEADER_AGGREGATE_ID, HEADER_MESSAGE_ID};

    fn envelope() -> Envelope {
        let id = uuid::Uuid::now_v7();
        Envelope {
            id,
            destination: "outbox.event.order".into(),
            key: "o-1".into(),
            headers: vec![
                (HEADER_MESSAGE_ID.into(), id.to_string()),
                (HEADER_EVENT_TYPE.into(), "OrderCreated".into()),
                (HEADER_AGGREGATE_TYPE.into(), "order".into()),
                (HEADER_AGGREGATE_ID.into(), "o-1".into()),
                ("tenant".into(), "t9".into()),
            ],
            payload: Bytes::from_static(br#"{"total":12}"#),
            created_at: chrono::Utc::now(),
        }
    }

    fn header<'a>(e: &'a Envelope, name: &str) -> Option<&'a str> {
        e.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    #[test]
    fn defaults_are_the_event_routers() {
        let d = Debezium::from_options([]).unwrap();
        assert_eq!(
            d.destination().unwrap().as_str(),
            "outbox.event.{aggregate_type}"
        );
        let e = envelope();
        let out = d.apply(&e).unwrap();
        assert_eq!(header(&out, "id"), Some(e.id.to_string().as_str()));
        assert_eq!(out.key, "o-1");
        // The JsonConverter's form of a JSON column: a JSON string.
        assert_eq!(&out.payload[..], br#""{\"total\":12}""#);
        let expanded = Debezium::from_options([("table.expand.json.payload", "true")]).unwrap();
        assert_eq!(expanded.apply(&e).unwrap().payload, e.payload);
    }

    #[test]
    fn routing_and_additional_fields_are_configurable() {
        let d = Debezium::from_options([
            ("route.by.field", "type"),
            ("route.topic.replacement", "events.${routedByValue}.v1"),
            ("table.expand.json.payload", "true"),
            (
                "table.fields.additional.placement",
                "type:header:eventType,aggregatetype:envelope:aggregateType,tenant:envelope",
            ),
        ])
        .unwrap();
        assert_eq!(d.destination().unwrap().as_str(), "events.{event_type}.v1");
        let out = d.apply(&envelope()).unwrap();
        assert_eq!(header(&out, "eventType"), Some("OrderCreated"));
        let v: serde_json::Value = serde_json::from_slice(&out.payload).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"payload": {"total": 12}, "aggregateType": "order", "tenant": "t9"})
        );
    }

    #[test]
    fn what_the_relay_cannot_do_is_refused_at_start() {
        for (k, v, says) in [
            ("route.by.field", "payload", "route.by.field"),
            (
                "table.fields.additional.placement",
                "type:partition",
                "partition",
            ),
            ("table.fields.additional.placement", "type", "column:header"),
            ("route.topic.regex", "x", "not an Event Router option"),
            ("route.topic.replacement", "a.{x}", "braces"),
        ] {
            let err = Debezium::from_options([(k, v)]).unwrap_err();
            assert!(err.contains(says), "{k}={v}: {err}");
        }
    }
}
