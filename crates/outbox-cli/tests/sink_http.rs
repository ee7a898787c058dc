//! The HTTP webhook sink end to end: PostgreSQL, the relay, and a webhook receiver (a real HTTP
//! server on 127.0.0.1, in the test process, checking Standard Webhooks signatures) that
//! answers as receiving applications do: 2xx, a validation error, 413, 503 with `Retry-After`,
//! or no listener at all.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::outage::{assert_all_arrived_in_key_order, read_distinct, Backlog};
use common::World;
use outbox_core::{DestinationTemplate, Store};
use outbox_relay::{CircuitState, Relay, RelayConfig};
use outbox_sinks::http::{Behaviour, HttpConfig, HttpReader, HttpReceiver, HttpSink};
use outbox_sinks::read::{read_until, Delivered, Reader};
use tokio_util::sync::CancellationToken;

/// A request as the receiver saw it: the destination and the headers.
type Request = (String, Vec<(String, String)>);

/// A Standard Webhooks secret (16 random bytes, base64).
const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

fn key() -> Vec<u8> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD
        .decode(SECRET.trim_start_matches("whsec_"))
        .unwrap()
}

/// The test relay's publish deadline is a third of its 3 s lease: the response wait fits.
fn sink(receiver_url: &str, options: &str) -> Arc<HttpSink> {
    let url = format!("{receiver_url}#ack_timeout=800ms&secret={SECRET}{options}");
    Arc::new(HttpSink::connect(HttpConfig::from_url(&url).unwrap()).unwrap())
}

fn spawn(relay: Relay) -> (CancellationToken, tokio::task::JoinHandle<()>) {
    let stop = CancellationToken::new();
    let h = tokio::spawn(relay.run(stop.clone()));
    (stop, h)
}

fn config(w: &World, destination: &str) -> RelayConfig {
    let mut cfg = w.relay_config();
    cfg.destination = DestinationTemplate::parse(destination).unwrap();
    cfg
}

async fn receiver(behaviour: Option<Behaviour>) -> HttpReceiver {
    HttpReceiver::start(&outbox_testkit::unique_name("hook"), Some(key()), behaviour)
        .await
        .unwrap()
}

async fn read_n(reader: &mut dyn Reader, n: usize) -> Vec<Delivered> {
    let mut got = read_until(reader, Duration::from_secs(30), |d| {
        d.iter().map(|m| m.id).collect::<HashSet<_>>().len() >= n
    })
    .await
    .delivered;
    got.extend(reader.poll(Duration::from_millis(300)).await.delivered);
    got
}

fn key_order(got: &[Delivered]) -> HashMap<String, u64> {
    common::assert_key_order(got.iter().map(|d| {
        let n = serde_json::from_slice::<serde_json::Value>(&d.payload).unwrap()["n"]
            .as_u64()
            .unwrap();
        (d.id.to_string(), d.key.clone(), n)
    }))
}

async fn failed_rows(w: &World) -> HashMap<String, (String, i32)> {
    sqlx::query_as::<_, (String, String, i32)>(&w.schema.render(
        "SELECT aggregate_id, last_error, attempts FROM {schema}.outbox_parked WHERE state = 'failed'",
    ))
    .fetch_all(&w.pool)
    .await
    .unwrap()
    .into_iter()
    .map(|(k, e, a)| (k, (e, a)))
    .collect()
}

async fn wait_failed(w: &World, n: i64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while w.stats().await.failed < n {
        assert!(
            Instant::now() < deadline,
            "messages never ended failed: {:?}",
            w.stats().await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_is_posted_signed_with_its_headers_destination_and_payload() {
    let w = World::with_stream(false).await;
    let seen: Arc<Mutex<Vec<Request>>> = Arc::default();
    let log = seen.clone();
    let r = receiver(Some(Arc::new(move |req| {
        log.lock()
            .unwrap()
            .push((req.destination.to_string(), req.headers.to_vec()));
        None
    })))
    .await;
    sqlx::query(&w.schema.render(
        "INSERT INTO {schema}.outbox (aggregate_type, aggregate_id, event_type, payload, headers)
         VALUES ('payment', 'p-42', 'created', '{\"amount\": 1000}', '{\"traceparent\": \"00-1-2-01\"}')",
    ))
    .execute(&w.pool)
    .await
    .unwrap();
    let id: uuid::Uuid = sqlx::query_scalar(&w.schema.render("SELECT id FROM {schema}.outbox"))
        .fetch_one(&w.pool)
        .await
        .unwrap();
    let (stop, h) = spawn(Relay::new(
        w.dyn_store(),
        sink(&r.url(), ""),
        config(&w, "payments/{aggregate_type}.{event_type}"),
    ));
    w.wait_drained(Duration::from_secs(20)).await;
    stop.cancel();
    h.await.unwrap();
    let mut reader = HttpReader::new(r);
    let got = read_n(&mut reader, 1).await;
    assert_eq!(got.len(), 1);
    let m = &got[0];
    assert_eq!(m.id, id);
    assert_eq!(
        m.destination, "payments/payment.created",
        "the path carries the destination"
    );
    assert_eq!(m.key, "p-42");
    assert_eq!(m.header("outbox-event-type"), Some("created"));
    assert_eq!(m.header("traceparent"), Some("00-1-2-01"));
    assert_eq!(
        m.header("outbox-destination"),
        Some("payments/payment.created")
    );
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&m.payload).unwrap(),
        serde_json::json!({"amount": 1000})
    );
    // Standard Webhooks headers: the message id, a timestamp, a v1 signature the receiver
    // checked (it refuses anything else with 401).
    let (_, headers) = seen.lock().unwrap()[0].clone();
    let h = |n: &str| headers.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
    assert_eq!(h("webhook-id"), Some(id.to_string()));
    let ts: i64 = h("webhook-timestamp").unwrap().parse().unwrap();
    assert!((chrono::Utc::now().timestamp() - ts).abs() < 60);
    assert!(h("webhook-signature").unwrap().starts_with("v1,"));
    assert_eq!(h("content-type").as_deref(), Some("application/json"));
    w.drop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_key_keeps_its_order_one_message_per_request_and_in_batches() {
    for options in ["", "&mode=batch&max_batch=37"] {
        let w = World::with_stream(false).await;
        let r = receiver(None).await;
        let (keys, per_key) = (20, 50);
        w.store()
            .insert(&common::interleaved(&common::keys("k", keys), 0..per_key))
            .await
            .unwrap();
        let (stop, h) = spawn(Relay::new(
            w.dyn_store(),
            sink(&r.url(), options),
            config(&w, "orders"),
        ));
        w.wait_drained(Duration::from_secs(60)).await;
        stop.cancel();
        h.await.unwrap();
        let mut reader = HttpReader::new(r);
        let got = read_n(&mut reader, keys * per_key).await;
        assert_eq!(got.len(), keys * per_key, "each message once ({options})");
        let per = key_order(&got);
        assert_eq!(per.len(), keys);
        assert!(per.values().all(|&n| n as usize == per_key));
        assert!(got.iter().all(|d| d.destination == "orders"));
        w.drop_all().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_4xx_and_a_413_fail_with_their_reasons_a_bad_signature_too_and_others_flow() {
    let w = World::with_stream(false).await;
    // The receiving application validates: `amount` must be positive (422), bodies over 1 KiB
    // are too large (413).
    let r = receiver(Some(Arc::new(|req| {
        let v: serde_json::Value = serde_json::from_slice(req.body).unwrap_or_default();
        if req.body.len() > 1024 {
            Some((413, vec![]))
        } else if v["amount"].as_i64().is_some_and(|a| a <= 0) {
            Some((422, vec![]))
        } else {
            None
        }
    })))
    .await;
    sqlx::query(&w.schema.render(
        "INSERT INTO {schema}.outbox (aggregate_type, aggregate_id, event_type, payload, headers)
         VALUES ('order', 'negative', 'placed', '{\"amount\": -5}', '{}'),
                ('order', 'big', 'placed', $1::jsonb, '{}'),
                ('order', 'good', 'placed', '{\"n\": 0, \"amount\": 1}', '{}'),
                ('order', 'good', 'placed', '{\"n\": 1, \"amount\": 1}', '{}')",
    ))
    .bind(serde_json::json!({ "blob": "x".repeat(4096) }).to_string())
    .execute(&w.pool)
    .await
    .unwrap();
    let mut cfg = config(&w, "orders");
    cfg.retry.max_attempts = 2;
    let relay = Relay::new(w.dyn_store(), sink(&r.url(), ""), cfg);
    let breaker = relay.breaker();
    let (stop, h) = spawn(relay);
    wait_failed(&w, 2).await;
    w.wait_drained(Duration::from_secs(20)).await;
    assert_eq!(
        breaker.snapshot().0,
        CircuitState::Closed,
        "a 4xx is no outage"
    );
    stop.cancel();
    h.await.unwrap();
    let errors = failed_rows(&w).await;
    let (negative, attempts) = &errors["negative"];
    assert!(negative.contains("422"), "{negative}");
    assert_eq!(*attempts, 2, "a rejection spends its budget");
    let (big, attempts) = &errors["big"];
    assert!(big.contains("413"), "{big}");
    assert_eq!(*attempts, 1, "too large fails at once");
    let mut reader = HttpReader::new(r);
    let got = read_n(&mut reader, 2).await;
    assert_eq!(key_order(&got)["good"], 2);
    w.drop_all().await;

    // Signed with another secret: the receiver refuses it (401), the row fails, naming it.
    let w = World::with_stream(false).await;
    let r = receiver(None).await;
    w.store()
        .insert(&common::interleaved(&common::keys("k", 1), 0..1))
        .await
        .unwrap();
    let other = format!(
        "{}#ack_timeout=800ms&secret=whsec_{}",
        r.url(),
        "QUJDREVGR0hJSktMTU5PUFFSU1RVVldY"
    );
    let mut cfg = config(&w, "orders");
    cfg.retry.max_attempts = 2;
    let (stop, h) = spawn(Relay::new(
        w.dyn_store(),
        Arc::new(HttpSink::connect(HttpConfig::from_url(&other).unwrap()).unwrap()),
        cfg,
    ));
    wait_failed(&w, 1).await;
    stop.cancel();
    h.await.unwrap();
    let errors = failed_rows(&w).await;
    assert!(errors["k0"].0.contains("401"), "{:?}", errors["k0"]);
    assert!(
        !errors["k0"].0.contains("QUJDREVG"),
        "no secret in the error"
    );
    assert!(r.stats().bad_signatures.load(Ordering::Relaxed) >= 2);
    w.drop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_503_with_retry_after_is_retried_no_sooner_than_it_asks() {
    let w = World::with_stream(false).await;
    let attempts: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let log = attempts.clone();
    let r = receiver(Some(Arc::new(move |_| {
        let mut a = log.lock().unwrap();
        a.push(Instant::now());
        (a.len() == 1).then(|| (503, vec![("retry-after".to_string(), "2".to_string())]))
    })))
    .await;
    w.store()
        .insert(&common::interleaved(&common::keys("k", 1), 0..1))
        .await
        .unwrap();
    // The relay's own backoff (20–200 ms here) is far shorter than the 2 s asked for.
    let (stop, h) = spawn(Relay::new(
        w.dyn_store(),
        sink(&r.url(), ""),
        config(&w, "orders"),
    ));
    w.wait_drained(Duration::from_secs(20)).await;
    stop.cancel();
    h.await.unwrap();
    let a = attempts.lock().unwrap().clone();
    assert_eq!(a.len(), 2, "one refusal, one success");
    assert!(
        a[1] - a[0] >= Duration::from_millis(1900),
        "retried after {:?}, before the 2 s Retry-After",
        a[1] - a[0]
    );
    let mut reader = HttpReader::new(r);
    assert_eq!(read_n(&mut reader, 1).await.len(), 1);
    w.drop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_that_is_down_then_up_opens_and_closes_the_circuit_and_loses_nothing() {
    let w = World::with_stream(false).await;
    // A port with nothing listening: connection refused, as for a receiver being deployed.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let prefix = outbox_testkit::unique_name("hook");
    let url = format!("http://127.0.0.1:{port}/{prefix}/{{destination}}");
    let (keys, per_key) = (10, 30);
    w.store()
        .insert(&common::interleaved(&common::keys("k", keys), 0..per_key))
        .await
        .unwrap();
    let mut cfg = config(&w, "orders");
    cfg.retry.max_attempts = 1000;
    let relay = Relay::new(w.dyn_store(), sink(&url, ""), cfg);
    let breaker = relay.breaker();
    let (stop, h) = spawn(relay);
    let deadline = Instant::now() + Duration::from_secs(20);
    while breaker.snapshot().0 != CircuitState::Open {
        assert!(Instant::now() < deadline, "the circuit never opened");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let up = Arc::new(AtomicBool::new(true));
    let served = Arc::new(AtomicUsize::new(0));
    let (u, s) = (up.clone(), served.clone());
    let r = HttpReceiver::start_at(
        port,
        &prefix,
        Some(key()),
        Some(Arc::new(move |_| {
            s.fetch_add(1, Ordering::Relaxed);
            (!u.load(Ordering::Relaxed)).then(|| (503, vec![]))
        })),
    )
    .await
    .unwrap();
    w.wait_drained(Duration::from_secs(60)).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while breaker.snapshot().0 != CircuitState::Closed {
        assert!(Instant::now() < deadline, "the circuit never closed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.cancel();
    h.await.unwrap();
    assert_eq!(w.stats().await.failed, 0, "an outage fails nothing");
    let mut reader = HttpReader::new(r);
    let got = read_n(&mut reader, keys * per_key).await;
    let per = key_order(&got);
    assert_eq!(per.len(), keys);
    assert!(per.values().all(|&n| n as usize == per_key));
    assert!(served.load(Ordering::Relaxed) >= keys * per_key);
    w.drop_all().await;
}

/// The endpoint goes down (answers 503, as a receiving application behind its load balancer
/// does while it is down) while the relay is half-way through a backlog, then comes back. The
/// requests it refuses are the ones that arrive while it is down (one already being answered
/// still gets its 200). A request the endpoint refused is sent again, and a message of a key
/// waits for the ones before it, so every message arrives and each key's first deliveries are
/// in order; one message per request and in batches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_down_mid_stream_loses_nothing_and_keeps_key_order() {
    for options in ["", "&mode=batch&max_batch=7"] {
        let w = World::with_stream(false).await;
        let up = Arc::new(AtomicBool::new(true));
        let u = up.clone();
        let r = receiver(Some(Arc::new(move |_| {
            (!u.load(Ordering::SeqCst)).then(|| (503, vec![]))
        })))
        .await;
        let (keys, per_key) = (20, 150);
        let cfg = config(&w, "orders");
        let d = Backlog::start(w, sink(&r.url(), options), cfg, keys, per_key).await;
        d.publishing(500).await;
        up.store(false, Ordering::SeqCst);
        let before = d.outage(Duration::from_secs(30)).await;
        up.store(true, Ordering::SeqCst);
        let (w, most) = d.finish(Duration::from_secs(45)).await;
        let mut reader = HttpReader::new(r);
        let got = read_distinct(&mut reader, keys * per_key, Duration::from_secs(30)).await;
        let dups = assert_all_arrived_in_key_order(&got, keys, per_key);
        eprintln!(
            "({options}) {before} of {} published before the outage was seen; a call caught by \
             it held {most} messages; {dups} deliveries were duplicates",
            keys * per_key
        );
        w.drop_all().await;
    }
}
