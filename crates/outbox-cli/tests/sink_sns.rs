//! The SNS sink against a real SNS API: moto's server on this machine, and a private moto of
//! the test's own for the outage test. Every test makes its own topic with a random suffix and
//! reads it back through an SQS queue subscribed with raw delivery (the sink's reader), so the
//! message attributes arrive as SQS message attributes.

#![allow(clippy::unwrap_used)]

#[path = "common/aws.rs"]
mod aws;
mod common;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use aws::{
    envelope, moto_endpoint, read_n, relay_config, run, spawn, triples, wait_failed, wait_state,
    watch_breaker, PrivateMoto,
};
use common::{assert_key_order, interleaved, keys, World};
use outbox_core::{Envelope, NewMessage, Sink, SinkErrorKind, Store};
use outbox_relay::{CircuitState, Relay};
use outbox_sinks::read::{scratch, Scratch, ScratchOptions};
use outbox_sinks::sns::{create_topic, subscribe_queue, SnsConfig, SnsSink};
use outbox_sinks::sqs::{create_queue, SqsReader};
use tokio_util::sync::CancellationToken;

fn sns_url(endpoint: &str) -> String {
    format!("sns://?region=us-east-1&endpoint={endpoint}")
}

async fn sink(url: &str) -> SnsSink {
    SnsSink::connect(SnsConfig::sns_from_url(url).unwrap())
        .await
        .unwrap()
}

async fn scratch_topic(tag: &str, fifo: bool) -> Scratch {
    let mut o = ScratchOptions::new(tag);
    o.fifo = fifo;
    scratch(&sns_url(&moto_endpoint()), &o).await.unwrap()
}

#[test]
fn standard_topic_delivers_every_row_by_name_with_its_headers_as_attributes() {
    run(async {
        let w = World::with_stream(false).await;
        let mut s = scratch_topic("std", false).await;
        let ks = keys("order-", 6);
        // Every fourth row carries eight headers: more than fit next to the relay's four as
        // one attribute each, so they travel packed in `outbox-headers`.
        let msgs: Vec<NewMessage> = interleaved(&ks, 0..20)
            .into_iter()
            .enumerate()
            .map(|(i, m)| {
                let m = m.header("traceparent", format!("00-{i:032x}-00f067aa0ba902b7-01"));
                if i % 4 == 0 {
                    (1..8).fold(m, |m, h| m.header(format!("x-h{h}"), format!("v{h}-{i}")))
                } else {
                    m
                }
            })
            .collect();
        w.store().insert(&msgs).await.unwrap();
        let (stop, h) = spawn(Relay::new(
            w.dyn_store(),
            Arc::new(sink(&s.sink_url).await),
            relay_config(&w, &s.destination),
        ));
        w.wait_drained(Duration::from_secs(60)).await;
        stop.cancel();
        h.await.unwrap();

        let got = read_n(s.reader.as_mut(), msgs.len()).await;
        // A standard topic (and the standard queue behind it) has no dedupe and orders
        // nothing: every message exactly once here (no retry happened), order not asserted.
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
            for (k, v) in &m.headers {
                assert_eq!(d.header(k), v.as_str(), "header {k} of {}", m.id);
            }
            assert_eq!(d.headers.len(), 4 + m.headers.len(), "{:?}", d.headers);
        }
        s.reader.cleanup().await;
        w.drop_all().await;
    });
}

#[test]
fn fifo_topic_by_arn_keeps_each_keys_order_with_the_key_as_group_and_the_id_as_dedupe_id() {
    run(async {
        let w = World::with_stream(false).await;
        let mut s = scratch_topic("fifo", true).await;
        let sink = Arc::new(sink(&s.sink_url).await);
        // CreateTopic of an existing name (same attributes) answers its ARN.
        let arn = create_topic(sink.client(), &s.destination, true)
            .await
            .unwrap();
        let ks = keys("acct-", 8);
        let msgs = interleaved(&ks, 0..25);
        w.store().insert(&msgs).await.unwrap();
        let (stop, h) = spawn(Relay::new(
            w.dyn_store(),
            sink.clone(),
            relay_config(&w, &arn),
        ));
        w.wait_drained(Duration::from_secs(60)).await;
        stop.cancel();
        h.await.unwrap();

        let got = read_n(s.reader.as_mut(), msgs.len()).await;
        assert_eq!(got.len(), msgs.len(), "every message once");
        // The key comes back as the FIFO queue's MessageGroupId, which SNS passed on.
        let per_key = assert_key_order(triples(&got));
        assert_eq!(per_key.len(), ks.len());
        assert!(per_key.values().all(|&n| n == 25), "{per_key:?}");

        // The same ids published twice (a relay that crashed after SNS accepted them): the
        // MessageDeduplicationId the sink sets (the message id) drops the copies. moto does
        // not dedupe at the topic itself; it passes the id on to the FIFO queue, which drops
        // them, so this proves the id travels as the dedupe id end to end.
        let again: Vec<Envelope> = (0..10)
            .map(|i| envelope(&s.destination, &format!("dup-{i}"), 0))
            .collect();
        for _ in 0..2 {
            for r in sink.publish(&again).await {
                r.unwrap();
            }
        }
        let got = read_n(s.reader.as_mut(), again.len()).await;
        assert_eq!(got.len(), again.len(), "a republished id must be dropped");
        s.reader.cleanup().await;
        w.drop_all().await;
    });
}

#[test]
fn an_unknown_topic_ends_failed_naming_it_while_other_rows_flow_and_the_circuit_stays_closed() {
    run(async {
        let w = World::with_stream(false).await;
        let mut s = scratch_topic("unknown", false).await;
        let missing = outbox_testkit::unique_name("outbox_missing");
        let bad = NewMessage::new("order", "bad-key", "placed", serde_json::json!({ "n": 0 }))
            .topic(missing.clone());
        w.store().insert(std::slice::from_ref(&bad)).await.unwrap();
        let good = interleaved(&keys("g", 5), 0..10);
        w.store().insert(&good).await.unwrap();

        let mut cfg = relay_config(&w, &s.destination);
        cfg.workers = 1;
        cfg.retry.max_attempts = 4;
        cfg.breaker_threshold = 2;
        let relay = Relay::new(w.dyn_store(), Arc::new(sink(&s.sink_url).await), cfg);
        let stop = CancellationToken::new();
        let left_closed = watch_breaker(relay.breaker(), stop.clone());
        let h = tokio::spawn(relay.run(stop.clone()));

        let (attempts, error) = wait_failed(&w, bad.id, Duration::from_secs(60)).await;
        assert_eq!(attempts, 4, "failed after exactly its budget");
        assert!(
            error.contains(&missing),
            "the reason must name the topic: {error}"
        );
        assert!(error.contains("no topic"), "{error}");
        let got = read_n(s.reader.as_mut(), good.len()).await;
        assert_eq!(got.len(), good.len(), "the other rows flow");
        stop.cancel();
        h.await.unwrap();
        assert!(
            !left_closed.load(Ordering::SeqCst),
            "a missing topic is no outage: the circuit must stay closed"
        );
        s.reader.cleanup().await;
        w.drop_all().await;
    });
}

#[test]
fn an_oversized_payload_is_invalid_and_fails_at_once() {
    run(async {
        let sink = sink(&sns_url(&moto_endpoint())).await;
        let mut big = envelope("any_topic", "k", 0);
        big.payload = bytes::Bytes::from(format!("{{\"blob\":\"{}\"}}", "x".repeat(262_144)));
        let r = sink.publish(std::slice::from_ref(&big)).await;
        let e = r[0].as_ref().unwrap_err();
        assert_eq!(e.kind, SinkErrorKind::Invalid, "{e}");
        assert!(e.message.contains("the limit is 262144"), "{e}");
    });
}

/// A topic, a queue subscribed to it with raw delivery, and a reader of the queue, on the
/// moto at `endpoint`; returns the reader.
async fn topic_with_queue(endpoint: &str, name: &str) -> SqsReader {
    let sdk = SnsConfig::sns_from_url(&sns_url(endpoint))
        .unwrap()
        .reader_sdk_config()
        .await
        .unwrap();
    let sns = aws_sdk_sns::Client::new(&sdk);
    let sqs = aws_sdk_sqs::Client::new(&sdk);
    let topic_arn = create_topic(&sns, name, true).await.unwrap();
    let queue_url = create_queue(&sqs, name, true).await.unwrap();
    subscribe_queue(&sns, &sqs, &topic_arn, &queue_url)
        .await
        .unwrap();
    SqsReader::new(sqs, queue_url, name.to_string(), false)
}

/// What this proves, exactly: with moto gone (connection refused) the relay's `PublishBatch`
/// calls fail as unavailable, the circuit opens, and no message ends `failed` or is recorded
/// as published; once moto answers again and the topic, the queue and the subscription exist
/// again (moto lost them with the rest of its memory, so the test makes them anew under the
/// same names), every message written during the outage is delivered, each key in order, with
/// no loss. Messages delivered before the stop were read before it.
///
/// Unlike the SQS test, the relay that lived through the outage is stopped before moto comes
/// back, and a new relay (same database) delivers the backlog: SNS accepts and drops a message
/// published to a topic without subscribers, so a probe landing between the test's
/// `CreateTopic` and `Subscribe` would be lost by SNS itself, not by the relay.
#[test]
fn relay_retries_while_a_private_moto_is_down_and_delivers_everything_once_the_topic_is_back() {
    run(async {
        let mut moto = PrivateMoto::start();
        let name = format!("{}.fifo", outbox_testkit::unique_name("outbox_outage"));
        let mut reader = topic_with_queue(&moto.endpoint(), &name).await;

        let w = World::with_stream(false).await;
        let ks = keys("k", 10);
        let mut cfg = relay_config(&w, &name);
        cfg.lease = Duration::from_secs(6);
        cfg.retry.max_attempts = 1000;
        let url = format!("{}&ack_timeout=1s", sns_url(&moto.endpoint()));
        let relay = Relay::new(w.dyn_store(), Arc::new(sink(&url).await), cfg.clone());
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
        stop.cancel();
        h.await.unwrap();

        moto.up();
        let mut reader = topic_with_queue(&moto.endpoint(), &name).await;
        let (stop, h) = spawn(Relay::new(w.dyn_store(), Arc::new(sink(&url).await), cfg));
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
