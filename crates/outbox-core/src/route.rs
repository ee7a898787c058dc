//! Routing rules: which sink, and which destination template, serve a row, chosen by its
//! aggregate type, event type or topic. A row goes to exactly one sink: the first rule that
//! matches, else the relay's default sink.

use crate::message::Message;
use crate::routing::DestinationTemplate;
use crate::{Error, Result};

/// A glob over one row field: `*` matches any run of characters (dots included), everything
/// else matches itself, case-sensitively. `payment.*` matches `payment.created` and
/// `payment.refund.issued`; `*` matches anything, the empty string included.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Glob {
    source: String,
}

impl Glob {
    /// Parses `pattern`; an empty pattern or one with a control character is a config error.
    pub fn parse(pattern: &str) -> Result<Self> {
        if pattern.is_empty() {
            return Err(Error::config(
                "route: an empty pattern matches nothing; leave the field out or write `*`",
            ));
        }
        if pattern.chars().any(char::is_control) {
            return Err(Error::config(format!(
                "route: pattern {pattern:?} contains a control character"
            )));
        }
        Ok(Self {
            source: pattern.to_string(),
        })
    }

    /// The pattern as written.
    pub fn as_str(&self) -> &str {
        &self.source
    }

    /// Whether `text` matches the whole pattern.
    pub fn matches(&self, text: &str) -> bool {
        let mut parts = self.source.split('*');
        // Without a `*` the pattern is a literal.
        let first = parts.next().unwrap_or("");
        let Some(mut rest) = text.strip_prefix(first) else {
            return false;
        };
        let middle: Vec<&str> = parts.collect();
        let Some((last, middle)) = middle.split_last() else {
            return rest.is_empty();
        };
        for part in middle {
            match rest.find(part) {
                Some(at) => rest = &rest[at + part.len()..],
                None => return false,
            }
        }
        rest.len() >= last.len() && rest.ends_with(last)
    }
}

/// The condition of a routing rule: every field given must match (fields left out match
/// anything). `topic` matches the row's `topic` column; a row without a topic matches only a
/// rule that does not test it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RouteMatch {
    /// Glob over `aggregate_type`.
    pub aggregate_type: Option<Glob>,
    /// Glob over `event_type`.
    pub event_type: Option<Glob>,
    /// Glob over `topic`.
    pub topic: Option<Glob>,
}

impl RouteMatch {
    /// Whether `m` satisfies every field of the rule.
    pub fn matches(&self, m: &Message) -> bool {
        self.matches_fields(&m.aggregate_type, &m.event_type, m.topic.as_deref())
    }

    /// Whether a row with these fields satisfies every field of the rule (what
    /// [`RouteMatch::matches`] tests, for callers holding the fields without a message).
    pub fn matches_fields(
        &self,
        aggregate_type: &str,
        event_type: &str,
        topic: Option<&str>,
    ) -> bool {
        let field = |g: &Option<Glob>, v: &str| g.as_ref().is_none_or(|g| g.matches(v));
        field(&self.aggregate_type, aggregate_type)
            && field(&self.event_type, event_type)
            && match (&self.topic, topic.filter(|t| !t.is_empty())) {
                (None, _) => true,
                (Some(g), Some(t)) => g.matches(t),
                (Some(_), None) => false,
            }
    }

    /// Whether the rule tests no field at all (it matches every row).
    pub fn is_catch_all(&self) -> bool {
        self.aggregate_type.is_none() && self.event_type.is_none() && self.topic.is_none()
    }
}

/// One routing rule as configured: a condition, the sink URL that serves matching rows, and
/// the destination template for them (the relay's own template when left out).
#[derive(Debug, Clone, PartialEq)]
pub struct RouteSpec {
    /// A name for logs and `outbox status` (defaults to `route-<n>`).
    pub name: String,
    /// Which rows.
    pub when: RouteMatch,
    /// Sink URL (may hold credentials: print it only through `redact::url`).
    pub sink: String,
    /// Destination template of matching rows.
    pub destination: Option<DestinationTemplate>,
    /// How matching rows are laid out (`envelope=`, with `source=` for CloudEvents).
    pub envelope: crate::Format,
}

impl RouteSpec {
    /// Parses the flag form: `;`-separated `key=value` pairs with the keys `name`,
    /// `aggregate_type`, `event_type`, `topic`, `sink` (required), `destination`, `envelope`
    /// (`outbox`, `cloudevents`, `cloudevents-structured`) and `source` (the CloudEvents
    /// `source`, a URI-reference), e.g.
    /// `event_type=payment.*; sink=kafka://127.0.0.1:9092; destination=payments`. Values keep
    /// any `=` or `,` after the first `=` (Kafka URLs list brokers with commas).
    pub fn parse(text: &str, index: usize) -> Result<Self> {
        let mut b = RouteBuilder::new(index);
        for pair in text.split(';').map(str::trim).filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').ok_or_else(|| {
                Error::config(format!(
                    "route `{}`: `{}` has no `=` (write name=value pairs separated by `;`)",
                    crate::redact::sanitize(text),
                    crate::redact::sanitize(pair)
                ))
            })?;
            b.set(k.trim(), v.trim())?;
        }
        b.build()
    }
}

/// Assembles a [`RouteSpec`] key by key, so the flag and the config file share one set of
/// checks and messages.
#[derive(Debug)]
pub struct RouteBuilder {
    index: usize,
    name: Option<String>,
    when: RouteMatch,
    sink: Option<String>,
    destination: Option<DestinationTemplate>,
    envelope: Option<String>,
    source: Option<String>,
    /// Event Router options (`route.*`, `table.*`) for `envelope=debezium`.
    debezium: Vec<(String, String)>,
}

impl RouteBuilder {
    /// An empty rule, the `index`-th (from 1) of its list.
    pub fn new(index: usize) -> Self {
        Self {
            index,
            name: None,
            when: RouteMatch::default(),
            sink: None,
            destination: None,
            envelope: None,
            source: None,
            debezium: Vec::new(),
        }
    }

    /// Sets `key` to `value`; unknown keys are config errors that list the known ones.
    pub fn set(&mut self, key: &str, value: &str) -> Result<&mut Self> {
        let glob = |v: &str| Glob::parse(v).map(Some);
        match key {
            "name" => self.name = Some(value.to_string()),
            "aggregate_type" => self.when.aggregate_type = glob(value)?,
            "event_type" => self.when.event_type = glob(value)?,
            "topic" => self.when.topic = glob(value)?,
            "sink" => self.sink = Some(value.to_string()),
            "destination" => self.destination = Some(DestinationTemplate::parse(value)?),
            "envelope" => self.envelope = Some(value.to_string()),
            "source" => self.source = Some(value.to_string()),
            k if k.starts_with("route.") || k.starts_with("table.") => {
                self.debezium.push((k.to_string(), value.to_string()))
            }
            other => {
                return Err(Error::config(format!(
                    "route {}: unknown key `{}`; use name, aggregate_type, event_type, topic, \
                     sink, destination, envelope, source (and with envelope=debezium the \
                     Event Router's route.* and table.* options)",
                    self.index,
                    crate::redact::sanitize(other)
                )))
            }
        }
        Ok(self)
    }

    /// The rule; a rule without a sink is a config error.
    pub fn build(self) -> Result<RouteSpec> {
        let name = self.name.unwrap_or_else(|| format!("route-{}", self.index));
        let sink = self
            .sink
            .ok_or_else(|| Error::config(format!("route `{name}`: no `sink`")))?;
        let fail = |e: String| Error::config(format!("route `{name}`: {e}"));
        let kind = self.envelope.as_deref().unwrap_or("outbox");
        let mut destination = self.destination;
        let envelope = if kind == "debezium" {
            if self.source.is_some() {
                return Err(fail(
                    "`source` is a CloudEvents attribute, not an Event Router \
                                 option"
                        .into(),
                ));
            }
            let options = self.debezium.iter().map(|(k, v)| (k.as_str(), v.as_str()));
            let d = crate::debezium::Debezium::from_options(options).map_err(fail)?;
            let routes_itself = self.debezium.iter().any(|(k, _)| k.starts_with("route."));
            match &destination {
                Some(_) if routes_itself => {
                    return Err(fail(
                        "give either `destination` or the Event Router's \
                                     route.* options, not both"
                            .into(),
                    ))
                }
                Some(_) => {}
                None => destination = Some(d.destination().map_err(fail)?),
            }
            crate::Format::Debezium(d)
        } else {
            if let Some((k, _)) = self.debezium.first() {
                return Err(fail(format!(
                    "`{}` is an Event Router option; it needs envelope=debezium",
                    crate::redact::sanitize(k)
                )));
            }
            crate::Format::parse(kind, self.source.as_deref()).map_err(fail)?
        };
        Ok(RouteSpec {
            name,
            when: self.when,
            sink,
            destination,
            envelope,
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn glob(p: &str) -> Glob {
        Glob::parse(p).unwrap()
    }

    #[test]
    fn globs_match_whole_fields() {
        for (p, yes, no) in [
            (
                "payment.*",
                &["payment.", "payment.created", "payment.a.b"][..],
                &["payment", "xpayment.created"][..],
            ),
            ("*", &["", "anything.at.all"], &[]),
            ("order", &["order"], &["orders", "order.x", ""]),
            (
                "*.created",
                &["a.created", ".created"],
                &["a.created.x", "created"],
            ),
            (
                "a*b*c",
                &["abc", "a-b-c", "abbc", "acbc"],
                &["ab", "acb", "abcx"],
            ),
            ("a*a", &["aa", "aba"], &["a"]),
        ] {
            for t in yes {
                assert!(glob(p).matches(t), "{p} should match {t:?}");
            }
            for t in no {
                assert!(!glob(p).matches(t), "{p} should not match {t:?}");
            }
        }
        assert!(Glob::parse("").is_err());
    }

    fn row(aggregate_type: &str, event_type: &str, topic: Option<&str>) -> Message {
        Message {
            seq: 1,
            id: uuid::Uuid::now_v7(),
            aggregate_type: aggregate_type.into(),
            aggregate_id: "k".into(),
            event_type: event_type.into(),
            payload: bytes::Bytes::from_static(b"{}"),
            headers: "{}".into(),
            topic: topic.map(str::to_string),
            created_at: chrono::Utc::now(),
            attempts: 0,
        }
    }

    #[test]
    fn every_given_field_must_match() {
        let r = RouteSpec::parse(
            "name=pay; aggregate_type=payment; event_type=payment.*; sink=kafka://a:9092,b:9092?acks=all; destination=payments",
            1,
        )
        .unwrap();
        assert_eq!(r.name, "pay");
        assert_eq!(r.sink, "kafka://a:9092,b:9092?acks=all");
        assert_eq!(r.destination.as_ref().unwrap().as_str(), "payments");
        assert!(r.when.matches(&row("payment", "payment.created", None)));
        assert!(!r.when.matches(&row("payment", "refund.created", None)));
        assert!(!r.when.matches(&row("order", "payment.created", None)));
        let t = RouteSpec::parse("topic=audit.*;sink=stdout:", 2).unwrap();
        assert_eq!(t.name, "route-2");
        assert!(t.when.matches(&row("x", "y", Some("audit.login"))));
        assert!(!t.when.matches(&row("x", "y", None)));
        assert!(!t.when.matches(&row("x", "y", Some(""))));
        assert!(RouteSpec::parse("sink=stdout:", 3)
            .unwrap()
            .when
            .is_catch_all());
        let ce =
            RouteSpec::parse("sink=stdout:; envelope=cloudevents; source=urn:shop", 4).unwrap();
        assert_eq!(ce.envelope.name(), "cloudevents");
        assert!(RouteSpec::parse("sink=stdout:", 5)
            .unwrap()
            .envelope
            .is_outbox());
        let dbz = RouteSpec::parse("sink=stdout:; envelope=debezium", 6).unwrap();
        assert_eq!(
            dbz.destination.unwrap().as_str(),
            "outbox.event.{aggregate_type}",
            "the Event Router's default topic"
        );
        let by_type = RouteSpec::parse(
            "sink=stdout:; envelope=debezium; route.by.field=type; route.topic.replacement=ev.${routedByValue}",
            7,
        )
        .unwrap();
        assert_eq!(by_type.destination.unwrap().as_str(), "ev.{event_type}");
    }

    #[test]
    fn bad_rules_are_config_errors_naming_the_problem() {
        for (text, says) in [
            ("event_type=a", "no `sink`"),
            ("event=a;sink=stdout:", "unknown key `event`"),
            ("event_type;sink=stdout:", "has no `=`"),
            ("event_type=;sink=stdout:", "empty pattern"),
            ("sink=stdout:;destination={nope}", "unknown placeholder"),
            ("sink=stdout:;envelope=avro", "unknown envelope `avro`"),
            (
                "sink=stdout:;envelope=cloudevents;source=a b",
                "not a URI-reference",
            ),
            ("sink=stdout:;source=/x", "needs envelope=cloudevents"),
            (
                "sink=stdout:;route.by.field=type",
                "needs envelope=debezium",
            ),
            (
                "sink=stdout:;envelope=debezium;destination=x;route.by.field=type",
                "not both",
            ),
            (
                "sink=stdout:;envelope=debezium;route.by.field=payload",
                "route.by.field",
            ),
        ] {
            let e = RouteSpec::parse(text, 1).unwrap_err().to_string();
            assert!(e.contains(says), "{text}: {e}");
        }
    }
}
