//! One grammar for durations in every sink and source URL: the same spellings mean the same
//! duration to all of them, and a value past its bound is refused by all of them with one text
//! shape (`<sink|source> option <key>=`<value>`: expected …`). No broker is contacted: these
//! are the URL parsers alone.

// Test code: a failed expectation should panic with its message.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use outbox_inbox::source;

/// Every sink URL with an ack timeout, `{}` standing for its value.
const SINKS: &[&str] = &[
    "nats://127.0.0.1:4222?ack_timeout={}",
    "kafka://127.0.0.1:9092?ack_timeout={}",
    "amqp://guest:guest@127.0.0.1:5672/%2f?ack_timeout={}",
    "redis://127.0.0.1:6379?ack_timeout={}",
    "mqtt://127.0.0.1:1883?ack_timeout={}",
    "sqs://?region=us-east-1&ack_timeout={}",
    "sns://?region=us-east-1&ack_timeout={}",
    "https://example.invalid/hooks/{destination}#ack_timeout={}",
];

/// Every source URL option that is a duration, `{}` standing for its value (the sources that
/// pass a sink's ack timeout to the broker's client included).
const SOURCES: &[&str] = &[
    "nats://127.0.0.1:4222?stream=S&ack_wait={}",
    "amqp://guest:guest@127.0.0.1:5672/%2f?queue=q&ack_timeout={}",
    "mqtt://127.0.0.1:1883?topic=t&ack_timeout={}",
    "mqtt://127.0.0.1:1883?topic=t&keep_alive={}",
    "mqtt://127.0.0.1:1883?topic=t&session_expiry={}",
    "sqs://?queue=q&region=us-east-1&visibility_timeout={}",
];

#[test]
fn one_hour_means_one_hour_to_every_sink_in_every_spelling() {
    for url in SINKS {
        for spelling in ["1h", "60m", "3600s", "3600", "1h%200m", "59m60s"] {
            let got = outbox_sinks::ack_timeout(&url.replace("{}", spelling))
                .unwrap_or_else(|e| panic!("{url} with {spelling}: {e}"));
            assert_eq!(
                got,
                Some(Duration::from_secs(3600)),
                "{url} with {spelling}"
            );
        }
    }
}

#[test]
fn a_timeout_past_a_day_is_refused_by_every_sink_with_one_text() {
    for url in SINKS {
        let e = outbox_sinks::ack_timeout(&url.replace("{}", "25h"))
            .unwrap_err()
            .to_string();
        assert_eq!(
            e, "sink option ack_timeout=`25h`: expected at most 1day",
            "{url}"
        );
        let e = outbox_sinks::ack_timeout(&url.replace("{}", "soon"))
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "sink option ack_timeout=`soon`: expected a duration such as 500ms, 5s, 2m, 1m30s \
             or 1h",
            "{url}"
        );
    }
}

#[test]
fn every_source_reads_durations_in_the_same_grammar() {
    for url in SOURCES {
        for spelling in ["90s", "1m30s", "1m%2030s", "90"] {
            let url = url.replace("{}", spelling);
            source::check(&url).unwrap_or_else(|e| panic!("{url}: {e}"));
        }
        let bad = url.replace("{}", "soon");
        let e = source::check(&bad).err().unwrap().to_string();
        assert!(
            e.starts_with("source option ") && e.contains("=`soon`: expected a duration such as"),
            "{bad}: {e}"
        );
    }
}
