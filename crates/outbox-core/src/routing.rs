//! Destination routing: a template over the row's fields, with the row's own `topic` winning.

use crate::message::Message;
use crate::{Error, Result};

/// Default destination template.
pub const DEFAULT_DESTINATION: &str = "{aggregate_type}.{event_type}";

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Literal(String),
    AggregateType,
    AggregateId,
    EventType,
    Topic,
}

/// A parsed destination template such as `{aggregate_type}.{event_type}`.
///
/// Placeholders: `{aggregate_type}`, `{aggregate_id}`, `{event_type}`, `{topic}`. A row whose
/// `topic` column is set goes to that topic whatever the template says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DestinationTemplate {
    source: String,
    parts: Vec<Part>,
}

impl DestinationTemplate {
    /// Parses `template`; unknown placeholders and unbalanced braces are config errors.
    pub fn parse(template: &str) -> Result<Self> {
        let mut parts = Vec::new();
        let mut rest = template;
        while let Some(open) = rest.find('{') {
            if open > 0 {
                parts.push(Part::Literal(rest[..open].to_string()));
            }
            let after = &rest[open + 1..];
            let close = after.find('}').ok_or_else(|| {
                Error::config(format!(
                    "destination template `{template}`: `{{` without a closing `}}`"
                ))
            })?;
            parts.push(match &after[..close] {
                "aggregate_type" => Part::AggregateType,
                "aggregate_id" => Part::AggregateId,
                "event_type" => Part::EventType,
                "topic" => Part::Topic,
                other => {
                    return Err(Error::config(format!(
                        "destination template `{template}`: unknown placeholder `{{{other}}}`; use \
                         {{aggregate_type}}, {{aggregate_id}}, {{event_type}} or {{topic}}"
                    )))
                }
            });
            rest = &after[close + 1..];
        }
        if rest.contains('}') {
            return Err(Error::config(format!(
                "destination template `{template}`: `}}` without an opening `{{`"
            )));
        }
        if !rest.is_empty() {
            parts.push(Part::Literal(rest.to_string()));
        }
        if parts.is_empty() {
            return Err(Error::config("destination template is empty"));
        }
        Ok(Self {
            source: template.to_string(),
            parts,
        })
    }

    /// The template as written.
    pub fn as_str(&self) -> &str {
        &self.source
    }

    /// The destination of `message`: its `topic` when set, else the rendered template.
    pub fn render(&self, message: &Message) -> String {
        if let Some(topic) = message.topic.as_deref().filter(|t| !t.is_empty()) {
            return topic.to_string();
        }
        let mut out = String::with_capacity(64);
        for part in &self.parts {
            match part {
                Part::Literal(s) => out.push_str(s),
                Part::AggregateType => out.push_str(&message.aggregate_type),
                Part::AggregateId => out.push_str(&message.aggregate_id),
                Part::EventType => out.push_str(&message.event_type),
                Part::Topic => out.push_str(message.topic.as_deref().unwrap_or("")),
            }
        }
        out
    }
}

impl Default for DestinationTemplate {
    fn default() -> Self {
        Self::parse(DEFAULT_DESTINATION)
            .unwrap_or_else(|_| unreachable!("the default template parses"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(topic: Option<&str>) -> Message {
        Message {
            seq: 1,
            id: uuid::Uuid::now_v7(),
            aggregate_type: "payment".into(),
            aggregate_id: "p-1".into(),
            event_type: "created".into(),
            payload: "{}".into(),
            headers: "{}".into(),
            topic: topic.map(str::to_string),
            created_at: chrono::Utc::now(),
            attempts: 0,
        }
    }

    #[test]
    fn default_template_joins_type_and_event() {
        assert_eq!(
            DestinationTemplate::default().render(&msg(None)),
            "payment.created"
        );
    }

    #[test]
    fn row_topic_wins() {
        let t = DestinationTemplate::parse("events.{aggregate_id}").unwrap();
        assert_eq!(t.render(&msg(Some("special"))), "special");
        assert_eq!(t.render(&msg(None)), "events.p-1");
    }

    #[test]
    fn unknown_placeholders_are_config_errors() {
        let e = DestinationTemplate::parse("x.{nope}").unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::Config);
        assert!(e.to_string().contains("{nope}"));
        assert!(DestinationTemplate::parse("x.{event_type").is_err());
        assert!(DestinationTemplate::parse("x}").is_err());
    }
}
