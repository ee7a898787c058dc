//! Helpers every sink and relay test shares: workloads, a relay run in-process, waiting for a
//! store or breaker outcome, reading a broker back with its independent reader, and checking
//! what arrived (every message, each key in order).
//!
//! Waits take a limit and panic with what they saw when it passes: tests wait for outcomes
//! with generous limits and assert the outcomes, never how fast they came.

// Test code: a failed expectation should panic with its message.
#![allow(clippy::unwrap_used)]

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use outbox_core::sink::{
    HEADER_AGGREGATE_ID, HEADER_AGGREGATE_TYPE, HEADER_EVENT_TYPE, HEADER_MESSAGE_ID,
};
use outbox_core::{
    DestinationTemplate, Envelope, FailedMessage, NewMessage, Sink, SinkError, Stats, Store,
};
use outbox_relay::{Breaker, CircuitState, Relay, RelayConfig};
use outbox_sinks::read::{read_until, Delivered, Reader};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// `count` keys named `prefix0`, `prefix1`, …
pub fn keys(prefix: &str, count: usize) -> Vec<String> {
    (0..count).map(|i| format!("{prefix}{i}")).collect()
}

/// Messages `n` in `ns` for every key, interleaved (n = 0 of every key, then n = 1, …) so every
/// batch holds many keys and several messages per key. Payload `{"n": n}`.
pub fn interleaved(keys: &[String], ns: std::ops::Range<usize>) -> Vec<NewMessage> {
    ns.flat_map(|n| {
        keys.iter().map(move |k| {
            NewMessage::new("order", k.clone(), "changed", serde_json::json!({ "n": n }))
        })
    })
    .collect()
}

/// The ids of `msgs`.
pub fn ids(msgs: &[NewMessage]) -> HashSet<Uuid> {
    msgs.iter().map(|m| m.id).collect()
}

/// An envelope for `destination` and `key` with payload `{"n": n}` and the relay's four
/// headers, as the relay would hand it to a sink: for tests that call a sink directly.
pub fn envelope(destination: &str, key: &str, n: u64) -> Envelope {
    let id = Uuid::now_v7();
    Envelope {
        id,
        destination: destination.to_string(),
        key: key.to_string(),
        headers: vec![
            (HEADER_MESSAGE_ID.into(), id.to_string()),
            (HEADER_EVENT_TYPE.into(), "changed".into()),
            (HEADER_AGGREGATE_TYPE.into(), "order".into()),
            (HEADER_AGGREGATE_ID.into(), key.to_string()),
        ],
        payload: outbox_core::Bytes::from(serde_json::json!({ "n": n }).to_string()),
        created_at: chrono::Utc::now(),
    }
}

/// A relay config for tests: two workers, fast polls, short backoff (20–200 ms, 10 attempts),
/// `destination`, and a 9 s lease, so a sink's ack timeout of up to 3 s fits in its third.
pub fn relay_config(destination: &str) -> RelayConfig {
    RelayConfig {
        batch_size: 500,
        workers: 2,
        poll_interval: Duration::from_millis(100),
        destination: DestinationTemplate::parse(destination).unwrap(),
        retry: outbox_core::RetryPolicy {
            max_attempts: 10,
            base: Duration::from_millis(20),
            max: Duration::from_millis(200),
        },
        lease: Duration::from_secs(9),
        member_prefix: "test".into(),
        ..RelayConfig::default()
    }
}

/// A relay running in-process on the test's runtime.
pub struct RunningRelay {
    /// Its circuit breaker.
    pub breaker: Arc<Breaker>,
    stop: CancellationToken,
    handle: tokio::task::JoinHandle<()>,
}

impl RunningRelay {
    /// Starts `Relay::new(store, sink, cfg)`.
    pub fn start(store: Arc<dyn Store>, sink: Arc<dyn Sink>, cfg: RelayConfig) -> Self {
        Self::spawn(Relay::new(store, sink, cfg))
    }

    /// Runs a relay built by the caller (routes, metrics).
    pub fn spawn(relay: Relay) -> Self {
        let breaker = relay.breaker();
        let stop = CancellationToken::new();
        let handle = tokio::spawn(relay.run(stop.clone()));
        Self {
            breaker,
            stop,
            handle,
        }
    }

    /// Watches the breaker until [`RunningRelay::stop`]: whether it ever left `Closed`.
    pub fn watch_breaker(&self) -> Arc<AtomicBool> {
        let left = Arc::new(AtomicBool::new(false));
        let (flag, breaker, stop) = (left.clone(), self.breaker.clone(), self.stop.clone());
        tokio::spawn(async move {
            while !stop.is_cancelled() {
                if breaker.snapshot().0 != CircuitState::Closed {
                    flag.store(true, Ordering::SeqCst);
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        });
        left
    }

    /// Whether the relay's task ended (it should only when stopped).
    pub fn is_finished(&self) -> bool {
        self.handle.is_finished()
    }

    /// Stops the relay and waits until it finished (it releases its partitions).
    pub async fn stop(self) {
        self.stop.cancel();
        self.handle.await.unwrap();
    }
}

/// Waits until `breaker` is in state `want`; panics after `limit`.
pub async fn wait_state(breaker: &Breaker, want: CircuitState, limit: Duration) {
    let deadline = Instant::now() + limit;
    while breaker.snapshot().0 != want {
        assert!(
            Instant::now() < deadline,
            "circuit never became {want:?} within {limit:?}: {:?}",
            breaker.snapshot()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The store's counts (panics on a store error).
pub async fn stats(store: &dyn Store) -> Stats {
    store.stats().await.unwrap()
}

/// Waits until `until` holds for the store's counts; returns them. Panics after `limit`.
pub async fn wait_stats(
    store: &dyn Store,
    what: &str,
    limit: Duration,
    until: impl Fn(&Stats) -> bool,
) -> Stats {
    let deadline = Instant::now() + limit;
    loop {
        let s = stats(store).await;
        if until(&s) {
            return s;
        }
        assert!(
            Instant::now() < deadline,
            "never {what} within {limit:?}: {s:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until nothing is pending; panics after `limit`.
pub async fn wait_drained(store: &dyn Store, limit: Duration) -> Stats {
    wait_stats(store, "drained", limit, |s| s.pending == 0).await
}

/// Waits until at least `n` messages ended `failed` (read through `Store::failed`); returns
/// them, oldest first. Panics after `limit`.
pub async fn wait_failed(store: &dyn Store, n: usize, limit: Duration) -> Vec<FailedMessage> {
    let deadline = Instant::now() + limit;
    loop {
        let failed = store.failed(1000).await.unwrap();
        if failed.len() >= n {
            return failed;
        }
        assert!(
            Instant::now() < deadline,
            "{} of {n} messages ended failed within {limit:?}: {:?}",
            failed.len(),
            stats(store).await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The failed message with id `id`, among `failed`.
pub fn failed_one(failed: &[FailedMessage], id: Uuid) -> &FailedMessage {
    failed
        .iter()
        .find(|f| f.id == id)
        .unwrap_or_else(|| panic!("{id} is not among the failed messages: {failed:?}"))
}

/// Reads `reader` until every id of `want` arrived (or `limit` passed), then a moment more
/// for duplicates; returns the deliveries of `want`'s ids, in arrival order (anything else the
/// destination holds is left out).
pub async fn read_ids(
    reader: &mut dyn Reader,
    want: &HashSet<Uuid>,
    limit: Duration,
) -> Vec<Delivered> {
    let mut got = Vec::new();
    read_more_ids(reader, &mut got, want, limit).await;
    got
}

/// [`read_ids`] into `got`, which may hold deliveries already (a reader that takes over from
/// another).
pub async fn read_more_ids(
    reader: &mut dyn Reader,
    got: &mut Vec<Delivered>,
    want: &HashSet<Uuid>,
    limit: Duration,
) {
    let before: HashSet<Uuid> = got.iter().map(|d| d.id).collect();
    let more = read_until(reader, limit, |d| {
        let seen: HashSet<Uuid> = d
            .iter()
            .map(|m| m.id)
            .chain(before.iter().copied())
            .filter(|id| want.contains(id))
            .collect();
        seen.len() >= want.len()
    })
    .await;
    got.extend(more.delivered.into_iter().filter(|d| want.contains(&d.id)));
    let late = reader.poll(Duration::from_millis(500)).await.delivered;
    got.extend(late.into_iter().filter(|d| want.contains(&d.id)));
}

/// Reads `reader` until `n` distinct messages arrived (or `limit` passed), then a moment more
/// for duplicates; everything read, in arrival order.
pub async fn read_distinct(reader: &mut dyn Reader, n: usize, limit: Duration) -> Vec<Delivered> {
    let mut got = read_until(reader, limit, |d| {
        d.iter().map(|m| m.id).collect::<HashSet<_>>().len() >= n
    })
    .await
    .delivered;
    got.extend(reader.poll(Duration::from_millis(500)).await.delivered);
    got
}

/// (id, key, `n` from the payload) of each delivery, in arrival order.
pub fn triples(got: &[Delivered]) -> Vec<(String, String, u64)> {
    got.iter()
        .map(|d| {
            let v: serde_json::Value = serde_json::from_slice(&d.payload).unwrap();
            (d.id.to_string(), d.key.clone(), v["n"].as_u64().unwrap())
        })
        .collect()
}

/// Asserts that each key's messages arrived, at their first delivery, as n = 0, 1, 2, … with
/// no gap (a redelivered message may repeat later; it must never be new and out of order).
/// Returns how many distinct messages each key got.
pub fn assert_key_order(
    deliveries: impl IntoIterator<Item = (String, String, u64)>,
) -> HashMap<String, u64> {
    let mut seen = HashSet::new();
    let mut next: HashMap<String, u64> = HashMap::new();
    for (id, key, n) in deliveries {
        if !seen.insert(id) {
            continue;
        }
        let expect = next.entry(key.clone()).or_insert(0);
        assert_eq!(n, *expect, "key {key}: got message {n}, expected {expect}");
        *expect += 1;
    }
    next
}

/// Asserts that each key's first deliveries came in increasing `n`, gaps allowed (a broker
/// that lost messages it acknowledged); returns how many distinct messages arrived.
pub fn assert_increasing_per_key(got: &[Delivered]) -> usize {
    let mut seen = HashSet::new();
    let mut last: HashMap<String, u64> = HashMap::new();
    for (id, key, n) in triples(got) {
        if !seen.insert(id) {
            continue;
        }
        if let Some(prev) = last.insert(key.clone(), n) {
            assert!(
                n > prev,
                "key {key}: message {n} first delivered after {prev}"
            );
        }
    }
    seen.len()
}

/// Asserts that `got` holds `keys` × `per_key` distinct messages, and, when `ordered`, that
/// each key's first deliveries came in `n` order (a message delivered again after a fault is
/// at-least-once, allowed; a new message before an older one of its key is not). Returns how
/// many deliveries were duplicates.
pub fn assert_all_arrived(got: &[Delivered], keys: usize, per_key: usize, ordered: bool) -> usize {
    let distinct: HashSet<Uuid> = got.iter().map(|d| d.id).collect();
    assert_eq!(
        distinct.len(),
        keys * per_key,
        "{} of {} messages arrived",
        distinct.len(),
        keys * per_key
    );
    if ordered {
        let counts = assert_key_order(triples(got));
        assert_eq!(counts.len(), keys, "{counts:?}");
        assert!(counts.values().all(|&n| n == per_key as u64), "{counts:?}");
    }
    got.len() - distinct.len()
}

/// Wraps a sink and keeps the envelopes it was handed, a count of its calls in progress, and
/// the calls that came back with a message the broker was unavailable for (an outage reached
/// them): per such call, the most messages of one key it carried.
pub struct Probe {
    inner: Arc<dyn Sink>,
    in_flight: AtomicUsize,
    caught: Mutex<Vec<usize>>,
    handed: Mutex<HashMap<Uuid, Envelope>>,
}

impl Probe {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn Sink>) -> Self {
        Self {
            inner,
            in_flight: AtomicUsize::new(0),
            caught: Mutex::default(),
            handed: Mutex::default(),
        }
    }

    /// Every envelope handed to the sink, by id (the last one handed for an id).
    pub fn handed(&self) -> HashMap<Uuid, Envelope> {
        self.handed.lock().unwrap().clone()
    }

    /// Calls in progress.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    /// For every call that found the broker unavailable, the most messages of one key in it.
    pub fn caught(&self) -> Vec<usize> {
        self.caught.lock().unwrap().clone()
    }
}

#[async_trait::async_trait]
impl Sink for Probe {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn ack_timeout(&self) -> Option<Duration> {
        self.inner.ack_timeout()
    }
    fn orders_keys(&self) -> bool {
        self.inner.orders_keys()
    }
    async fn publish(&self, batch: &[Envelope]) -> Vec<Result<(), SinkError>> {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        {
            let mut handed = self.handed.lock().unwrap();
            for e in batch {
                handed.insert(e.id, e.clone());
            }
        }
        let results = self.inner.publish(batch).await;
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        if results
            .iter()
            .any(|r| r.as_ref().is_err_and(SinkError::is_unavailable))
        {
            let mut per_key: HashMap<&str, usize> = HashMap::new();
            for e in batch {
                *per_key.entry(e.key.as_str()).or_default() += 1;
            }
            let most = per_key.values().copied().max().unwrap_or(0);
            self.caught.lock().unwrap().push(most);
        }
        results
    }
}

/// A relay draining a backlog while its broker goes down and comes back: `keys` × `per_key`
/// messages written up front (interleaved, payload `{"n": n}`), drained into a sink by a relay
/// whose retry budget no outage of a test exhausts.
///
/// The broker is taken down while the relay is in the middle of the backlog, once a publish
/// call is outstanding (messages in flight), not between batches after the outbox drained:
/// that is the case where a sink could lose a message it had sent but not yet had
/// acknowledged, or let a later message of a key overtake one that failed. Taking a broker down
/// takes a moment, so the call seen outstanding may still be answered first; [`Backlog::finish`]
/// requires that some call found the broker down, not that this one did.
pub struct Backlog {
    /// The store drained.
    pub store: Arc<dyn Store>,
    /// The messages written.
    pub messages: Vec<NewMessage>,
    relay: RunningRelay,
    probe: Arc<Probe>,
}

impl Backlog {
    /// Writes `per_key` messages for each of `key_names` and starts the relay.
    pub async fn start(
        store: Arc<dyn Store>,
        sink: Arc<dyn Sink>,
        mut cfg: RelayConfig,
        key_names: &[String],
        per_key: usize,
    ) -> Self {
        let messages = interleaved(key_names, 0..per_key);
        for chunk in messages.chunks(1000) {
            store.insert(chunk).await.unwrap();
        }
        cfg.retry.max_attempts = 1000;
        let probe = Arc::new(Probe::new(sink));
        let relay = RunningRelay::start(store.clone(), probe.clone(), cfg);
        Self {
            store,
            messages,
            relay,
            probe,
        }
    }

    /// How many messages the backlog holds.
    pub fn total(&self) -> usize {
        self.messages.len()
    }

    /// The relay's breaker.
    pub fn breaker(&self) -> &Breaker {
        &self.relay.breaker
    }

    /// Waits until at least `n` messages are recorded published and a publish call is
    /// outstanding: the moment to take the broker down with messages in flight.
    pub async fn publishing(&self, n: i64) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let s = stats(self.store.as_ref()).await;
            assert!(
                s.published < self.total() as i64,
                "the backlog drained before the broker went down: make it longer ({s:?})"
            );
            if s.published >= n && self.probe.in_flight() > 0 {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "never reached {n} published: {s:?}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Waits until the relay saw the outage (its circuit opened) and checks that it caught the
    /// relay mid-backlog: part of it still unpublished, nothing failed. Returns how many were
    /// recorded published by then.
    pub async fn outage(&self, limit: Duration) -> i64 {
        wait_state(self.breaker(), CircuitState::Open, limit).await;
        let s = stats(self.store.as_ref()).await;
        assert_eq!(s.failed, 0, "an outage fails nothing: {s:?}");
        assert!(
            s.published < self.total() as i64,
            "the outage was seen only after the backlog drained: {s:?}"
        );
        s.published
    }

    /// With the broker back: waits until everything is published and the circuit closed, stops
    /// the relay, and checks the record: every message published once, none failed, and some
    /// call found the broker unavailable. Returns the most messages of one key such a call
    /// held.
    pub async fn finish(self, limit: Duration) -> usize {
        let total = self.total() as i64;
        wait_drained(self.store.as_ref(), limit).await;
        wait_state(self.breaker(), CircuitState::Closed, limit).await;
        self.relay.stop().await;
        let s = stats(self.store.as_ref()).await;
        assert_eq!(
            (s.published, s.failed),
            (total, 0),
            "every message recorded published once, none failed: {s:?}"
        );
        let caught = self.probe.caught();
        assert!(!caught.is_empty(), "no publish call found the broker down");
        caught.into_iter().max().unwrap_or(0)
    }
}
