//! The SQS sink against a real SQS API: moto's server on this machine (`scripts/services.sh`
//! starts it), and a private moto of the test's own for the outage test. Every test makes its
//! own queues with a random suffix and reads them back with the sink's independent reader.
//!
//! moto keeps its state in memory and answers per-message limits for a whole batch at once;
//! what that means for each test is said where it matters.

#![allow(clippy::unwrap_used)]

#[path = "common/aws.rs"]
mod aws;
mod common;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use aws::{
    closing_endpoint, envelope, moto_endpoint, read_n, relay_config, run, spawn, wait_failed,
    watch_breaker, PrivateMoto,
};
use common::outage::triples;
use common::{assert_key_order, interleaved, keys, wait_state, World};
use outbox_core::{Envelope, NewMessage, Sink, SinkErrorKind, Store};
use outbox_relay::{CircuitState, Relay};
use outbox_sinks::read::{scratch, Reader, Scratch, ScratchOptions};
use outbox_sinks::sqs::{create_queue, SqsConfig, SqsReader, SqsSink};
use tokio_util::sync::CancellationToken;

/// The sink URL for `endpoint`: region and endpoint only; credentials come from the chain.
fn sqs_url(endpoint: &str) -> String {
    format!("sqs://?region=us-east-1&endpoint={endpoint}")
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

#[test]
fn standard_queue_delivers_every_row_with_its_id_key_headers_and_body() {
    run(async {
        let w = World::with_stream(false).await;
        let mut s = scratch_queue("std", false).await;
        let ks = keys("order-", 8);
        // Most rows carry one header; every fifth carries eight, more than fit next to the
        // relay's four as one attribute each, and travels packed in `outbox-headers`.
        let msgs: Vec<NewMessage> = interleaved(&ks, 0..25)
            .into_iter()
            .enumerate()
            .map(|(i, m)| {
                let m = m.header("traceparent", format!("00-{i:032x}-00f067aa0ba902b7-01"));
                if i % 5 == 0 {
                    (1..8).fold(m, |m, h| m.header(format!("x-h{h}"), format!("v{h}-{i}")))
                } else {
                    m
                }
            })
            .collect();
        w.store().insert(&msgs).await.unwrap();
        let sink = sink(&s.sink_url).await;
        let (stop, h) = spawn(Relay::new(
            w.dyn_store(),
            Arc::new(sink),
            relay_config(&w, &s.destination),
        ));
        w.wait_drained(Duration::from_secs(60)).await;
        stop.cancel();
        h.await.unwrap();

        let got = read_n(s.reader.as_mut(), msgs.len()).await;
        // A standard queue has no dedupe and orders nothing: every message exactly once here
        // (no retry happened), order not asserted.
        assert_eq!(got.len(), msgs.len());
        let by_id: HashMap<uuid::Uuid, &NewMessage> = msgs.iter().map(|m| (m.id, m)).collect();
        let mut seen = HashSet::new();
        for d in &got {
            let m = by_id[&d.id];
            assert!(seen.insert(d.id), "{} arrived twice", d.id);
            assert_eq!(d.destination, s.destination);
            assert_eq!(d.key, m.aggregate_id);
            assert_eq!(
                serde_json::from_slice::<serde_json::Value>(&d.payload).unwrap(),
                m.payload
            );
            assert_eq!(
                d.header("outbox-message-id"),
                Some(m.id.to_string().as_str())
            );
            assert_eq!(d.header("outbox-event-type"), Some("changed"));
            assert_eq!(d.header("outbox-aggregate-type"), Some("order"));
            assert_eq!(
                d.header("outbox-aggregate-id"),
                Some(m.aggregate_id.as_str())
            );
            for (k, v) in &m.headers {
                assert_eq!(d.header(k), v.as_str(), "header {k} of {}", m.id);
            }
            // Four relay headers and the row's, nothing else (packed ones unpacked).
            assert_eq!(d.headers.len(), 4 + m.headers.len(), "{:?}", d.headers);
        }
        s.reader.cleanup().await;
        w.drop_all().await;
    });
}

#[test]
fn fifo_queue_keeps_each_keys_order_with_the_key_as_group_and_drops_a_republished_id() {
    run(async {
        let w = World::with_stream(false).await;
        let mut s = scratch_queue("fifo", true).await;
        assert!(s.destination.ends_with(".fifo"));
        // moto's FIFO send gets slower with the queue's depth (its dedupe scans the queue), so
        // 200 messages rather than thousands.
        let ks = keys("acct-", 8);
        let msgs = interleaved(&ks, 0..25);
        w.store().insert(&msgs).await.unwrap();
        let sink = Arc::new(sink(&s.sink_url).await);
        let (stop, h) = spawn(Relay::new(
            w.dyn_store(),
            sink.clone(),
            relay_config(&w, &s.destination),
        ));
        w.wait_drained(Duration::from_secs(60)).await;
        stop.cancel();
        h.await.unwrap();

        let got = read_n(s.reader.as_mut(), msgs.len()).await;
        assert_eq!(got.len(), msgs.len(), "every message once");
        // The reader takes the key from the FIFO MessageGroupId SQS returns.
        let per_key = assert_key_order(triples(&got));
        assert_eq!(per_key.len(), ks.len());
        assert!(per_key.values().all(|&n| n == 25), "{per_key:?}");

        // A relay that crashed after SQS accepted a batch publishes it again with the same ids:
        // MessageDeduplicationId (the message id) makes SQS drop the copies.
        let again: Vec<Envelope> = (0..10)
            .map(|i| envelope(&s.destination, &format!("dup-{i}"), 0))
            .collect();
        for r in sink.publish(&again).await {
            r.unwrap();
        }
        for r in sink.publish(&again).await {
            r.unwrap();
        }
        let got = read_n(s.reader.as_mut(), again.len()).await;
        assert_eq!(got.len(), again.len(), "a republished id must be dropped");
        s.reader.cleanup().await;
        w.drop_all().await;
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

#[test]
fn an_unknown_queue_ends_failed_naming_it_while_other_rows_flow_and_the_circuit_stays_closed() {
    run(async {
        let w = World::with_stream(false).await;
        let mut s = scratch_queue("unknown", false).await;
        let missing = outbox_testkit::unique_name("outbox_missing");
        let bad = NewMessage::new("order", "bad-key", "placed", serde_json::json!({ "n": 0 }))
            .topic(missing.clone());
        w.store().insert(std::slice::from_ref(&bad)).await.unwrap();
        let good = interleaved(&keys("g", 5), 0..10);
        w.store().insert(&good).await.unwrap();

        let mut cfg = relay_config(&w, &s.destination);
        cfg.workers = 1;
        cfg.retry.max_attempts = 4;
        // Fewer rejections than the budget would open it, if rejections counted.
        cfg.breaker_threshold = 2;
        let relay = Relay::new(w.dyn_store(), Arc::new(sink(&s.sink_url).await), cfg);
        let stop = CancellationToken::new();
        let left_closed = watch_breaker(relay.breaker(), stop.clone());
        let h = tokio::spawn(relay.run(stop.clone()));

        let (attempts, error) = wait_failed(&w, bad.id, Duration::from_secs(60)).await;
        assert_eq!(attempts, 4, "failed after exactly its budget");
        assert!(
            error.contains(&missing),
            "the reason must name the queue: {error}"
        );
        assert!(error.contains("no queue"), "{error}");
        let got = read_n(s.reader.as_mut(), good.len()).await;
        assert_eq!(got.len(), good.len(), "the other rows flow");
        stop.cancel();
        h.await.unwrap();
        assert!(
            !left_closed.load(Ordering::SeqCst),
            "a missing queue is no outage: the circuit must stay closed"
        );
        let st = w.stats().await;
        assert_eq!((st.published, st.failed), (good.len() as i64, 1));
        s.reader.cleanup().await;
        w.drop_all().await;
    });
}

#[test]
fn an_oversized_payload_is_invalid_and_fails_at_once_while_other_rows_flow() {
    run(async {
        let w = World::with_stream(false).await;
        let mut s = scratch_queue("big", false).await;
        let big = NewMessage::new(
            "order",
            "big-key",
            "placed",
            serde_json::json!({ "blob": "x".repeat(300 * 1024) }),
        );
        let small = interleaved(&keys("s", 4), 0..5);
        w.store().insert(std::slice::from_ref(&big)).await.unwrap();
        w.store().insert(&small).await.unwrap();
        let (stop, h) = spawn(Relay::new(
            w.dyn_store(),
            Arc::new(sink(&s.sink_url).await),
            relay_config(&w, &s.destination),
        ));
        let (attempts, error) = wait_failed(&w, big.id, Duration::from_secs(30)).await;
        assert_eq!(attempts, 1, "an invalid message fails at its first attempt");
        assert!(error.contains("the limit is 262144"), "{error}");
        let got = read_n(s.reader.as_mut(), small.len()).await;
        assert_eq!(got.len(), small.len());
        assert!(got.iter().all(|d| d.id != big.id));
        stop.cancel();
        h.await.unwrap();
        s.reader.cleanup().await;
        w.drop_all().await;
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
/// attempts. Through a queue name (`GetQueueUrl`) and a queue URL (`SendMessageBatch`).
#[test]
fn a_connection_closed_without_an_answer_is_unavailable() {
    run(async {
        let (endpoint, closer) = closing_endpoint().await;
        // Long enough for the SDK's own attempts to end on the close rather than on the ack
        // timeout (a timeout is unavailable whatever the close is taken for).
        let sink = sink(&format!("{}&ack_timeout=10s", sqs_url(&endpoint))).await;
        for destination in [
            "outbox_closed",
            &format!("{endpoint}/123456789012/outbox_closed"),
        ] {
            let r = sink.publish(&[envelope(destination, "k", 0)]).await;
            let e = r[0].as_ref().unwrap_err();
            assert!(e.message.contains("closed before message completed"), "{e}");
            assert_eq!(e.kind, SinkErrorKind::Unavailable, "{destination}: {e}");
        }
        closer.abort();
    });
}

/// What this proves, exactly: with the service gone (connection refused) the relay's calls
/// fail as unavailable, the circuit opens, no message ends `failed` and none is recorded as
/// published; once moto answers again and the queue exists again (moto lost it with the rest
/// of its memory, so the test creates it anew under the same name and URL), the relay
/// delivers every message written during the outage, each key in order, with no loss. The
/// messages delivered before the stop were read before it (moto's restart loses what it held).
#[test]
fn relay_retries_while_a_private_moto_is_down_and_delivers_everything_once_the_queue_is_back() {
    run(async {
        let mut moto = PrivateMoto::start();
        let url = format!("{}&ack_timeout=1s", sqs_url(&moto.endpoint()));
        let client = outbox_sinks::sqs::reader_client(&url).await.unwrap();
        let name = format!("{}.fifo", outbox_testkit::unique_name("outbox_outage"));
        let queue_url = create_queue(&client, &name, true).await.unwrap();
        let mut reader = SqsReader::new(client.clone(), queue_url.clone(), name.clone(), false);

        let w = World::with_stream(false).await;
        let ks = keys("k", 10);
        let mut cfg = relay_config(&w, &name);
        cfg.lease = Duration::from_secs(6);
        cfg.retry.max_attempts = 1000;
        let relay = Relay::new(w.dyn_store(), Arc::new(sink(&url).await), cfg);
        let breaker = relay.breaker();
        let (stop, h) = spawn(relay);

        w.store().insert(&interleaved(&ks, 0..10)).await.unwrap();
        w.wait_drained(Duration::from_secs(60)).await;
        let mut got = read_n(&mut reader, 100).await;
        assert_eq!(got.len(), 100);

        moto.down();
        w.store().insert(&interleaved(&ks, 10..20)).await.unwrap();
        wait_state(&breaker, CircuitState::Open, Duration::from_secs(60)).await;
        let during = w.stats().await;
        assert_eq!((during.published, during.failed), (100, 0), "{during:?}");
        tokio::time::sleep(Duration::from_secs(2)).await;
        let later = w.stats().await;
        assert_eq!((later.published, later.failed), (100, 0), "{later:?}");

        moto.up();
        let again = create_queue(&client, &name, true).await.unwrap();
        assert_eq!(again, queue_url, "the same name gives the same URL");
        wait_state(&breaker, CircuitState::Closed, Duration::from_secs(60)).await;
        w.wait_drained(Duration::from_secs(60)).await;
        stop.cancel();
        h.await.unwrap();
        let st = w.stats().await;
        assert_eq!((st.published, st.failed), (200, 0), "{st:?}");

        got.extend(read_n(&mut reader, 100).await);
        assert_eq!(got.len(), 200, "every message once");
        let per_key = assert_key_order(triples(&got));
        assert!(per_key.values().all(|&n| n == 20), "{per_key:?}");
        w.drop_all().await;
    });
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
