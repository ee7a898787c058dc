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
use std::time::{Duration, Instant};

use aws::{
    closing_endpoint, envelope, moto_endpoint, read_n, relay_config, run, spawn, wait_failed,
    watch_breaker, PrivateMoto,
};
use common::outage::{assert_all_arrived_in_key_order, read_distinct, read_more, triples, Backlog};
use common::{assert_key_order, interleaved, keys, World};
use outbox_core::{Envelope, NewMessage, Sink, SinkErrorKind, Store};
use outbox_relay::Relay;
use outbox_sinks::read::{scratch, Reader, Scratch, ScratchOptions};
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

/// A connection the endpoint closes without an answer is an outage, as for SQS (the two sinks
/// share the classification): `unavailable`, not a rejection.
#[test]
fn a_connection_closed_without_an_answer_is_unavailable() {
    run(async {
        let (endpoint, closer) = closing_endpoint().await;
        let sink = sink(&format!("{}&ack_timeout=10s", sns_url(&endpoint))).await;
        let arn = "arn:aws:sns:us-east-1:123456789012:outbox_closed";
        let r = sink.publish(&[envelope(arn, "k", 0)]).await;
        let e = r[0].as_ref().unwrap_err();
        assert!(e.message.contains("closed before message completed"), "{e}");
        assert_eq!(e.kind, SinkErrorKind::Unavailable, "{e}");
        closer.abort();
    });
}

/// Through the relay: the oversized row ends `failed` at its first attempt with a reason giving
/// its size and the limit, never opens the circuit, and the rows beside it flow.
#[test]
fn an_oversized_row_ends_failed_naming_its_size_while_other_rows_flow() {
    run(async {
        let w = World::with_stream(false).await;
        let mut s = scratch_topic("big", false).await;
        let big = NewMessage::new(
            "order",
            "big-key",
            "placed",
            serde_json::json!({ "blob": "x".repeat(300 * 1024) }),
        );
        let small = interleaved(&keys("s", 4), 0..5);
        w.store().insert(std::slice::from_ref(&big)).await.unwrap();
        w.store().insert(&small).await.unwrap();
        let relay = Relay::new(
            w.dyn_store(),
            Arc::new(sink(&s.sink_url).await),
            relay_config(&w, &s.destination),
        );
        let stop = CancellationToken::new();
        let left_closed = watch_breaker(relay.breaker(), stop.clone());
        let h = tokio::spawn(relay.run(stop.clone()));
        let (attempts, error) = wait_failed(&w, big.id, Duration::from_secs(30)).await;
        assert_eq!(attempts, 1, "an invalid message fails at its first attempt");
        let size = error
            .split("the message is ")
            .nth(1)
            .and_then(|r| r.split(' ').next())
            .and_then(|n| n.parse::<usize>().ok())
            .unwrap_or_else(|| panic!("the reason must give the size: {error}"));
        assert!(size > 300 * 1024, "{error}");
        assert!(error.contains("the limit is 262144"), "{error}");
        w.wait_drained(Duration::from_secs(30)).await;
        let got = read_n(s.reader.as_mut(), small.len()).await;
        assert_eq!(got.len(), small.len(), "the other rows flow");
        assert!(got.iter().all(|d| d.id != big.id));
        stop.cancel();
        h.await.unwrap();
        assert!(
            !left_closed.load(Ordering::SeqCst),
            "an oversized row is no outage: the circuit must stay closed"
        );
        let st = w.stats().await;
        assert_eq!((st.published, st.failed), (small.len() as i64, 1), "{st:?}");
        s.reader.cleanup().await;
        w.drop_all().await;
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

/// A port in front of a private moto that can be shut. Shut, it drops every connection through
/// it (calls in flight lose their answer) and stops listening (new ones are refused), as the
/// port of a server that crashed does; opened, it listens again on the same port and forwards.
struct Gate {
    port: u16,
    target: u16,
    /// Cancelled when the gate shuts: ends the accept loop and every connection of this opening,
    /// including one accepted in the very moment of shutting.
    shut: CancellationToken,
    accept: Option<tokio::task::JoinHandle<()>>,
}

impl Gate {
    async fn start(target: u16) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut me = Self {
            port,
            target,
            shut: CancellationToken::new(),
            accept: None,
        };
        me.open().await;
        me
    }

    async fn open(&mut self) {
        // The port was ours a moment ago; binding it again may briefly find it busy.
        let deadline = Instant::now() + Duration::from_secs(10);
        let listener = loop {
            match tokio::net::TcpListener::bind(("127.0.0.1", self.port)).await {
                Ok(l) => break l,
                Err(e) => {
                    assert!(Instant::now() < deadline, "gate: bind {}: {e}", self.port);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        };
        self.shut = CancellationToken::new();
        let (target, shut) = (self.target, self.shut.clone());
        self.accept = Some(tokio::spawn(async move {
            loop {
                let mut client = tokio::select! {
                    _ = shut.cancelled() => return,
                    accepted = listener.accept() => match accepted {
                        Ok((c, _)) => c,
                        Err(_) => continue,
                    },
                };
                let shut = shut.clone();
                tokio::spawn(async move {
                    let Ok(mut server) =
                        tokio::net::TcpStream::connect(("127.0.0.1", target)).await
                    else {
                        return;
                    };
                    tokio::select! {
                        _ = shut.cancelled() => {}
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                    }
                });
            }
        }));
    }

    /// Returns once the gate no longer listens.
    async fn shut(&mut self) {
        self.shut.cancel();
        if let Some(a) = self.accept.take() {
            let _ = a.await;
        }
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        self.shut.cancel();
    }
}

/// What this proves: one relay lives through an outage that hits it half-way through a
/// backlog, with `PublishBatch` calls in flight, and recovers on its own. The calls in flight
/// lose their answer and new ones are refused, the circuit opens, nothing ends `failed`; once
/// the service answers again every message arrives, at least once, each key's first deliveries
/// in order, and each is recorded published once.
///
/// moto keeps everything in memory, so its restart loses the topic, the queue, the subscription
/// and the messages in the queue, none of which a real SNS loses. The relay reaches moto through
/// a [`Gate`], which is shut first (to the relay, that is the crash); the reader then takes
/// everything moto accepted, moto is killed and started again, the test makes the topic, the
/// queue and the subscription anew under the same names, and only then opens the gate. A relay
/// let in earlier could publish to a topic without its subscription, which SNS accepts and
/// drops: a loss by SNS's design, not the relay's.
#[test]
fn relay_lives_through_a_private_moto_restart_mid_stream_and_delivers_everything_in_key_order() {
    run(async {
        let mut moto = PrivateMoto::start();
        let mut gate = Gate::start(moto.port()).await;
        let name = format!("{}.fifo", outbox_testkit::unique_name("outbox_midstream"));
        let mut reader = topic_with_queue(&moto.endpoint(), &name).await;

        let w = World::with_stream(false).await;
        let mut cfg = relay_config(&w, &name);
        // A publish deadline (a third of the lease) that the 1 s ack timeout fits in.
        cfg.lease = Duration::from_secs(6);
        // The relay records a claimed batch published once all of it is: small batches, so the
        // outage comes with much of the backlog still to go.
        cfg.batch_size = 40;
        let url = format!("{}&ack_timeout=1s", sns_url(&gate.endpoint()));
        let (ks, per_key) = (10, 40);
        let d = Backlog::start(w, Arc::new(sink(&url).await), cfg, ks, per_key).await;
        d.publishing(100).await;
        gate.shut().await;
        let before = d.outage(Duration::from_secs(30)).await;
        // Everything recorded published is in the queue; what moto accepted while its answer
        // was cut may be too (the relay sends it again: a duplicate, allowed). Read until the
        // queue is empty, so that nothing moto accepted is lost with its restart.
        let mut got = read_distinct(&mut reader, before as usize, Duration::from_secs(30)).await;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let more = reader.poll(Duration::from_secs(1)).await.delivered;
            if more.is_empty() {
                break;
            }
            got.extend(more);
            assert!(Instant::now() < deadline, "the queue never emptied");
        }

        moto.down();
        moto.up();
        let mut reader = topic_with_queue(&moto.endpoint(), &name).await;
        gate.open().await;
        let (w, most) = d.finish(Duration::from_secs(45)).await;
        read_more(&mut reader, &mut got, ks * per_key, Duration::from_secs(30)).await;
        let dups = assert_all_arrived_in_key_order(&got, ks, per_key);
        eprintln!(
            "{before} of {} published before the outage was seen; a call caught by it held \
             {most} messages; {dups} deliveries were duplicates",
            ks * per_key
        );
        w.drop_all().await;
    });
}
