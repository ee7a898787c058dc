//! Destination routing: a template over the row's fields, with the row's own `topic` winning,
//! and the rules every rendered destination must pass before anything is published to it.
//!
//! Whoever can insert an outbox row chooses its destination (through `topic`, or the fields the
//! template reads), and the relay publishes with its own broker credentials. So a destination
//! is checked before it is used ([`DestinationRules::check`]): no wildcards, no whitespace or
//! control characters, no empty tokens, nothing in the broker's system spaces (`$JS.`, `$SYS.`,
//! `$KV.`, any `$…`, `_INBOX.`) unless a pattern names that space explicitly, and, when the relay
//! is confined with `--allow-destinations`, nothing outside its patterns.

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

impl DestinationTemplate {
    /// Whether `message` is routed by its own `topic` rather than by the template.
    pub fn uses_topic(message: &Message) -> bool {
        message.topic.as_deref().is_some_and(|t| !t.is_empty())
    }

    /// The row fields the template reads, by column name (`aggregate_type`, …), for error
    /// messages that must name the field to fix.
    pub fn fields(&self) -> Vec<&'static str> {
        let mut out = Vec::new();
        for part in &self.parts {
            let f = match part {
                Part::Literal(_) => continue,
                Part::AggregateType => "aggregate_type",
                Part::AggregateId => "aggregate_id",
                Part::EventType => "event_type",
                Part::Topic => "topic",
            };
            if !out.contains(&f) {
                out.push(f);
            }
        }
        out
    }

    /// The literal text the template starts with, before its first placeholder.
    fn literal_prefix(&self) -> &str {
        match self.parts.first() {
            Some(Part::Literal(s)) => s,
            _ => "",
        }
    }
}

impl Default for DestinationTemplate {
    fn default() -> Self {
        Self::parse(DEFAULT_DESTINATION)
            .unwrap_or_else(|_| unreachable!("the default template parses"))
    }
}

/// Longest destination accepted, in bytes. NATS closes the connection on a control line over
/// 4 KiB, which would fail every message in flight, not only the offending one.
pub const MAX_DESTINATION_LEN: usize = 1024;

/// Leading token of subject spaces that belong to the broker or its clients rather than to
/// applications: every `$…` space (JetStream API `$JS.`, system account `$SYS.`, key-value
/// buckets `$KV.`, object stores `$O.`, MQTT `$MQTT.`) and request-reply inboxes `_INBOX.`.
fn is_system_token(token: &str) -> bool {
    token.starts_with('$') || token.eq_ignore_ascii_case("_INBOX")
}

/// One token of a [`DestinationPattern`].
#[derive(Debug, Clone, PartialEq, Eq)]
enum PatternToken {
    Literal(String),
    /// `*`: exactly one token.
    One,
    /// `>`: one or more tokens; last token only.
    Rest,
}

/// A NATS-style destination pattern: dot-separated tokens where `*` matches exactly one token
/// and a final `>` matches one or more. `orders.*.created` matches `orders.eu.created`;
/// `orders.>` matches `orders.eu` and `orders.eu.created`, not `orders`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DestinationPattern {
    source: String,
    tokens: Vec<PatternToken>,
}

impl DestinationPattern {
    /// Parses `pattern`; an empty token, whitespace, a wildcard inside a token or a `>` that is
    /// not last is a config error.
    pub fn parse(pattern: &str) -> Result<Self> {
        let bad = |why: &str| Error::config(format!("destination pattern `{pattern}`: {why}"));
        if pattern.is_empty() {
            return Err(bad("is empty"));
        }
        if pattern.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(bad("contains whitespace or a control character"));
        }
        let raw: Vec<&str> = pattern.split('.').collect();
        let mut tokens = Vec::with_capacity(raw.len());
        for (i, t) in raw.iter().enumerate() {
            tokens.push(match *t {
                "" => return Err(bad("has an empty token")),
                "*" => PatternToken::One,
                ">" if i + 1 == raw.len() => PatternToken::Rest,
                ">" => return Err(bad("`>` may only be the last token")),
                t if t.contains(['*', '>']) => return Err(bad("`*` and `>` must be whole tokens")),
                t => PatternToken::Literal(t.to_string()),
            });
        }
        Ok(Self {
            source: pattern.to_string(),
            tokens,
        })
    }

    /// The pattern as written.
    pub fn as_str(&self) -> &str {
        &self.source
    }

    /// Whether `destination` lies in this pattern's space.
    pub fn matches(&self, destination: &str) -> bool {
        let mut subject = destination.split('.');
        for token in &self.tokens {
            match (token, subject.next()) {
                (PatternToken::Rest, Some(_)) => return true,
                (PatternToken::One, Some(_)) => {}
                (PatternToken::Literal(l), Some(s)) if l == s => {}
                _ => return false,
            }
        }
        subject.next().is_none()
    }

    /// Whether this pattern names the system space `first` explicitly, by a literal first
    /// token: `$KV.orders.>` opens `$KV`, a bare `>` or `*.x` opens no system space.
    fn names_space(&self, first: &str) -> bool {
        matches!(self.tokens.first(), Some(PatternToken::Literal(l)) if l == first)
    }
}

impl std::str::FromStr for DestinationPattern {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Self::parse(s)
    }
}

/// Where a relay may publish. The fixed rules always apply; `allow`, when not empty, confines
/// the relay to the union of its patterns (`--allow-destinations`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DestinationRules {
    allow: Vec<DestinationPattern>,
}

impl DestinationRules {
    /// Rules confining destinations to `allow` (empty: only the fixed rules).
    pub fn allow(allow: Vec<DestinationPattern>) -> Self {
        Self { allow }
    }

    /// The allow-list; empty when the relay is not confined.
    pub fn patterns(&self) -> &[DestinationPattern] {
        &self.allow
    }

    /// Checks a rendered destination; the error says what is wrong with it. `origin` names
    /// where it came from (the row's `topic`, or the template and the fields it reads) and
    /// leads the message, so the `failed` reason names the field to fix.
    pub fn check(&self, destination: &str, origin: &str) -> std::result::Result<(), String> {
        let shown = shorten(destination);
        let fail = |why: String| Err(format!("{origin} `{shown}`: {why}"));
        if destination.is_empty() {
            return fail("the destination is empty".into());
        }
        if destination.len() > MAX_DESTINATION_LEN {
            return fail(format!(
                "the destination is {} bytes long; the limit is {MAX_DESTINATION_LEN}",
                destination.len()
            ));
        }
        if destination
            .chars()
            .any(|c| c.is_whitespace() || c.is_control())
        {
            return fail("the destination contains whitespace or a control character".into());
        }
        if destination.contains(['*', '>']) {
            return fail(
                "the destination contains a wildcard (`*` or `>`); a message goes to one subject"
                    .into(),
            );
        }
        if destination.split('.').any(str::is_empty) {
            return fail(
                "the destination has an empty token (`..`, or a leading or trailing `.`)".into(),
            );
        }
        let first = destination.split('.').next().unwrap_or_default();
        if is_system_token(first)
            && !self
                .allow
                .iter()
                .any(|p| p.names_space(first) && p.matches(destination))
        {
            return fail(format!(
                "`{}` is a reserved broker space (`$…` and `_INBOX.` subjects are the broker's \
                 own: `$JS.` is the JetStream API); a relay publishes there only when \
                 --allow-destinations names the space explicitly, e.g. `{}.…`",
                shorten(first),
                shorten(first)
            ));
        }
        if !self.allow.is_empty() && !self.allow.iter().any(|p| p.matches(destination)) {
            let list: Vec<&str> = self.allow.iter().map(DestinationPattern::as_str).collect();
            return fail(format!(
                "the destination is outside --allow-destinations ({})",
                list.join(", ")
            ));
        }
        Ok(())
    }

    /// Checks what can be checked of a template before any row is seen: its literal text must
    /// hold no whitespace or wildcards, and a template that itself starts in a system space
    /// needs that space allowed explicitly. Catches at start-up a template every row would fail.
    pub fn check_template(&self, template: &DestinationTemplate) -> Result<()> {
        let fail = |why: String| {
            Err(Error::config(format!(
                "destination template `{}`: {why}",
                template.as_str()
            )))
        };
        for part in &template.parts {
            if let Part::Literal(l) = part {
                if l.chars().any(|c| c.is_whitespace() || c.is_control()) {
                    return fail("contains whitespace or a control character".into());
                }
                if l.contains(['*', '>']) {
                    return fail("contains a wildcard (`*` or `>`)".into());
                }
            }
        }
        // The first token is known when the literal prefix holds a `.` or is the whole template.
        let prefix = template.literal_prefix();
        let first = match prefix.split_once('.') {
            Some((first, _)) => Some(first),
            None if template.parts.len() == 1 => Some(prefix),
            None => None,
        };
        if let Some(first) = first {
            if is_system_token(first) && !self.allow.iter().any(|p| p.names_space(first)) {
                return fail(format!(
                    "starts in the reserved broker space `{first}`; allow it explicitly with \
                     --allow-destinations '{first}.…'"
                ));
            }
        }
        Ok(())
    }
}

/// At most 100 characters of `s`, for error messages (a destination can be made of row data of
/// any length).
fn shorten(s: &str) -> String {
    match s.char_indices().nth(100) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
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

    fn rules(patterns: &[&str]) -> DestinationRules {
        DestinationRules::allow(
            patterns
                .iter()
                .map(|p| DestinationPattern::parse(p).unwrap())
                .collect(),
        )
    }

    fn rejects(rules: &DestinationRules, dest: &str, because: &str) {
        let err = rules.check(dest, "the row's `topic`").unwrap_err();
        assert!(
            err.starts_with("the row's `topic`"),
            "{dest:?}: the reason names the field: {err}"
        );
        assert!(err.contains(because), "{dest:?}: {err}");
    }

    #[test]
    fn ordinary_subjects_pass() {
        let r = DestinationRules::default();
        for ok in [
            "orders",
            "orders.placed",
            "a-b_c.D9.é",
            "x.$y",
            "_inboxes.x",
        ] {
            assert_eq!(r.check(ok, "topic"), Ok(()), "{ok}");
        }
    }

    #[test]
    fn wildcards_whitespace_control_characters_and_empty_tokens_are_rejected() {
        let r = DestinationRules::default();
        for (dest, because) in [
            ("", "empty"),
            ("orders.*", "wildcard"),
            ("orders.>", "wildcard"),
            ("orders.a*b", "wildcard"),
            (">", "wildcard"),
            ("order placed", "whitespace"),
            ("orders.\tx", "whitespace"),
            ("orders.x\u{0}", "control"),
            ("orders.x\r\nPUB y", "whitespace"),
            ("orders\u{7f}", "control"),
            ("orders..placed", "empty token"),
            (".orders", "empty token"),
            ("orders.", "empty token"),
        ] {
            rejects(&r, dest, because);
        }
        rejects(&r, &"a".repeat(MAX_DESTINATION_LEN + 1), "limit is 1024");
        assert!(r.check(&"a".repeat(MAX_DESTINATION_LEN), "topic").is_ok());
    }

    #[test]
    fn system_spaces_are_rejected_unless_named_explicitly() {
        let open = rules(&[">"]);
        for dest in [
            "$JS.API.STREAM.DELETE.ORDERS",
            "$SYS.REQ.SERVER.PING",
            "$KV.config.key",
            "$O.store.x",
            "$MQTT.sess.x",
            "$anything",
            "_INBOX.abc",
            "_inbox.abc",
        ] {
            rejects(&DestinationRules::default(), dest, "reserved broker space");
            // A catch-all pattern does not open a system space.
            rejects(&open, dest, "reserved broker space");
        }
        let kv = rules(&["$KV.orders.>"]);
        assert!(kv.check("$KV.orders.k1", "topic").is_ok());
        rejects(&kv, "$KV.other.k1", "reserved broker space");
        rejects(&kv, "$JS.API.INFO", "reserved broker space");
        rejects(
            &kv,
            "orders.placed",
            "outside --allow-destinations ($KV.orders.>)",
        );
    }

    #[test]
    fn allow_list_confines_destinations_to_its_patterns() {
        let r = rules(&["orders.>", "payments.*.created"]);
        assert!(r.check("orders.eu", "topic").is_ok());
        assert!(r.check("orders.eu.placed.v2", "topic").is_ok());
        assert!(r.check("payments.eu.created", "topic").is_ok());
        for dest in [
            "orders",
            "payments.created",
            "payments.eu.x.created",
            "audit.x",
        ] {
            rejects(
                &r,
                dest,
                "outside --allow-destinations (orders.>, payments.*.created)",
            );
        }
    }

    #[test]
    fn patterns_are_validated() {
        for bad in ["", "a..b", "a.>.b", "a.b*", "a.>x", "a b", ".a", "a."] {
            let e = DestinationPattern::parse(bad).unwrap_err();
            assert_eq!(e.kind(), crate::ErrorKind::Config, "{bad:?}");
        }
        assert!(DestinationPattern::parse("a.*.>").unwrap().matches("a.b.c"));
        assert!(!DestinationPattern::parse("a.*.>").unwrap().matches("a.b"));
        assert!(DestinationPattern::parse("*").unwrap().matches("a"));
        assert!(!DestinationPattern::parse("*").unwrap().matches("a.b"));
    }

    #[test]
    fn templates_that_start_in_a_system_space_or_hold_wildcards_fail_at_start_up() {
        let r = DestinationRules::default();
        for t in [
            "$JS.API.{event_type}",
            "_INBOX.{aggregate_id}",
            "$KV",
            "a.*.{event_type}",
            "a b.{topic}",
        ] {
            let t = DestinationTemplate::parse(t).unwrap();
            assert!(r.check_template(&t).is_err(), "{}", t.as_str());
        }
        let kv = rules(&["$KV.orders.>"]);
        let t = DestinationTemplate::parse("$KV.orders.{aggregate_id}").unwrap();
        assert!(kv.check_template(&t).is_ok());
        assert!(r.check_template(&t).is_err());
        assert!(r
            .check_template(
                &DestinationTemplate::parse("app.{aggregate_type}.{event_type}").unwrap()
            )
            .is_ok());
    }
}
