//! What is particular to the SQS sink, against a real SQS API (moto's server on this machine,
//! `scripts/services.sh` starts it): a queue by name and by URL, FIFO dedupe of a republished
//! id, one message of a batch refused, names and headers SQS cannot take, and a connection
//! closed without an answer (SQS and SNS share that classification). What every sink must do
//! is the conformance suite's (`outbox-sinks/tests/conformance.rs`, modules `sqs` and
//! `sqs_standard`).
//!
//! moto keeps its state in memory and answers per-message limits for a whole batch at once;
//! what that means for each test is said where it matters.

#![allow(clippy::unwrap_used)]

use crate::aws;
use std::collections::HashSet;
use std::time::{Duration, Instant};

use aws::{moto_endpoint, run};
use outbox_core::{Envelope, Sink, SinkErrorKind};
use outbox_sinks::read::{scratch, Reader, Scratch, ScratchOptions};
use outbox_sinks::sqs::{create_queue, SqsConfig, SqsReader, SqsSink};
use outbox_testkit::relay::{envelope, read_distinct};

/// The sink URL for `endpoint`: region and endpoint only; credentials come from the chain.
fn sqs_url(endpoint: &str) -> String {
    aws::url("sqs", endpoint)
}

async fn sink(url: &str) -> SqsSink {
    SqsSink::connect(SqsConfig::sqs_from_url(url).unwrap())
        .await
        .unwrap()
}

async fn scratch_queue(tag: &str, fifo: bool) -> Scratch {
    let mut o = ScratchOptions::new(tag);
    o.fifo = fifo;
    scratch(&sqs_url(&moto_endpoint()), &o).await.unwrap()
}

/// Reads `reader` until `n` messages came (or 60 s passed), then a little longer for any
/// duplicate.
async fn read_n(reader: &mut dyn Reader, n: usize) -> Vec<outbox_sinks::read::Delivered> {
    read_distinct(reader, n, Duration::from_secs(60)).await
}

/// A relay that crashed after SQS accepted a batch publishes it again with the same ids:
/// `MessageDeduplicationId` (the message id) makes a FIFO queue drop the copies.
#[test]
fn a_fifo_queue_drops_a_republished_id() {
    run(async {
        let mut s = scratch_queue("fifo", true).await;
        let sink = sink(&s.sink_url).await;
        aws::assert_republished_ids_are_dropped(&sink, &s.destination, s.reader.as_mut()).await;
        s.reader.cleanup().await;
    });
}

#[test]
fn a_queue_is_reachable_by_name_and_by_url() {
    run(async {
        let mut s = scratch_queue("names", false).await;
        let client = outbox_sinks::sqs::reader_client(&s.sink_url).await.unwrap();
        let url = client
            .get_queue_url()
            .queue_name(&s.destination)
            .send()
            .await
            .unwrap()
            .queue_url()
            .unwrap()
            .to_string();
        let sink = sink(&s.sink_url).await;
        let by_name = envelope(&s.destination, "k1", 1);
        let by_url = envelope(&url, "k2", 2);
        let results = sink.publish(&[by_name.clone(), by_url.clone()]).await;
        assert!(results.iter().all(Result::is_ok), "{results:?}");
        let got = read_n(s.reader.as_mut(), 2).await;
        let ids: HashSet<uuid::Uuid> = got.iter().map(|d| d.id).collect();
        assert_eq!(ids, HashSet::from([by_name.id, by_url.id]));
        s.reader.cleanup().await;
    });
}

/// A batch call SQS refuses for one message's content publishes the other nine. moto refuses
/// such a batch whole (it checks every entry before storing any), which is exactly the case
/// the sink resends one message per call; a partial answer (`Failed` entries next to
/// `Successful` ones) is mapped per message in `outbox-sinks`' unit tests
/// (`a_partial_answer_fails_only_the_failed_entries`).
#[test]
fn a_batch_refused_for_one_message_publishes_the_other_nine() {
    run(async {
        let url = sqs_url(&moto_endpoint());
        let client = outbox_sinks::sqs::reader_client(&url).await.unwrap();
        let name = outbox_testkit::unique_name("outbox_small");
        // A queue that takes at most 1 KiB per message: below the sink's own 256 KiB check.
        let queue_url = client
            .create_queue()
            .queue_name(&name)
            .attributes(
                aws_sdk_sqs::types::QueueAttributeName::MaximumMessageSize,
                "1024",
            )
            .send()
            .await
            .unwrap()
            .queue_url()
            .unwrap()
            .to_string();
        let mut reader = SqsReader::new(client, queue_url, name.clone(), true);
        let mut batch: Vec<Envelope> = (0..10)
            .map(|i| envelope(&name, &format!("k{i}"), i))
            .collect();
        batch[4].payload = bytes::Bytes::from(format!("{{\"blob\":\"{}\"}}", "x".repeat(2000)));
        let sink = sink(&url).await;
        let results = sink.publish(&batch).await;
        for (i, r) in results.iter().enumerate() {
            if i == 4 {
                let e = r.as_ref().unwrap_err();
                assert_eq!(e.kind, SinkErrorKind::Invalid, "{e}");
                assert!(e.message.contains("1024"), "{e}");
            } else {
                assert!(r.is_ok(), "message {i}: {r:?}");
            }
        }
        let got = read_n(&mut reader, 9).await;
        let ids: HashSet<uuid::Uuid> = got.iter().map(|d| d.id).collect();
        let want: HashSet<uuid::Uuid> = batch
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != 4)
            .map(|(_, e)| e.id)
            .collect();
        assert_eq!(ids, want);
        assert_eq!(got.len(), 9);
        reader.cleanup().await;
    });
}

#[test]
fn invalid_header_names_and_fifo_keys_are_invalid_before_any_call() {
    run(async {
        let sink = sink(&sqs_url(&moto_endpoint())).await;
        let mut bad_header = envelope("anything", "k", 0);
        bad_header.headers.push(("AWS.trace".into(), "x".into()));
        let mut bad_key = envelope("anything.fifo", "has space", 0);
        bad_key.key = "has space".into();
        let bad_name = envelope("not/a/queue", "k", 0);
        for (e, what) in [
            (&bad_header, "AWS.trace"),
            (&bad_key, "MessageGroupId"),
            (&bad_name, "not a queue name"),
        ] {
            let r = sink.publish(std::slice::from_ref(e)).await;
            let err = r[0].as_ref().unwrap_err();
            assert_eq!(err.kind, SinkErrorKind::Invalid, "{err}");
            assert!(err.message.contains(what), "{err}");
        }
    });
}

/// A connection the endpoint closes without an answer (a server dying mid-request, a load
/// balancer with no backend behind it) is an outage like a refused one: `unavailable`, which
/// the relay's circuit counts, not a rejection, which it ignores while spending the message's
/// attempts. SQS through a queue name (`GetQueueUrl`) and a queue URL (`SendMessageBatch`), and
/// SNS, which shares the classification.
#[test]
fn a_connection_closed_without_an_answer_is_unavailable() {
    run(async {
        let (endpoint, closer) = closing_endpoint().await;
        // Long enough for the SDK's own attempts to end on the close rather than on the ack
        // timeout (a timeout is unavailable whatever the close is taken for).
        let sqs = sink(&format!("{}&ack_timeout=10s", sqs_url(&endpoint))).await;
        let sns = outbox_sinks::sns::SnsSink::connect(
            outbox_sinks::sns::SnsConfig::sns_from_url(&format!(
                "{}&ack_timeout=10s",
                aws::url("sns", &endpoint)
            ))
            .unwrap(),
        )
        .await
        .unwrap();
        let cases: [(&dyn Sink, String); 3] = [
            (&sqs, "outbox_closed".into()),
            (&sqs, format!("{endpoint}/123456789012/outbox_closed")),
            (
                &sns,
                "arn:aws:sns:us-east-1:123456789012:outbox_closed".into(),
            ),
        ];
        for (sink, destination) in cases {
            let r = sink.publish(&[envelope(&destination, "k", 0)]).await;
            let e = r[0].as_ref().unwrap_err();
            assert!(e.message.contains("closed before message completed"), "{e}");
            assert_eq!(e.kind, SinkErrorKind::Unavailable, "{destination}: {e}");
        }
        closer.abort();
    });
}

/// An endpoint on a free port that reads each request and closes the connection without an
/// answer, as a server that dies mid-request does; its URL and its task.
async fn closing_endpoint() -> (String, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let task = tokio::spawn(async move {
        while let Ok((mut c, _)) = listener.accept().await {
            let mut buf = [0u8; 16 * 1024];
            let _ = tokio::io::AsyncReadExt::read(&mut c, &mut buf).await;
        }
    });
    (url, task)
}

/// The SDK's raw `SendMessageBatch` throughput against the shared moto: 200-byte messages, ten
/// per call, up to 32 calls in flight (`OUTBOX_SQS_BENCH_PER_CALL` messages per publish call,
/// 320 by default), every call acknowledged. moto's cost per call grows with the depth of the
/// queue (it is the bottleneck, with boto3 alike), so the messages are spread over queues of
/// 200 each. Prints the figure; asserts nothing about it:
/// `cargo nextest run -p outbox-cli --test sink_sqs --run-ignored only --no-capture`.
#[test]
#[ignore = "a measurement, not a test"]
fn raw_send_message_batch_throughput() {
    run(async {
        let env = |name: &str, default: usize| {
            std::env::var(name)
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(default)
        };
        let total = env("OUTBOX_SQS_BENCH_MESSAGES", 10_000);
        let per_call = env("OUTBOX_SQS_BENCH_PER_CALL", 320);
        let url = sqs_url(&moto_endpoint());
        let client = outbox_sinks::sqs::reader_client(&url).await.unwrap();
        let mut queues = Vec::new();
        for _ in 0..total.div_ceil(200) {
            let name = outbox_testkit::unique_name("outbox_bench");
            queues.push(create_queue(&client, &name, false).await.unwrap());
        }
        let sink = sink(&format!("{url}&ack_timeout=60s")).await;
        let body = format!("{{\"pad\":\"{}\"}}", "x".repeat(190));
        // Consecutive messages go to the same queue in runs of ten, so each call is one batch.
        let envelopes: Vec<Envelope> = (0..total)
            .map(|i| {
                let mut e = envelope(&queues[(i / 10) % queues.len()], &format!("k{i}"), 0);
                e.payload = bytes::Bytes::from(body.clone());
                e
            })
            .collect();
        let started = Instant::now();
        for chunk in envelopes.chunks(per_call) {
            for r in sink.publish(chunk).await {
                r.unwrap();
            }
        }
        let took = started.elapsed();
        println!(
            "SendMessageBatch against moto: {total} messages of {} bytes, {per_call} per publish \
             call, in {took:?}: {:.0} msg/s",
            body.len(),
            total as f64 / took.as_secs_f64()
        );
        for q in queues {
            let _ = client.delete_queue().queue_url(&q).send().await;
        }
    });
}
