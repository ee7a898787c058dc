//! CloudEvents 1.0 end to end, judged by the official Python SDK (`cloudevents`, installed in
//! /opt/outbox-venv by scripts/services.sh) and the official JavaScript SDK (npm `cloudevents`,
//! in /opt/outbox-node): the relay publishes rows with `envelope=
//! cloudevents` (binary) and `cloudevents-structured` on Kafka (tansu), HTTP, RabbitMQ, MQTT
//! and NATS; an independent reader takes each message off the real broker; the SDK reads it
//! (`tests/cloudevents/sdk_read.py` and `sdk_read.js`, which fail on anything the SDK
//! rejects) and every attribute is checked against the row it came from. Then the inbox reads
//! events each SDK produced (`sdk_write.py`, `sdk_write.js`), deduping by their `id`.

#![allow(clippy::unwrap_used)]

use crate::common;
use crate::inboxkit;
use std::collections::HashMap;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use common::World;
use outbox_core::{Envelope, Format, Formatted, NewMessage, Sink, Store};
use outbox_inbox::{Inbox, InboxSchema};
use outbox_sinks::read::{scratch, Delivered, ScratchOptions};
use outbox_testkit::relay::{read_distinct, RunningRelay};
use outbox_testkit::source_suite::{fetch_until, open, publish_with, SourceFixture};
use tokio::io::AsyncWriteExt;

const PYTHON: &str = "/opt/outbox-venv/bin/python";
const NODE: &str = "node";
const TRACEPARENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

fn env(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

fn script(name: &str) -> String {
    format!("{}/tests/cloudevents/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// Runs `script` with `input` on stdin and returns its stdout as JSON; its failure (the SDK
/// rejecting a message) fails the test with the SDK's own words.
async fn python(script: &str, input: serde_json::Value) -> serde_json::Value {
    run(PYTHON, script, input).await
}

/// Runs `script` with the interpreter `program` (see [`python`]).
async fn run(program: &str, script: &str, input: serde_json::Value) -> serde_json::Value {
    let mut child = tokio::process::Command::new(program)
        .arg(script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{program} (scripts/services.sh installs the SDKs): {e}"));
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(input.to_string().as_bytes()).await.unwrap();
    drop(stdin);
    let out = child.wait_with_output().await.unwrap();
    assert!(
        out.status.success(),
        "{script} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The rows every case publishes: two keys, one with the W3C trace context, one with an
/// aggregate id that needs percent-encoding in HTTP headers.
fn rows() -> Vec<NewMessage> {
    let mut out = Vec::new();
    for n in 0..3 {
        out.push(
            NewMessage::new(
                "payment",
                "pay-1",
                "payment.created",
                serde_json::json!({"n": n, "note": "ça va"}),
            )
            .trace_context(TRACEPARENT, Some("vendor=1"))
            .unwrap(),
        );
        out.push(NewMessage::new(
            "payment",
            "pay 2/é",
            "payment.refunded",
            serde_json::json!({"n": n}),
        ));
    }
    out
}

/// Each SDK's reading of `got`, message by message: (SDK, events).
async fn sdk_read(binding: &str, got: &[Delivered]) -> Vec<(&'static str, Vec<serde_json::Value>)> {
    let messages: Vec<_> = got
        .iter()
        .map(|d| {
            serde_json::json!({
                "headers": d.headers,
                "key": d.key,
                "body_b64": base64::engine::general_purpose::STANDARD.encode(&d.payload),
            })
        })
        .collect();
    let input = serde_json::json!({"binding": binding, "messages": messages});
    let py = python(&script("sdk_read.py"), input.clone()).await;
    let js = run(NODE, &script("sdk_read.js"), input).await;
    vec![
        ("python", py.as_array().unwrap().clone()),
        ("javascript", js.as_array().unwrap().clone()),
    ]
}

/// Publishes [`rows`] through `url`'s sink in `envelope`, reads every message back from the
/// broker, and checks each attribute the SDK read against its row.
async fn case(binding: &str, url: &str, envelope: &str) {
    outbox_testkit::brokers::moto_credentials();
    let w = World::with_stream(false).await;
    let mut s = scratch(url, &ScratchOptions::new(&format!("ce{binding}")))
        .await
        .unwrap_or_else(|e| panic!("{binding} must be running: {e}"));
    let rows = rows();
    w.store().insert(&rows).await.unwrap();
    let created: HashMap<uuid::Uuid, chrono::DateTime<chrono::Utc>> =
        sqlx::query_as::<_, (uuid::Uuid, chrono::DateTime<chrono::Utc>)>(
            &w.schema
                .render("SELECT id, created_at FROM {schema}.outbox"),
        )
        .fetch_all(&w.pool)
        .await
        .unwrap()
        .into_iter()
        .collect();
    let sink = outbox_sinks::connect(&s.sink_url).await.unwrap();
    let format = Format::parse(envelope, Some("urn:outbox:test/payments")).unwrap();
    let sink: Arc<dyn Sink> = Arc::new(Formatted::new(sink, format));
    let relay = RunningRelay::start(w.dyn_store(), sink, w.relay_config_to(&s.destination));
    w.wait_drained(Duration::from_secs(30)).await;
    relay.stop().await;
    let got = read_distinct(s.reader.as_mut(), rows.len(), Duration::from_secs(30)).await;
    let mut firsts: Vec<Delivered> = Vec::new();
    for d in got {
        if !firsts.iter().any(|f| f.id == d.id) {
            firsts.push(d);
        }
    }
    assert_eq!(
        firsts.len(),
        rows.len(),
        "{binding} {envelope}: every row arrived"
    );
    for (sdk, events) in sdk_read(binding, &firsts).await {
        assert_eq!(events.len(), firsts.len(), "{sdk}");
        for (d, ev) in firsts.iter().zip(&events) {
            let row = rows.iter().find(|r| r.id == d.id).unwrap();
            let a = &ev["attributes"];
            let what = format!("{sdk} {binding} {envelope} {}", row.id);
            assert_eq!(a["specversion"], "1.0", "{what}");
            assert_eq!(a["id"], row.id.to_string(), "{what}");
            assert_eq!(a["source"], "urn:outbox:test/payments", "{what}");
            assert_eq!(a["type"], row.event_type.as_str(), "{what}");
            assert_eq!(a["subject"], row.aggregate_id.as_str(), "{what}");
            if (sdk, binding, envelope) == ("javascript", "mqtt", "cloudevents") {
                // The JavaScript SDK's MQTT binding (10.0.0) does not map the Content Type
                // property to `datacontenttype` in binary mode, as the binding requires; the
                // property itself is checked below.
                assert!(a
                    .get("datacontenttype")
                    .is_none_or(|v| v == "application/json"));
            } else {
                assert_eq!(a["datacontenttype"], "application/json", "{what}");
            }
            let time = chrono::DateTime::parse_from_rfc3339(a["time"].as_str().unwrap()).unwrap();
            if sdk == "javascript" {
                // Its CloudEvent keeps `time` as a JavaScript Date: milliseconds.
                assert_eq!(
                    time.timestamp_millis(),
                    created[&row.id].timestamp_millis(),
                    "{what}: time is created_at"
                );
            } else {
                assert_eq!(time, created[&row.id], "{what}: time is created_at");
            }
            assert_eq!(ev["data"], row.payload, "{what}: data is the payload");
            let traced = row.headers.contains_key("traceparent");
            assert_eq!(
                a.get("traceparent").and_then(|v| v.as_str()),
                traced.then_some(TRACEPARENT),
                "{what}"
            );
            assert_eq!(
                a.get("tracestate").and_then(|v| v.as_str()),
                traced.then_some("vendor=1"),
                "{what}"
            );
            // The JavaScript SDK's Kafka binding adds no `partitionkey` of its own; both read ours.
            if binding == "kafka" {
                assert_eq!(a["partitionkey"], row.aggregate_id.as_str(), "{what}");
                assert_eq!(d.key, row.aggregate_id, "{what}: the record key");
            } else {
                assert!(a.get("partitionkey").is_none(), "{what}");
            }
            let ct = d.header("content-type").unwrap_or_default();
            if envelope == "cloudevents-structured" {
                assert!(
                    ct.starts_with("application/cloudevents+json"),
                    "{what}: {ct}"
                );
            } else {
                assert!(ct.starts_with("application/json"), "{what}: {ct}");
            }
        }
    }
    s.reader.cleanup().await;
    w.drop_all().await;
}

fn kafka() -> String {
    env("OUTBOX_TEST_KAFKA_URL", "kafka://127.0.0.1:9092")
}
fn http() -> String {
    // Signed: the receiver checks the Standard Webhooks signature over what was posted.
    "http://127.0.0.1/#secret=whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".to_string()
}
fn amqp() -> String {
    env(
        "OUTBOX_TEST_AMQP_URL",
        "amqp://guest:guest@127.0.0.1:5672/%2f",
    )
}
fn mqtt() -> String {
    env("OUTBOX_TEST_MQTT_URL", "mqtt://127.0.0.1:1883")
}
fn nats() -> String {
    env("OUTBOX_TEST_NATS_URL", "nats://127.0.0.1:4222")
}
fn sqs() -> String {
    format!(
        "sqs://?region=us-east-1&endpoint={}",
        outbox_testkit::brokers::moto_endpoint()
    )
}
fn sns() -> String {
    format!(
        "sns://?region=us-east-1&endpoint={}",
        outbox_testkit::brokers::moto_endpoint()
    )
}
fn redis() -> String {
    env("OUTBOX_TEST_REDIS_URL", "redis://127.0.0.1:6379")
}

macro_rules! sdk_reads {
    ($($name:ident: $binding:literal, $url:expr, $envelope:literal;)*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            case($binding, &$url, $envelope).await;
        }
    )*};
}

sdk_reads! {
    the_sdks_read_kafka_binary: "kafka", kafka(), "cloudevents";
    the_sdks_read_kafka_structured: "kafka", kafka(), "cloudevents-structured";
    the_sdks_read_http_binary: "http", http(), "cloudevents";
    the_sdks_read_http_structured: "http", http(), "cloudevents-structured";
    the_sdks_read_amqp_binary: "amqp", amqp(), "cloudevents";
    the_sdks_read_amqp_structured: "amqp", amqp(), "cloudevents-structured";
    the_sdks_read_mqtt_binary: "mqtt", mqtt(), "cloudevents";
    the_sdks_read_mqtt_structured: "mqtt", mqtt(), "cloudevents-structured";
    the_sdks_read_nats_binary: "nats", nats(), "cloudevents";
    the_sdks_read_nats_structured: "nats", nats(), "cloudevents-structured";
    // No SDK binding for these: the `ce-` attributes are read by each SDK's HTTP binding, the
    // Redis `ce_` entries by its Kafka binding (docs/envelopes.md's table).
    the_sdks_read_sqs_binary: "sqs", sqs(), "cloudevents";
    the_sdks_read_sqs_structured: "sqs", sqs(), "cloudevents-structured";
    the_sdks_read_sns_binary: "sns", sns(), "cloudevents";
    the_sdks_read_redis_binary: "redis", redis(), "cloudevents";
    the_sdks_read_redis_structured: "redis", redis(), "cloudevents-structured";
}

/// The SDK lays out two events for `binding` in `mode` (MQTT and Redis/SQS, where the SDK has no
/// binding, structured only: the SDK's JSON event format) (one with a UUID `id`, one with an `id`
/// that is not a UUID); each is published twice (a producer's retry: the broker delivers both
/// copies); the inbox's source reads all four, takes `id`, `type`, `subject` and `data` from
/// the event, and records each event once.
async fn inbox_case(fixture: &dyn SourceFixture, sdk: &str, binding: &str, mode: &str) {
    let ch = fixture.channel(&format!("cein{binding}")).await;
    let uuid_id = uuid::Uuid::now_v7();
    let events = serde_json::json!([
        {"id": uuid_id.to_string(), "source": "urn:shop", "type": "order.placed",
         "subject": "o-7", "data": {"n": 1, "note": "ça va"}},
        {"id": "order-8@shop", "source": "urn:shop", "type": "order.shipped",
         "subject": "o-8", "data": {"n": 2}},
    ]);
    let sdk_binding = match binding {
        "redis" | "sqs" => "json",
        other => other,
    };
    let input = serde_json::json!({"binding": sdk_binding, "mode": mode, "events": events});
    let produced = match sdk {
        "python" => python(&script("sdk_write.py"), input).await,
        _ => run(NODE, &script("sdk_write.js"), input).await,
    };
    let mut envelopes = Vec::new();
    for (m, e) in produced
        .as_array()
        .unwrap()
        .iter()
        .zip(events.as_array().unwrap())
    {
        let headers: Vec<(String, String)> = serde_json::from_value(m["headers"].clone()).unwrap();
        let payload = base64::engine::general_purpose::STANDARD
            .decode(m["body_b64"].as_str().unwrap())
            .unwrap();
        for _copy in 0..2 {
            envelopes.push(Envelope {
                // A broker-level id of its own per copy: only the event's `id` says they are one.
                id: uuid::Uuid::now_v7(),
                destination: ch.destination(),
                key: m["key"]
                    .as_str()
                    .unwrap_or(e["subject"].as_str().unwrap())
                    .to_string(),
                headers: headers.clone(),
                payload: bytes::Bytes::from(payload.clone()),
                created_at: chrono::Utc::now(),
            });
        }
    }
    let sink = outbox_sinks::connect(&ch.sink_url()).await.unwrap();
    publish_with(sink.as_ref(), &envelopes).await;
    let mut source = open(&ch.source_url(), 10).await;
    source.recover().await.unwrap();
    let got = fetch_until(source.as_mut(), 4, 10, Duration::from_secs(60)).await;
    let what = format!("{sdk} {binding} {mode}");
    let v5 = uuid::Uuid::new_v5(
        &uuid::Uuid::NAMESPACE_URL,
        b"cloudevents:urn:shop\norder-8@shop",
    );
    for d in &got {
        let m = &d.message;
        let (ty, key, n) = if m.id == uuid_id {
            ("order.placed", "o-7", 1)
        } else {
            assert_eq!(
                m.id, v5,
                "{what}: a non-UUID id becomes the UUIDv5 of source and id"
            );
            ("order.shipped", "o-8", 2)
        };
        assert_eq!(m.message_type, ty, "{what}");
        assert_eq!(m.key, key, "{what}");
        assert_eq!(m.payload["n"], n, "{what}: the payload is the event's data");
        assert_eq!(m.header("ce-source"), Some("urn:shop"), "{what}");
    }
    // Recorded once per event id, whichever copy comes first.
    let w = World::with_stream(false).await;
    let schema = InboxSchema::new(w.schema.as_str()).unwrap();
    outbox_inbox::migrate_postgres(&w.pool, &schema)
        .await
        .unwrap();
    let inbox = Inbox::new(schema);
    let mut tx = w.pool.begin().await.unwrap();
    let mut recorded = 0;
    for d in &got {
        if inbox.ingest(&mut tx, &d.message).await.unwrap() {
            recorded += 1;
        }
    }
    tx.commit().await.unwrap();
    assert_eq!(recorded, 2, "{what}: two events, four deliveries");
    drop(source);
    ch.cleanup().await;
    w.drop_all().await;
}

macro_rules! inbox_reads {
    ($($name:ident: $fixture:expr, $sdk:literal, $binding:literal, $mode:literal;)*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            inbox_case(&$fixture, $sdk, $binding, $mode).await;
        }
    )*};
}

inbox_reads! {
    the_inbox_ingests_python_sdk_events_from_kafka_binary: inboxkit::Kafka::new(), "python", "kafka", "binary";
    the_inbox_ingests_python_sdk_events_from_kafka_structured: inboxkit::Kafka::new(), "python", "kafka", "structured";
    the_inbox_ingests_python_sdk_events_from_amqp_binary: inboxkit::Amqp::new(), "python", "amqp", "binary";
    the_inbox_ingests_python_sdk_events_from_amqp_structured: inboxkit::Amqp::new(), "python", "amqp", "structured";
    the_inbox_ingests_python_sdk_events_from_nats_binary: inboxkit::Nats::new(), "python", "nats", "binary";
    the_inbox_ingests_python_sdk_events_from_nats_structured: inboxkit::Nats::new(), "python", "nats", "structured";
    the_inbox_ingests_python_sdk_events_from_mqtt_structured: inboxkit::Mqtt::new(), "python", "mqtt", "structured";
    the_inbox_ingests_python_sdk_events_from_redis_structured: inboxkit::Redis::new(), "python", "redis", "structured";
    the_inbox_ingests_python_sdk_events_from_sqs_structured: inboxkit::Sqs::fifo(), "python", "sqs", "structured";
    the_inbox_ingests_javascript_sdk_events_from_kafka_binary: inboxkit::Kafka::new(), "javascript", "kafka", "binary";
    the_inbox_ingests_javascript_sdk_events_from_kafka_structured: inboxkit::Kafka::new(), "javascript", "kafka", "structured";
    the_inbox_ingests_javascript_sdk_events_from_mqtt_binary: inboxkit::Mqtt::new(), "javascript", "mqtt", "binary";
    the_inbox_ingests_javascript_sdk_events_from_mqtt_structured: inboxkit::Mqtt::new(), "javascript", "mqtt", "structured";
    the_inbox_ingests_javascript_sdk_events_from_nats_binary: inboxkit::Nats::new(), "javascript", "nats", "binary";
    the_inbox_ingests_javascript_sdk_events_from_nats_structured: inboxkit::Nats::new(), "javascript", "nats", "structured";
    the_inbox_ingests_javascript_sdk_events_from_amqp_structured: inboxkit::Amqp::new(), "javascript", "amqp", "structured";
}
