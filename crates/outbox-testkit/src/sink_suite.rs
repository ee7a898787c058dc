//! The sink conformance suite: behaviour every sink must show against its real broker, written
//! once and run per sink (after vector's sink compliance tests and river's driver suite). A
//! sink's module in `outbox-sinks/tests/conformance.rs` expands
//! [`sink_conformance_suite!`](crate::sink_conformance_suite) with its [`SinkFixture`] and a
//! store factory, and gets one `#[tokio::test]` per case.
//!
//! Every case publishes through a relay running in-process (or calls the sink directly) and
//! asserts what an **independent reader** of the broker got, and what the store recorded. New
//! sink behaviour goes here, not into one sink's tests.

// Test code: a failed expectation should panic with its message.
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use outbox_core::sink::{
    HEADER_AGGREGATE_ID, HEADER_AGGREGATE_TYPE, HEADER_EVENT_TYPE, HEADER_MESSAGE_ID,
};
use outbox_core::{NewMessage, Sink, SinkErrorKind, Store};
use outbox_sinks::read::{Reader, Scratch};
use uuid::Uuid;

use crate::process::PrivateServer;
use crate::proxy::TcpProxy;
use crate::relay::{
    assert_all_arrived, assert_increasing_per_key, failed_one, ids, interleaved, keys, read_ids,
    relay_config, stats, wait_drained, wait_failed, wait_stats, Backlog, Probe, RunningRelay,
};

/// The ack timeout the cases give a sink by default (see [`SinkFixture::ack_timeout`]): it
/// leaves a loaded machine room before a slow answer counts as an outage.
pub const ACK_TIMEOUT: Duration = Duration::from_secs(2);

/// Generous limits: the cases wait for outcomes, they do not time them.
const WAIT: Duration = Duration::from_secs(90);

/// What a case needs to know about one sink and its broker.
#[async_trait]
pub trait SinkFixture: Send + Sync {
    /// A fresh destination on the shared broker, with a random suffix, and its reader.
    async fn scratch(&self, tag: &str) -> Scratch;

    /// The sink for `url` (a scratch's `sink_url` with the case's options added).
    async fn sink(&self, url: &str) -> Arc<dyn Sink> {
        outbox_sinks::connect(url)
            .await
            .unwrap_or_else(|e| panic!("connect {url}: {e}"))
    }

    /// Whether the broker keeps each key's order (a standard SQS queue does not): the cases
    /// check order only then.
    fn ordered(&self) -> bool {
        true
    }

    /// How to provoke a message over the sink's or broker's limit; `None` where there is none.
    fn oversized(&self) -> Option<Oversized> {
        None
    }

    /// A destination the broker refuses, and a scratch beside it that it accepts; `None`
    /// where the broker cannot refuse a message.
    async fn rejection(&self, tag: &str) -> Option<Rejection> {
        let _ = tag;
        None
    }

    /// A broker of the test's own it can stop, start, freeze and thaw, and a scratch on it;
    /// `None` where there is no broker to stop.
    async fn private(&self, tag: &str) -> Option<Private> {
        let _ = tag;
        None
    }

    /// The sink's ack timeout in every case; the relay's lease is four and a half times it,
    /// so the publish deadline (a quarter more than the ack timeout) fits in its third.
    fn ack_timeout(&self) -> Duration {
        ACK_TIMEOUT
    }

    /// Keys and messages per key of the order case: 20 × 50. moto, whose FIFO send slows
    /// down with the queue's depth (its dedupe scans the queue), takes 8 × 25.
    fn order_scale(&self) -> (usize, usize) {
        (20, 50)
    }

    /// The backlog of the outage case: keys, messages per key, how many are published before
    /// the broker goes down, and the relay's batch size. A slow broker (moto) takes a smaller
    /// one, so the case ends in reasonable time, still with calls in flight at the outage.
    fn backlog(&self) -> Scale {
        Scale {
            keys: 20,
            per_key: 150,
            down_after: 500,
            batch_size: 500,
        }
    }

    /// Whether the private broker may lose writes it acknowledged when it is killed (tansu):
    /// the outage case then checks order only, not that everything arrived.
    fn loses_acknowledged_writes(&self) -> bool {
        false
    }
}

/// The size of the outage case's backlog: see [`SinkFixture::backlog`].
pub struct Scale {
    /// Keys.
    pub keys: usize,
    /// Messages per key.
    pub per_key: usize,
    /// Messages recorded published when the broker goes down.
    pub down_after: i64,
    /// The relay's batch size.
    pub batch_size: usize,
}

/// How to make a message too large.
pub struct Oversized {
    /// A sink URL option lowering the limit (`max_message_size=1KiB`), or none.
    pub option: Option<&'static str>,
    /// Bytes of padding that put a message over the limit.
    pub bytes: usize,
    /// What the error must contain: the limit's name or value.
    pub names: &'static str,
}

/// A destination the broker refuses, and a scratch on the same broker that it accepts.
pub struct Rejection {
    /// Where the other messages go.
    pub scratch: Scratch,
    /// The refused destination (a row's topic override).
    pub destination: String,
    /// What the error must contain, among them the destination.
    pub names: Vec<String>,
    /// A private broker the scratch lives on, kept running for the case.
    pub broker: Option<PrivateServer>,
}

/// A broker of the test's own, and a scratch on it.
pub struct Private {
    /// The broker, or the proxy in front of it.
    pub broker: Box<dyn Outage>,
    /// The destination on it, reached through the broker's (or proxy's) URL.
    pub scratch: Scratch,
}

/// What the outage cases do to a broker. Blocking: the cases call it from
/// `tokio::task::block_in_place`.
pub trait Outage: Send {
    /// The broker goes away: connections drop, new ones are refused.
    fn stop(&mut self);
    /// It comes back where it was.
    fn start(&mut self);
    /// It stops answering, connections open.
    fn freeze(&mut self);
    /// It answers again.
    fn thaw(&mut self);
}

impl Outage for PrivateServer {
    fn stop(&mut self) {
        PrivateServer::stop(self);
    }
    fn start(&mut self) {
        PrivateServer::start(self);
    }
    fn freeze(&mut self) {
        PrivateServer::freeze(self);
    }
    fn thaw(&mut self) {
        PrivateServer::thaw(self);
    }
}

/// A proxy in front of a broker that keeps its state (moto, whose restart would lose every
/// queue SQS never loses; the in-process webhook receiver): down is every connection dropped
/// and refused, frozen is every byte held.
impl Outage for TcpProxy {
    fn stop(&mut self) {
        self.down();
    }
    fn start(&mut self) {
        self.open();
    }
    fn freeze(&mut self) {
        self.go_silent();
    }
    fn thaw(&mut self) {
        self.open();
    }
}

/// `url` with `options` added: after `#` for a webhook (its query belongs to the endpoint),
/// after `?` otherwise.
pub fn with_options(url: &str, options: &[&str]) -> String {
    let mark = if url.starts_with("http") { '#' } else { '?' };
    let mut out = url.to_string();
    for o in options.iter().filter(|o| !o.is_empty()) {
        out.push(if out.contains(mark) { '&' } else { mark });
        out.push_str(o);
    }
    out
}

/// `url` with the cases' ack timeout (for sinks that have one) and `extra` options.
fn sink_url(f: &dyn SinkFixture, url: &str, extra: Option<&str>) -> String {
    let url = outbox_sinks::with_default_ack_timeout(url, f.ack_timeout());
    with_options(&url, &[extra.unwrap_or("")])
}

/// The tests' relay config for `destination`, with a lease that fits the fixture's ack timeout.
fn config(f: &dyn SinkFixture, destination: &str) -> outbox_relay::RelayConfig {
    let mut cfg = relay_config(destination);
    cfg.lease = cfg.lease.max(f.ack_timeout() * 9 / 2);
    cfg
}

/// Runs `f` on this worker thread, letting the runtime move its other tasks elsewhere: for
/// the blocking broker controls.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

/// Expands to one `#[tokio::test]` per sink conformance case in a module `$name`, each with a
/// fresh fixture from `$fixture()` and a fresh store from `$store().await` (a
/// [`conformance::Fixture`](crate::conformance::Fixture), torn down after the case).
/// `except [case, …]` leaves out cases that cannot apply to the sink; say why beside it.
#[macro_export]
macro_rules! sink_conformance_suite {
    ($name:ident, $fixture:path, $store:path $(; except [$($except:ident),* $(,)?])?) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            $(
                // A misspelt exception does not compile.
                $(#[allow(unused_imports)] use $crate::sink_suite::$except as _;)*
            )?
            $crate::__sink_cases!([$] $fixture, $store; [$($($except)*)?];
                round_trip_with_ids_and_headers
                per_key_order_over_1000_messages
                oversized_message_fails_at_once
                rejection_does_not_open_the_circuit
                broker_down_mid_stream_with_messages_in_flight
                deadline
            );
        }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __sink_cases {
    ([$d:tt] $fixture:path, $store:path; [$($except:ident)*]; $($case:ident)*) => {
        // A macro that expands to nothing for an excepted case and to the test otherwise:
        // its rules match the excepted names literally (`$d` is a `$` passed in, so this
        // macro can declare its own metavariables).
        macro_rules! __sink_case_unless_excepted {
            $( ($except) => {}; )*
            ($d case:ident) => {
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $d case() {
                    let fixture = $fixture();
                    let store: $crate::conformance::Fixture = $store().await;
                    $crate::sink_suite::$d case(&fixture, store.store.clone()).await;
                    store.teardown.await;
                }
            };
        }
        $( __sink_case_unless_excepted!($case); )*
    };
}

/// The payload of message `n`: text beyond ASCII, quotes, nested values.
fn rich_payload(n: usize) -> serde_json::Value {
    serde_json::json!({
        "n": n,
        "text": "café ✓ \"quoted\" \\ back",
        "nested": { "list": [1, 2.5, null, true], "empty": {} },
    })
}

/// Every message, sent by a relay, comes back to an independent reader once, with its id, its
/// rendered destination, its key, its payload byte for byte as the sink was given it, the
/// relay's headers and the row's own (eight on some rows, more than some brokers carry one by
/// one), and nothing ends `failed`.
pub async fn round_trip_with_ids_and_headers(f: &dyn SinkFixture, store: Arc<dyn Store>) {
    let mut s = f.scratch("roundtrip").await;
    let msgs: Vec<NewMessage> = interleaved(&keys("order-", 4), 0..5)
        .into_iter()
        .enumerate()
        .map(|(i, mut m)| {
            m.payload = rich_payload(i);
            m = m.header("traceparent", format!("00-{i:032x}-00f067aa0ba902b7-01"));
            if i % 4 == 0 {
                (1..8).fold(m, |m, h| m.header(format!("x-h{h}"), format!("v{h}-{i}")))
            } else {
                m
            }
        })
        .collect();
    store.insert(&msgs).await.unwrap();
    let probe = Arc::new(Probe::new(f.sink(&sink_url(f, &s.sink_url, None)).await));
    let relay = RunningRelay::start(store.clone(), probe.clone(), config(f, &s.destination));
    wait_drained(store.as_ref(), WAIT).await;
    relay.stop().await;

    let got = read_ids(s.reader.as_mut(), &ids(&msgs), WAIT).await;
    assert_eq!(got.len(), msgs.len(), "each message exactly once: {got:?}");
    let by_id: HashMap<Uuid, &NewMessage> = msgs.iter().map(|m| (m.id, m)).collect();
    let handed = probe.handed();
    for d in &got {
        let m = by_id[&d.id];
        let e = &handed[&d.id];
        assert_eq!(d.destination, e.destination, "{}", d.id);
        assert_eq!(d.key, m.aggregate_id, "{}", d.id);
        assert_eq!(d.payload, e.payload, "the payload, byte for byte");
        assert_eq!(
            serde_json::from_slice::<serde_json::Value>(&d.payload).unwrap(),
            m.payload
        );
        let id = m.id.to_string();
        for (k, v) in [
            (HEADER_MESSAGE_ID, id.as_str()),
            (HEADER_EVENT_TYPE, "changed"),
            (HEADER_AGGREGATE_TYPE, "order"),
            (HEADER_AGGREGATE_ID, m.aggregate_id.as_str()),
        ] {
            assert_eq!(d.header(k), Some(v), "header {k} of {id}: {:?}", d.headers);
        }
        for (k, v) in &m.headers {
            assert_eq!(
                d.header(k),
                v.as_str(),
                "header {k} of {id}: {:?}",
                d.headers
            );
        }
    }
    let st = stats(store.as_ref()).await;
    assert_eq!((st.published, st.failed), (msgs.len() as i64, 0), "{st:?}");
    assert!(store.failed(10).await.unwrap().is_empty());
    // Where the broker keeps a log (Kafka), a second reader from the start reads every message
    // again: what `outbox verify` asks before it calls a missing message lost.
    if let Some(mut fresh) = s.reader.fresh_reader().await {
        let again = read_ids(fresh.as_mut(), &ids(&msgs), WAIT).await;
        assert_eq!(
            again.len(),
            msgs.len(),
            "a fresh reader reads all again: {again:?}"
        );
        // Closed before the clean-up deletes the destination.
        drop(fresh);
    }
    s.reader.cleanup().await;
}

/// 20 keys × 50 messages (fewer where [`SinkFixture::order_scale`] says), interleaved, through
/// a relay with two workers: every message arrives exactly once, and each key's messages in
/// order where the broker keeps order.
pub async fn per_key_order_over_1000_messages(f: &dyn SinkFixture, store: Arc<dyn Store>) {
    let mut s = f.scratch("order").await;
    let (key_count, per_key) = f.order_scale();
    let msgs = interleaved(&keys("k", key_count), 0..per_key);
    store.insert(&msgs).await.unwrap();
    let sink = f.sink(&sink_url(f, &s.sink_url, None)).await;
    let relay = RunningRelay::start(store.clone(), sink, config(f, &s.destination));
    wait_drained(store.as_ref(), WAIT * 2).await;
    relay.stop().await;
    let got = read_ids(s.reader.as_mut(), &ids(&msgs), WAIT).await;
    // The count first: an empty read-back must fail, not pass every order check.
    assert_eq!(got.len(), msgs.len(), "complete, no duplicates");
    assert_eq!(assert_all_arrived(&got, key_count, per_key, f.ordered()), 0);
    let st = stats(store.as_ref()).await;
    assert_eq!((st.published, st.failed), (msgs.len() as i64, 0), "{st:?}");
    s.reader.cleanup().await;
}

/// Relays `bad` and `others` (written in that order) until `bad` ended `failed` and every one
/// of `others` arrived once; checks that the circuit never left `Closed` and what the store
/// counts. Returns `bad`'s failed row.
async fn one_fails_while_others_flow(
    store: &Arc<dyn Store>,
    scratch: &mut Scratch,
    sink: Arc<dyn Sink>,
    cfg: outbox_relay::RelayConfig,
    bad: &NewMessage,
    others: &[NewMessage],
) -> outbox_core::FailedMessage {
    store.insert(std::slice::from_ref(bad)).await.unwrap();
    store.insert(others).await.unwrap();
    let relay = RunningRelay::start(store.clone(), sink, cfg);
    let left_closed = relay.watch_breaker();
    let failed = wait_failed(store.as_ref(), 1, WAIT).await;
    let got = read_ids(scratch.reader.as_mut(), &ids(others), WAIT).await;
    wait_drained(store.as_ref(), WAIT).await;
    relay.stop().await;
    assert_eq!(
        got.len(),
        others.len(),
        "the other messages flow, once each"
    );
    assert!(
        !left_closed.load(std::sync::atomic::Ordering::SeqCst),
        "the broker answered: no outage, the circuit must never leave closed"
    );
    let st = stats(store.as_ref()).await;
    assert_eq!(
        (st.published, st.failed),
        (others.len() as i64, 1),
        "{st:?}"
    );
    scratch.reader.cleanup().await;
    failed_one(&failed, bad.id).clone()
}

/// A message over the limit is invalid: it ends `failed` at its first attempt with an error
/// that names the limit, the messages beside it flow, and the circuit never leaves `Closed`.
pub async fn oversized_message_fails_at_once(f: &dyn SinkFixture, store: Arc<dyn Store>) {
    let o = f
        .oversized()
        .expect("the fixture has no limit to exceed: except this case");
    let mut s = f.scratch("big").await;
    let big = NewMessage::new(
        "order",
        "big",
        "placed",
        serde_json::json!({ "n": 0, "pad": "x".repeat(o.bytes) }),
    );
    let sink = f.sink(&sink_url(f, &s.sink_url, o.option)).await;
    let cfg = config(f, &s.destination);
    let small = interleaved(&keys("s", 4), 0..5);
    let row = one_fails_while_others_flow(&store, &mut s, sink, cfg, &big, &small).await;
    assert_eq!(row.attempts, 1, "invalid: failed at once, not retried");
    let error = row.last_error.unwrap_or_default();
    assert!(
        error.contains(o.names),
        "the error names the limit: {error}"
    );
}

/// A message the broker refuses spends exactly its retry budget and ends `failed` with an
/// error naming its destination; the breaker (whose threshold is below the budget) never
/// leaves `Closed`, and the messages for an accepted destination flow meanwhile.
pub async fn rejection_does_not_open_the_circuit(f: &dyn SinkFixture, store: Arc<dyn Store>) {
    let mut r = f
        .rejection("reject")
        .await
        .expect("the fixture's broker cannot refuse: except this case");
    let bad = NewMessage::new("order", "bad", "placed", serde_json::json!({ "n": 0 }))
        .topic(r.destination.clone());
    let mut cfg = config(f, &r.scratch.destination);
    cfg.workers = 1;
    cfg.retry.max_attempts = 4;
    // Fewer failed calls than the budget would open it, if rejections counted.
    cfg.breaker_threshold = 2;
    let sink = f.sink(&sink_url(f, &r.scratch.sink_url, None)).await;
    let good = interleaved(&keys("g", 5), 0..10);
    let row = one_fails_while_others_flow(&store, &mut r.scratch, sink, cfg, &bad, &good).await;
    assert_eq!(row.attempts, 4, "failed after exactly its budget");
    let error = row.last_error.unwrap_or_default();
    for name in &r.names {
        assert!(error.contains(name.as_str()), "`{name}` not in: {error}");
    }
    drop(r.broker);
}

/// The broker is stopped while a relay is half-way through a backlog (20 keys × 150 unless the
/// fixture's [`SinkFixture::backlog`] says otherwise), with a
/// publish call outstanding, and started again: the circuit opens and closes, nothing ends
/// `failed`, every message is recorded published once, and every message arrives (at least
/// once) with each key's first deliveries in order. For a broker that loses writes it
/// acknowledged when killed, only the order: see [`SinkFixture::loses_acknowledged_writes`].
pub async fn broker_down_mid_stream_with_messages_in_flight(
    f: &dyn SinkFixture,
    store: Arc<dyn Store>,
) {
    let Private {
        mut broker,
        mut scratch,
    } = f
        .private("down")
        .await
        .expect("the fixture has no broker to stop: except this case");
    let scale = f.backlog();
    let (key_names, per_key) = (keys("k", scale.keys), scale.per_key);
    let sink = f.sink(&sink_url(f, &scratch.sink_url, None)).await;
    let mut cfg = config(f, &scratch.destination);
    cfg.batch_size = scale.batch_size;
    let d = Backlog::start(store, sink, cfg, &key_names, per_key).await;
    let want = ids(&d.messages);
    d.publishing(scale.down_after).await;
    blocking(|| broker.stop());
    let before = d.outage(WAIT).await;
    blocking(|| broker.start());
    let most = d.finish(WAIT * 2).await;
    let got = read_ids(scratch.reader.as_mut(), &want, WAIT).await;
    if f.loses_acknowledged_writes() {
        let arrived = assert_increasing_per_key(&got);
        // What was published after the outage was seen cannot have been lost by the kill:
        // at least that much arrives (an empty read-back fails here, not passes the order
        // check).
        assert!(
            arrived >= want.len() - before as usize && arrived > 0,
            "{arrived} of {} arrived, {before} published before the outage",
            want.len()
        );
        eprintln!(
            "{arrived} of {} messages read back (the broker lost the rest after acknowledging \
             them); {before} published before the outage was seen; a call it caught held up to \
             {most} messages of one key",
            want.len()
        );
    } else {
        let dups = assert_all_arrived(&got, key_names.len(), per_key, f.ordered());
        eprintln!(
            "{before} of {} published before the outage was seen; a call it caught held up to \
             {most} messages of one key; {dups} deliveries were duplicates",
            want.len()
        );
    }
    scratch.reader.cleanup().await;
    drop(broker);
}

/// A frozen broker (SIGSTOP, or a proxy holding every byte) cannot hang the relay: a direct
/// publish returns within the sink's ack timeout (plus slack for a loaded machine) with every
/// message unavailable, and the relay records a retry within its publish deadline (a third of
/// the lease at most; again with slack), publishing nothing. Thawed, everything arrives, each
/// key in order.
pub async fn deadline(f: &dyn SinkFixture, store: Arc<dyn Store>) {
    const SLACK: Duration = Duration::from_secs(20);
    let Private {
        mut broker,
        mut scratch,
    } = f
        .private("deadline")
        .await
        .expect("the fixture has no broker to freeze: except this case");
    let probe = Arc::new(Probe::new(
        f.sink(&sink_url(f, &scratch.sink_url, None)).await,
    ));
    let cfg = config(f, &scratch.destination);
    let publish_deadline = cfg.publish_deadline(probe.ack_timeout());
    let relay = RunningRelay::start(store.clone(), probe.clone(), cfg);
    // Warm up: connected, a message routed; its envelope is the template of the direct call.
    let key_names = keys("k", 5);
    let first = interleaved(&key_names, 0..2);
    store.insert(&first).await.unwrap();
    wait_drained(store.as_ref(), WAIT).await;
    let template = probe.handed().into_values().next().unwrap();

    blocking(|| broker.freeze());
    if let Some(ack) = probe.ack_timeout() {
        let mut e = template.clone();
        e.id = Uuid::now_v7();
        let started = Instant::now();
        let results = tokio::time::timeout(ack + SLACK, probe.publish(&[e]))
            .await
            .unwrap_or_else(|_| panic!("a publish to a frozen broker outlived {:?}", ack + SLACK));
        assert!(
            results.iter().all(|r| r
                .as_ref()
                .is_err_and(|e| e.kind == SinkErrorKind::Unavailable)),
            "a frozen broker is unavailable: {results:?} after {:?}",
            started.elapsed()
        );
    }
    let published_before = stats(store.as_ref()).await.published;
    let rest = interleaved(&key_names, 2..22);
    store.insert(&rest).await.unwrap();
    let st = wait_stats(
        store.as_ref(),
        "recorded a retry",
        publish_deadline + SLACK,
        |s| s.retrying > 0,
    )
    .await;
    assert_eq!(
        st.published, published_before,
        "nothing is published while the broker is frozen: {st:?}"
    );

    blocking(|| broker.thaw());
    wait_drained(store.as_ref(), WAIT * 2).await;
    relay.stop().await;
    let all: Vec<NewMessage> = first.into_iter().chain(rest).collect();
    let got = read_ids(scratch.reader.as_mut(), &ids(&all), WAIT).await;
    assert_all_arrived(&got, key_names.len(), 22, f.ordered());
    let st = stats(store.as_ref()).await;
    assert_eq!((st.published, st.failed), (all.len() as i64, 0), "{st:?}");
    scratch.reader.cleanup().await;
    drop(broker);
}

/// A reader opened at its first poll: for a broker whose restart reassigns offsets a reader
/// opened before may have passed (tansu), so the case's reader starts after the outage.
pub struct LazyReader {
    open: Option<OpenReader>,
    reader: Option<Box<dyn Reader>>,
    describe: String,
}

type OpenReader = Box<
    dyn FnOnce() -> std::pin::Pin<Box<dyn std::future::Future<Output = Box<dyn Reader>> + Send>>
        + Send,
>;

impl LazyReader {
    /// A reader `open` makes at the first poll or cleanup.
    pub fn new(describe: String, open: OpenReader) -> Self {
        Self {
            open: Some(open),
            reader: None,
            describe,
        }
    }

    async fn get(&mut self) -> &mut Box<dyn Reader> {
        if let Some(open) = self.open.take() {
            self.reader = Some(open().await);
        }
        self.reader.as_mut().unwrap()
    }
}

#[async_trait]
impl Reader for LazyReader {
    async fn poll(&mut self, wait: Duration) -> outbox_sinks::read::Polled {
        self.get().await.poll(wait).await
    }
    fn describe(&self) -> String {
        self.describe.clone()
    }
    async fn cleanup(&mut self) {
        self.get().await.cleanup().await;
    }
}
