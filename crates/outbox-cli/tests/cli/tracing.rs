//! W3C trace context from the writer to the consumer's handler, against an in-process OTLP
//! receiver: the Rust writer records the current span's `traceparent`, a raw-SQL writer sets
//! it by hand; `outbox relay --otlp-endpoint` publishes to NATS with the header and exports a
//! publish span linked to both writer spans; `outbox inbox --otlp-endpoint` records them with a
//! receive span linked the same way; the inbox processor (in this process) runs each handler in
//! a process span that is the writer span's child, so the handler's own span joins the trace.

// Test code: a failed expectation should panic with its message.
#![allow(clippy::unwrap_used)]

use crate::common;
use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{header, World};
use http_body_util::{BodyExt as _, Full};
use opentelemetry::trace::{Span as _, TraceContextExt as _, Tracer as _};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use outbox_core::NewMessage;
use outbox_inbox::{Handlers, InboxProcessor, ProcessorConfig};
use prost::Message as _;

const WAIT: Duration = Duration::from_secs(60);

/// A span as the receiver got it: ids in hex.
#[derive(Debug, Clone)]
struct Got {
    name: String,
    service: String,
    trace: String,
    span: String,
    parent: String,
    links: Vec<(String, String)>,
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// An OTLP/HTTP receiver on 127.0.0.1: every span of every export, decoded.
async fn receiver() -> (String, Arc<Mutex<Vec<Got>>>) {
    let got: Arc<Mutex<Vec<Got>>> = Arc::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let sink = got.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let sink = sink.clone();
            let service =
                hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let sink = sink.clone();
                    async move {
                        let path = req.uri().path().to_string();
                        let body = req.into_body().collect().await.unwrap().to_bytes();
                        assert_eq!(path, "/v1/traces", "spans go to the OTLP traces path");
                        let export = ExportTraceServiceRequest::decode(body).unwrap();
                        let mut spans = sink.lock().unwrap();
                        for rs in export.resource_spans {
                            let service = rs
                                .resource
                                .iter()
                                .flat_map(|r| r.attributes.iter())
                                .find(|a| a.key == "service.name")
                                .and_then(|a| a.value.as_ref())
                                .map(|v| format!("{:?}", v.value))
                                .unwrap_or_default();
                            for ss in rs.scope_spans {
                                for s in ss.spans {
                                    spans.push(Got {
                                        name: s.name,
                                        service: service.clone(),
                                        trace: hex(&s.trace_id),
                                        span: hex(&s.span_id),
                                        parent: hex(&s.parent_span_id),
                                        links: s
                                            .links
                                            .iter()
                                            .map(|l| (hex(&l.trace_id), hex(&l.span_id)))
                                            .collect(),
                                    });
                                }
                            }
                        }
                        Ok::<_, Infallible>(hyper::Response::new(Full::new(Bytes::new())))
                    }
                });
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service),
            );
        }
    });
    (url, got)
}

/// The trace and span id of the current OpenTelemetry span.
fn current_ids() -> (String, String) {
    let (p, _) = outbox_core::trace::current().expect("inside a span");
    (hex(&p.trace_id), hex(&p.span_id))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trace_goes_from_the_writer_through_the_relay_and_the_inbox_to_the_handler() {
    let (otlp, got) = receiver().await;
    // This process is the application: its writer and its inbox processor trace too.
    let tracing = outbox_observe::install_tracing(&otlp, "shop").unwrap();
    let w = World::new().await;
    let tracer = opentelemetry::global::tracer("shop");

    // The Rust writer, inside the writer's span: the context is taken from it.
    let span = tracer.start("place order");
    let cx = opentelemetry::Context::current_with_span(span);
    let (rust_msg, w1) = {
        let _g = cx.clone().attach();
        let m = NewMessage::new("order", "o-1", "placed", serde_json::json!({"n": 1}))
            .with_current_trace();
        let mut tx = w.pool.begin().await.unwrap();
        outbox_postgres::Writer::new(&w.schema)
            .enqueue(&mut tx, &m)
            .await
            .unwrap();
        tx.commit().await.unwrap();
        (m, current_ids())
    };
    cx.span().end();
    // A raw-SQL writer sets the header by hand, as the SQL contract says.
    let span = tracer.start("place order by hand");
    let cx = opentelemetry::Context::current_with_span(span);
    let (raw_parent, w2) = {
        let _g = cx.clone().attach();
        let (p, _) = outbox_core::trace::current().unwrap();
        (p.to_string(), current_ids())
    };
    cx.span().end();
    sqlx::query(&w.schema.render(
        "INSERT INTO {schema}.outbox (aggregate_type, aggregate_id, event_type, payload, headers) \
         VALUES ('order', 'o-2', 'placed', '{\"n\": 2}', jsonb_build_object('traceparent', $1::text))",
    ))
    .bind(&raw_parent)
    .execute(&w.pool)
    .await
    .unwrap();

    // The inbox, in a schema of its own, fed from the test's stream.
    let inbox_schema = outbox_testkit::unique_name("tri");
    let db_args = |schema: &str| {
        vec![
            "--database-url".to_string(),
            common::database_url(),
            "--schema".to_string(),
            schema.to_string(),
        ]
    };
    let dir = std::env::temp_dir();
    let o = common::outbox_command(&dir)
        .args(["migrate", "--inbox"])
        .args(db_args(&inbox_schema))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let mut relay = common::outbox_command(&dir)
        .arg("relay")
        .args(db_args(&w.schema.render("{schema}")))
        .args([
            "--sink",
            &common::nats_url(),
            "--destination",
            &w.destination(),
        ])
        .args(["--otlp-endpoint", &otlp])
        .spawn()
        .unwrap();
    let source = format!("{}?stream={}", common::nats_url(), w.stream);
    let mut inbox = common::outbox_command(&dir)
        .arg("inbox")
        .args(db_args(&inbox_schema))
        .args(["--source", &source, "--otlp-endpoint", &otlp])
        .spawn()
        .unwrap();

    // The application's handler: it traces its own work under the current context.
    let pool = outbox_postgres::connect_pool(&common::database_url(), 4)
        .await
        .unwrap();
    let handled: Arc<Mutex<Vec<String>>> = Arc::default();
    let h = handled.clone();
    let handlers = Handlers::new().on_fn("placed", move |_tx, m| {
        let h = h.clone();
        Box::pin(async move {
            let tracer = opentelemetry::global::tracer("shop");
            let mut work = tracer.start("apply order");
            work.end();
            h.lock().unwrap().push(m.key.clone());
            Ok(())
        })
    });
    let config = ProcessorConfig {
        poll_interval: Duration::from_millis(50),
        lease: Duration::from_secs(3),
        ..ProcessorConfig::default()
    };
    let stop = tokio_util::sync::CancellationToken::new();
    let processor = tokio::spawn(
        InboxProcessor::postgres(
            pool.clone(),
            outbox_inbox::InboxSchema::new(&inbox_schema).unwrap(),
            handlers,
            config,
        )
        .unwrap()
        .run(stop.clone()),
    );
    let deadline = Instant::now() + WAIT;
    while handled.lock().unwrap().len() < 2 {
        assert!(Instant::now() < deadline, "not handled: {handled:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // The header arrived in NATS as written, from both writers.
    let msgs = w.read_all(2, WAIT).await;
    let by_key: HashMap<String, String> = msgs
        .iter()
        .map(|m| {
            (
                header(m, "outbox-aggregate-id").unwrap(),
                header(m, "traceparent").unwrap(),
            )
        })
        .collect();
    assert_eq!(
        by_key["o-1"],
        rust_msg.headers["traceparent"].as_str().unwrap()
    );
    assert_eq!(by_key["o-2"], raw_parent);

    // Stop everything so every exporter flushes, then read the spans.
    stop.cancel();
    let _ = processor.await;
    for child in [&mut relay, &mut inbox] {
        common::sigterm(&*child);
        common::wait_exit(child, Duration::from_secs(30));
    }
    tracing.shutdown();
    let deadline = Instant::now() + WAIT;
    let spans = loop {
        let spans = got.lock().unwrap().clone();
        let names = |n: &str| spans.iter().filter(|s| s.name.starts_with(n)).count();
        if names("publish") >= 1
            && names("receive") >= 1
            && names("process placed") >= 2
            && names("apply order") >= 2
        {
            break spans;
        }
        assert!(Instant::now() < deadline, "spans so far: {spans:#?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let linked_to = |prefix: &str, writer: &(String, String)| {
        spans
            .iter()
            .any(|s| s.name.starts_with(prefix) && s.links.contains(writer))
    };
    for writer in [&w1, &w2] {
        assert!(
            linked_to("publish", writer),
            "a publish span links {writer:?}: {spans:#?}"
        );
        assert!(
            linked_to("receive", writer),
            "a receive span links {writer:?}: {spans:#?}"
        );
        let process = spans
            .iter()
            .find(|s| s.name == "process placed" && s.trace == writer.0)
            .unwrap_or_else(|| panic!("no process span in trace {writer:?}: {spans:#?}"));
        assert_eq!(
            process.parent, writer.1,
            "the handler's span is the writer span's child"
        );
        let work = spans
            .iter()
            .find(|s| s.name == "apply order" && s.parent == process.span)
            .unwrap_or_else(|| panic!("the handler's own span is not in its trace: {spans:#?}"));
        assert_eq!(work.trace, writer.0);
    }
    let publish = spans
        .iter()
        .find(|s| s.name.starts_with("publish"))
        .unwrap();
    assert!(publish.service.contains("outbox-relay"), "{publish:?}");
    assert_ne!(
        publish.trace, w1.0,
        "a link, not a parent: the batch has a trace of its own"
    );

    let _ = sqlx::raw_sql(&format!(
        "DROP SCHEMA IF EXISTS {inbox_schema} CASCADE; DROP SCHEMA IF EXISTS {inbox_schema}_inbox CASCADE"
    ))
    .execute(&pool)
    .await;
    w.drop_all().await;
}

/// The header itself, sink by sink: a row from the Rust writer (`trace_context`) and a row
/// from raw SQL (the `headers` column) each arrive at Kafka, NATS and a webhook with their
/// `traceparent` and `tracestate` as written, read back by each broker's own reader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traceparent_from_the_rust_writer_and_from_raw_sql_arrives_in_kafka_nats_and_http_headers()
{
    use outbox_sinks::read::{read_until, scratch, ScratchOptions};
    let kafka =
        std::env::var("OUTBOX_TEST_KAFKA_URL").unwrap_or_else(|_| "kafka://127.0.0.1:9092".into());
    let rust_parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let raw_parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00";
    for url in [
        kafka,
        common::nats_url(),
        "http://127.0.0.1:9/hook".to_string(),
    ] {
        let w = World::with_stream(false).await;
        let s = scratch(&url, &ScratchOptions::new("trace"))
            .await
            .unwrap_or_else(|e| panic!("scratch on {url}: {e} (scripts/services.sh starts it)"));
        let m = NewMessage::new("order", "t-1", "placed", serde_json::json!({"n": 1}))
            .trace_context(rust_parent, Some("vendor=rust"))
            .unwrap();
        let mut tx = w.pool.begin().await.unwrap();
        outbox_postgres::Writer::new(&w.schema)
            .enqueue(&mut tx, &m)
            .await
            .unwrap();
        tx.commit().await.unwrap();
        sqlx::query(&w.schema.render(
            "INSERT INTO {schema}.outbox (aggregate_type, aggregate_id, event_type, payload, headers) \
             VALUES ('order', 't-2', 'placed', '{\"n\": 2}', \
                     jsonb_build_object('traceparent', $1::text, 'tracestate', 'vendor=sql'))",
        ))
        .bind(raw_parent)
        .execute(&w.pool)
        .await
        .unwrap();
        let sink = outbox_sinks::connect(&s.sink_url).await.unwrap();
        let relay = outbox_testkit::relay::RunningRelay::start(
            w.dyn_store(),
            sink,
            w.relay_config_to(&s.destination),
        );
        let mut reader = s.reader;
        let got = read_until(reader.as_mut(), WAIT, |d| d.len() >= 2).await;
        relay.stop().await;
        let header = |key: &str, name: &str| {
            got.delivered
                .iter()
                .find(|d| d.key == key)
                .unwrap_or_else(|| panic!("{url}: nothing for {key}: {:?}", got.delivered))
                .headers
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.clone())
        };
        for (key, name, want) in [
            ("t-1", "traceparent", rust_parent),
            ("t-1", "tracestate", "vendor=rust"),
            ("t-2", "traceparent", raw_parent),
            ("t-2", "tracestate", "vendor=sql"),
        ] {
            assert_eq!(
                header(key, name).as_deref(),
                Some(want),
                "{url}: {key} {name}"
            );
        }
        w.drop_all().await;
    }
}
