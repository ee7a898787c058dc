//! What is particular to the HTTP webhook sink, against a webhook receiver (a real HTTP server
//! on 127.0.0.1, in the test process, checking Standard Webhooks signatures): the signature
//! headers, a receiver refusing another secret's signature, and `Retry-After`. What every sink
//! must do is the conformance suite's (`outbox-sinks/tests/conformance.rs`, modules `http` and
//! `http_batch`).

#![allow(clippy::unwrap_used)]

use crate::common;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::World;
use outbox_core::Store;
use outbox_sinks::http::{Behaviour, HttpConfig, HttpReader, HttpReceiver, HttpSink};
use outbox_testkit::relay::{interleaved, keys, read_distinct, wait_failed, RunningRelay};

/// The headers of one request, as the receiver saw them.
type Headers = Vec<(String, String)>;

/// A Standard Webhooks secret (16 random bytes, base64).
const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

fn key() -> Vec<u8> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD
        .decode(SECRET.trim_start_matches("whsec_"))
        .unwrap()
}

/// The sink for `receiver_url`, signing with `secret`; the test relay's publish deadline is a
/// third of its 3 s lease: the response wait fits.
fn sink(receiver_url: &str, secret: &str) -> Arc<HttpSink> {
    let url = format!("{receiver_url}#ack_timeout=800ms&secret={secret}");
    Arc::new(HttpSink::connect(HttpConfig::from_url(&url).unwrap()).unwrap())
}

async fn receiver(behaviour: Option<Behaviour>) -> HttpReceiver {
    HttpReceiver::start(&outbox_testkit::unique_name("hook"), Some(key()), behaviour)
        .await
        .unwrap()
}

/// A request carries the Standard Webhooks headers (the message id, a timestamp, a `v1`
/// signature the receiver checked; it refuses anything else with 401) and the rendered
/// destination in the path and in `outbox-destination`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_is_posted_signed_with_the_standard_webhooks_headers() {
    let w = World::with_stream(false).await;
    let seen: Arc<Mutex<Vec<Headers>>> = Arc::default();
    let log = seen.clone();
    let r = receiver(Some(Arc::new(move |req| {
        log.lock().unwrap().push(req.headers.to_vec());
        None
    })))
    .await;
    let m = common::payment();
    w.store().insert(std::slice::from_ref(&m)).await.unwrap();
    let relay = RunningRelay::start(
        w.dyn_store(),
        sink(&r.url(), SECRET),
        w.relay_config_to("payments/{aggregate_type}.{event_type}"),
    );
    w.wait_drained(Duration::from_secs(20)).await;
    relay.stop().await;
    let mut reader = HttpReader::new(r);
    let got = read_distinct(&mut reader, 1, Duration::from_secs(30)).await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].destination, "payments/payment.created");
    assert_eq!(
        got[0].header("outbox-destination"),
        Some("payments/payment.created")
    );
    let headers = seen.lock().unwrap()[0].clone();
    let h = |n: &str| headers.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
    assert_eq!(h("webhook-id"), Some(m.id.to_string()));
    let ts: i64 = h("webhook-timestamp").unwrap().parse().unwrap();
    assert!((chrono::Utc::now().timestamp() - ts).abs() < 60);
    assert!(h("webhook-signature").unwrap().starts_with("v1,"));
    assert_eq!(h("content-type").as_deref(), Some("application/json"));
    w.drop_all().await;
}

/// Signed with another secret: the receiver refuses it (401), the row ends `failed` after its
/// budget naming the status, and the error never shows the secret.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signature_the_receiver_refuses_fails_the_row_without_showing_the_secret() {
    let w = World::with_stream(false).await;
    let r = receiver(None).await;
    w.store()
        .insert(&interleaved(&keys("k", 1), 0..1))
        .await
        .unwrap();
    let mut cfg = w.relay_config_to("orders");
    cfg.retry.max_attempts = 2;
    let relay = RunningRelay::start(
        w.dyn_store(),
        sink(&r.url(), "whsec_QUJDREVGR0hJSktMTU5PUFFSU1RVVldY"),
        cfg,
    );
    let failed = wait_failed(w.dyn_store().as_ref(), 1, Duration::from_secs(30)).await;
    relay.stop().await;
    let error = failed[0].last_error.clone().unwrap_or_default();
    assert!(error.contains("401"), "{error}");
    assert!(
        !error.contains("QUJDREVG"),
        "no secret in the error: {error}"
    );
    assert_eq!(failed[0].attempts, 2);
    assert!(r.stats().bad_signatures.load(Ordering::Relaxed) >= 2);
    w.drop_all().await;
}

/// A 503 with `Retry-After: 2` is retried no sooner than it asks, though the relay's own
/// backoff (20–200 ms here) is far shorter.
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
        .insert(&interleaved(&keys("k", 1), 0..1))
        .await
        .unwrap();
    let relay = RunningRelay::start(
        w.dyn_store(),
        sink(&r.url(), SECRET),
        w.relay_config_to("orders"),
    );
    w.wait_drained(Duration::from_secs(20)).await;
    relay.stop().await;
    let a = attempts.lock().unwrap().clone();
    assert_eq!(a.len(), 2, "one refusal, one success");
    assert!(
        a[1] - a[0] >= Duration::from_millis(1900),
        "retried after {:?}, before the 2 s Retry-After",
        a[1] - a[0]
    );
    let mut reader = HttpReader::new(r);
    assert_eq!(
        read_distinct(&mut reader, 1, Duration::from_secs(30))
            .await
            .len(),
        1
    );
    w.drop_all().await;
}
