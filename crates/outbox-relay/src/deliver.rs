//! Turning claimed rows into envelopes, and cutting each key's rows into the units that go out
//! one call at a time.

use std::collections::{HashMap, VecDeque};

use outbox_core::sink::{
    is_reserved_header, HEADER_AGGREGATE_ID, HEADER_AGGREGATE_TYPE, HEADER_EVENT_TYPE,
    HEADER_MESSAGE_ID,
};
use outbox_core::{DestinationRules, DestinationTemplate, Envelope, Message};

/// Where `m`'s destination came from, for the error that says it is not allowed: the row's
/// `topic`, or the template and the fields it reads.
fn origin(m: &Message, template: &DestinationTemplate) -> String {
    if DestinationTemplate::uses_topic(m) {
        return "the row's `topic`".to_string();
    }
    let fields: Vec<String> = template.fields().iter().map(|f| format!("`{f}`")).collect();
    if fields.is_empty() {
        format!("the destination template `{}`", template.as_str())
    } else {
        format!(
            "the destination from the row's {} (template `{}`)",
            fields.join(", "),
            template.as_str()
        )
    }
}

/// Builds the envelope of `m`, or says why the row cannot be published as stored. The reason
/// names the column to fix (`topic`, `aggregate_id`, `headers`, …): it becomes the row's
/// `failed` error.
///
/// A row is refused, never repaired or partly published, when: its destination breaks
/// [`DestinationRules`] (wildcards, whitespace, a system space, outside the allow-list); a
/// field sent as a header value (`aggregate_type`, `aggregate_id`, `event_type`) holds a
/// control character; or its `headers` is not a JSON object, has a name that is not a header
/// name, a value with a control character, or a reserved name (`outbox-*`, `Nats-*`).
pub(crate) fn envelope(
    m: &Message,
    template: &DestinationTemplate,
    rules: &DestinationRules,
) -> Result<Envelope, String> {
    let destination = template.render(m);
    // Where the destination came from only matters to the error: said when the check fails,
    // not built for every message.
    if rules.check(&destination, "").is_err() {
        rules.check(&destination, &origin(m, template))?;
    }
    for (field, value) in [
        ("aggregate_type", &m.aggregate_type),
        ("aggregate_id", &m.aggregate_id),
        ("event_type", &m.event_type),
    ] {
        if let Some(c) = bad_value_char(value) {
            return Err(format!(
                "the row's `{field}` contains the control character {c:?}; it is sent as a \
                 header value, which cannot carry one"
            ));
        }
    }
    let mut headers = vec![
        (HEADER_MESSAGE_ID.to_string(), m.id.to_string()),
        (HEADER_EVENT_TYPE.to_string(), m.event_type.clone()),
        (HEADER_AGGREGATE_TYPE.to_string(), m.aggregate_type.clone()),
        (HEADER_AGGREGATE_ID.to_string(), m.aggregate_id.clone()),
    ];
    let trimmed = m.headers.trim();
    if !trimmed.is_empty() && trimmed != "{}" {
        let map = match serde_json::from_str::<serde_json::Value>(trimmed) {
            Ok(serde_json::Value::Object(map)) => map,
            Ok(_) => return Err("the row's `headers` is not a JSON object".into()),
            Err(e) => {
                return Err(format!(
                    "the row's `headers` is not valid JSON ({e}); write an object of strings"
                ))
            }
        };
        for (name, v) in map {
            let shown = shorten(&name);
            if !valid_header_name(&name) {
                return Err(format!(
                    "the row's `headers` has the name `{shown}`, which is not a header name \
                     (printable ASCII, no spaces or `:`)"
                ));
            }
            if is_reserved_header(&name) {
                return Err(format!(
                    "the row's `headers` sets `{shown}`: names starting with `outbox-` or \
                     `Nats-` are reserved for the relay (message id, dedupe, stream \
                     preconditions)"
                ));
            }
            let v = match v {
                serde_json::Value::String(s) => s,
                other => other.to_string(),
            };
            if let Some(c) = bad_value_char(&v) {
                return Err(format!(
                    "the row's `headers` value of `{shown}` contains the control character {c:?}"
                ));
            }
            headers.push((name, v));
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

/// A header name every sink can carry: printable ASCII without spaces or `:` (NATS and HTTP).
fn valid_header_name(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(|b| b.is_ascii_graphic() && b != b':')
}

/// The first character a header value cannot carry: any control character but tab.
fn bad_value_char(value: &str) -> Option<char> {
    value.chars().find(|&c| c.is_control() && c != '\t')
}

/// At most 100 characters of row data, for error messages.
fn shorten(s: &str) -> String {
    match s.char_indices().nth(100) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

/// Groups indexes of `batch` (already in sequence order) by key, in order of each key's first
/// message, and cuts each key's messages into *units*: the messages of that key one `publish`
/// call carries. A key's next unit is sent only once its previous unit was acknowledged, so a
/// failure can never let a later message of the key overtake it.
///
/// `same_call(p, i)` says whether message `i` may share a call with `p`, the previous message
/// of its key: then it joins `p`'s unit, else it starts the next one. With `|_, _| false` every
/// unit is one message: at most one message per key is in flight. A sink that orders keys
/// itself (`Sink::orders_keys`) gets a key's consecutive messages for one destination as one
/// unit.
pub(crate) fn key_units(
    batch: &[Message],
    mut same_call: impl FnMut(usize, usize) -> bool,
) -> Vec<VecDeque<Vec<usize>>> {
    let mut slot: HashMap<&str, usize> = HashMap::with_capacity(batch.len());
    let mut keys: Vec<VecDeque<Vec<usize>>> = Vec::new();
    for (i, m) in batch.iter().enumerate() {
        let k = *slot.entry(m.aggregate_id.as_str()).or_insert_with(|| {
            keys.push(VecDeque::new());
            keys.len() - 1
        });
        let units = &mut keys[k];
        match units.back_mut() {
            Some(unit) if unit.last().is_some_and(|&p| same_call(p, i)) => unit.push(i),
            _ => units.push_back(vec![i]),
        }
    }
    keys
}

#[cfg(test)]
mod tests {
    use super::*;
    use outbox_core::DestinationPattern;

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

    fn build(m: &Message) -> Result<Envelope, String> {
        envelope(
            m,
            &DestinationTemplate::default(),
            &DestinationRules::default(),
        )
    }

    fn units(keys: Vec<VecDeque<Vec<usize>>>) -> Vec<Vec<Vec<usize>>> {
        keys.into_iter().map(Vec::from).collect()
    }

    #[test]
    fn each_key_gets_its_messages_one_unit_each_in_order() {
        let b = vec![
            msg(1, "a", "{}"),
            msg(2, "b", "{}"),
            msg(3, "a", "{}"),
            msg(4, "a", "{}"),
            msg(5, "c", "{}"),
        ];
        assert_eq!(
            units(key_units(&b, |_, _| false)),
            vec![
                vec![vec![0], vec![2], vec![3]],
                vec![vec![1]],
                vec![vec![4]]
            ]
        );
    }

    #[test]
    fn a_key_that_changes_destination_starts_a_new_unit_when_the_sink_orders_keys() {
        let b = vec![
            msg(1, "a", "{}"),
            msg(2, "b", "{}"),
            msg(3, "a", "{}"),
            msg(4, "a", "{}"),
            msg(5, "c", "{}"),
            msg(6, "b", "{}"),
        ];
        // Destinations by index: a's messages go x, x, y; b's x, x.
        let dest = ["x", "x", "x", "y", "x", "x"];
        let same = |p: usize, i: usize| dest[p] == dest[i];
        assert_eq!(
            units(key_units(&b, same)),
            vec![vec![vec![0, 2], vec![3]], vec![vec![1, 5]], vec![vec![4]]]
        );
        // Everything of one destination: each key's whole run is one unit.
        assert_eq!(
            units(key_units(&b, |_, _| true)),
            vec![vec![vec![0, 2, 3]], vec![vec![1, 5]], vec![vec![4]]]
        );
    }

    #[test]
    fn envelope_carries_ids_and_row_headers() {
        let m = msg(1, "k", r#"{"traceparent":"00-abc-def-01","n":2}"#);
        let e = build(&m).unwrap();
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
        for (headers, says) in [
            ("[1,2]", "is not a JSON object"),
            ("null", "is not a JSON object"),
            ("\"x\"", "is not a JSON object"),
            ("{\"a\":", "is not valid JSON"),
            ("{\"bad name\":\"v\"}", "not a header name"),
            ("{\"a:b\":\"v\"}", "not a header name"),
            ("{\"\":\"v\"}", "not a header name"),
            ("{\"x\":\"line\\r\\nInjected: 1\"}", "control character"),
        ] {
            let err = build(&msg(1, "k", headers)).unwrap_err();
            assert!(err.starts_with("the row's `headers`"), "{headers}: {err}");
            assert!(err.contains(says), "{headers}: {err}");
        }
    }

    #[test]
    fn a_row_cannot_set_reserved_headers() {
        for name in [
            "Nats-Msg-Id",
            "nats-expected-stream",
            "outbox-message-id",
            "Outbox-Event-Type",
        ] {
            let m = msg(1, "k", &format!("{{\"{name}\":\"forged\"}}"));
            let err = build(&m).unwrap_err();
            assert!(err.contains(&format!("sets `{name}`")), "{err}");
            assert!(err.contains("reserved"), "{err}");
        }
    }

    #[test]
    fn a_row_cannot_choose_a_system_subject_or_a_wildcard() {
        for topic in [
            "$JS.API.STREAM.DELETE.X",
            "_INBOX.x",
            "orders.>",
            "orders.*",
            "a b",
        ] {
            let mut m = msg(1, "k", "{}");
            m.topic = Some(topic.into());
            let err = build(&m).unwrap_err();
            assert!(err.starts_with("the row's `topic`"), "{err}");
        }
        let mut m = msg(1, "k", "{}");
        m.aggregate_type = "$JS".into();
        let err = build(&m).unwrap_err();
        assert!(
            err.starts_with("the destination from the row's `aggregate_type`, `event_type`"),
            "{err}"
        );
        assert!(err.contains("reserved broker space"), "{err}");
    }

    #[test]
    fn allow_list_confines_the_relay() {
        let rules = DestinationRules::allow(vec![DestinationPattern::parse("order.>").unwrap()]);
        let m = msg(1, "k", "{}");
        assert!(envelope(&m, &DestinationTemplate::default(), &rules).is_ok());
        let mut other = msg(1, "k", "{}");
        other.topic = Some("audit.x".into());
        let err = envelope(&other, &DestinationTemplate::default(), &rules).unwrap_err();
        assert!(
            err.contains("outside --allow-destinations (order.>)"),
            "{err}"
        );
    }

    #[test]
    fn fields_sent_as_header_values_may_not_hold_control_characters() {
        let mut m = msg(1, "k\r\nX: y", "{}");
        let err = build(&m).unwrap_err();
        assert!(err.starts_with("the row's `aggregate_id`"), "{err}");
        m.aggregate_id = "tab\tis fine".into();
        assert!(build(&m).is_ok());
    }

    /// Property tests: whatever a row holds, building its envelope never panics, and either
    /// gives an envelope every rule holds for, or an error that names the field to fix.
    mod props {
        use super::*;
        use proptest::prelude::*;

        /// Text that often hits the edges: control characters, dots, wildcards, `$`, non-ASCII,
        /// and now and then a very long run.
        fn text() -> impl Strategy<Value = String> {
            prop_oneof![
                4 => "[a-z]{1,8}",
                3 => "[a-zA-Z0-9._$>*\\- \t\r\n\u{0}\u{7f}é]{0,24}",
                1 => any::<String>(),
                1 => ("[a-z]{1,3}", 1000usize..5000).prop_map(|(s, n)| s.repeat(n)),
            ]
        }

        fn header_name() -> impl Strategy<Value = String> {
            prop_oneof![
                4 => "[a-zA-Z][a-zA-Z0-9-]{0,12}",
                1 => "(outbox|Outbox|OUTBOX|nats|Nats|NATS)-[a-zA-Z-]{1,12}",
                1 => any::<String>(),
            ]
        }

        fn header_value() -> impl Strategy<Value = serde_json::Value> {
            prop_oneof![
                4 => text().prop_map(serde_json::Value::String),
                1 => any::<i64>().prop_map(serde_json::Value::from),
                1 => Just(serde_json::Value::Null),
                1 => Just(serde_json::json!({"nested": [1, "x\n"]})),
            ]
        }

        /// The `headers` column: mostly objects, sometimes other JSON or not JSON at all.
        fn headers() -> impl Strategy<Value = String> {
            prop_oneof![
                6 => proptest::collection::btree_map(header_name(), header_value(), 0..5)
                    .prop_map(|m| serde_json::to_string(&m).unwrap_or_default()),
                1 => Just(String::new()),
                1 => Just("[]".to_string()),
                1 => Just("42".to_string()),
                1 => Just("null".to_string()),
                1 => any::<String>(),
            ]
        }

        fn template() -> impl Strategy<Value = DestinationTemplate> {
            prop_oneof![
                Just("{aggregate_type}.{event_type}"),
                Just("app.{aggregate_type}.{aggregate_id}.{event_type}"),
                Just("{topic}"),
                Just("$KV.app.{aggregate_id}"),
                Just("fixed"),
            ]
            .prop_map(|t| DestinationTemplate::parse(t).unwrap())
        }

        fn rules() -> impl Strategy<Value = DestinationRules> {
            prop_oneof![
                Just(vec![]),
                Just(vec!["app.>"]),
                Just(vec!["$KV.app.>", "fixed"]),
                Just(vec![">"]),
            ]
            .prop_map(|ps| {
                DestinationRules::allow(
                    ps.into_iter()
                        .map(|p| DestinationPattern::parse(p).unwrap())
                        .collect(),
                )
            })
        }

        fn row() -> impl Strategy<Value = Message> {
            (
                text(),
                text(),
                text(),
                proptest::option::of(text()),
                headers(),
            )
                .prop_map(
                    |(aggregate_type, aggregate_id, event_type, topic, headers)| Message {
                        seq: 1,
                        id: uuid::Uuid::now_v7(),
                        aggregate_type,
                        aggregate_id,
                        event_type,
                        payload: "{}".into(),
                        headers,
                        topic,
                        created_at: chrono::Utc::now(),
                        attempts: 0,
                    },
                )
        }

        const FIELDS: &[&str] = &[
            "`topic`",
            "`aggregate_type`",
            "`aggregate_id`",
            "`event_type`",
            "`headers`",
            "the destination template",
        ];

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(2000))]

            #[test]
            fn every_row_yields_a_valid_envelope_or_names_the_field(
                m in row(), t in template(), r in rules()
            ) {
                match envelope(&m, &t, &r) {
                    Ok(e) => {
                        prop_assert_eq!(r.check(&e.destination, "destination"), Ok(()));
                        prop_assert_eq!(&e.destination, &t.render(&m));
                        prop_assert_eq!(&e.key, &m.aggregate_id);
                        // The relay's own headers come first and exactly once each.
                        prop_assert_eq!(&e.headers[0], &(HEADER_MESSAGE_ID.to_string(), m.id.to_string()));
                        for (i, (name, value)) in e.headers.iter().enumerate() {
                            prop_assert_eq!(is_reserved_header(name), i < 4, "{}", name);
                            prop_assert!(valid_header_name(name), "{}", name);
                            prop_assert!(bad_value_char(value).is_none(), "{:?}", value);
                        }
                    }
                    Err(why) => {
                        prop_assert!(
                            FIELDS.iter().any(|f| why.contains(f)),
                            "the reason names no field: {}", why
                        );
                        // The reason is bounded, whatever the row's size.
                        prop_assert!(why.len() < 2000, "reason of {} bytes", why.len());
                    }
                }
            }

            #[test]
            fn any_destination_is_checked_without_panicking(
                d in text(), r in rules()
            ) {
                if r.check(&d, "the row's `topic`").is_ok() {
                    prop_assert!(!d.is_empty() && !d.contains(['*', '>', ' ']));
                    prop_assert!(d.split('.').all(|t| !t.is_empty()));
                    prop_assert!(!d.starts_with('$') || r.patterns().iter().any(|p| p.as_str().starts_with('$')));
                }
            }

            #[test]
            fn any_template_text_parses_or_is_a_config_error(t in any::<String>()) {
                if let Err(e) = DestinationTemplate::parse(&t) {
                    prop_assert_eq!(e.kind(), outbox_core::ErrorKind::Config);
                }
            }
        }
    }
}
