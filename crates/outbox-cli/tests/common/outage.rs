//! A relay draining a backlog while its broker goes down and comes back: the shape every sink's
//! "stopped mid-run, restarted, everything still arrives" test shares.
//!
//! The broker is taken down while the relay is in the middle of a backlog, once a publish call
//! is outstanding (messages in flight), not between batches after the outbox drained: that is
//! the case where a sink could lose a message it had sent but not yet had acknowledged, or let a
//! later message of a key overtake one that failed. Taking a broker down takes a moment, so the
//! call seen outstanding may still be answered first; the tests require that some call found
//! the broker down, not that this one did.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use outbox_core::{Envelope, Sink, SinkError, Store};
use outbox_relay::{Breaker, CircuitState, Relay, RelayConfig};
use outbox_sinks::read::{read_until, Delivered, Reader};
use tokio_util::sync::CancellationToken;

use super::{wait_state, World};

/// Wraps a sink and keeps count of its calls in progress, and of the calls that came back with
/// a message the broker was unavailable for (the outage reached them).
struct Probe {
    inner: Arc<dyn Sink>,
    in_flight: AtomicUsize,
    /// Messages carried by each call that found the broker unavailable.
    caught: Mutex<Vec<usize>>,
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
        let results = self.inner.publish(batch).await;
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        if results
            .iter()
            .any(|r| r.as_ref().is_err_and(SinkError::is_unavailable))
        {
            self.caught.lock().unwrap().push(batch.len());
        }
        results
    }
}

/// `keys` × `per_key` messages written up front (interleaved, payload `{"n": n}`), and a relay
/// with a retry budget no outage of a test exhausts, draining them into `sink`.
pub struct Backlog {
    pub w: World,
    pub keys: usize,
    pub per_key: usize,
    pub breaker: Arc<Breaker>,
    probe: Arc<Probe>,
    stop: CancellationToken,
    h: tokio::task::JoinHandle<()>,
}

impl Backlog {
    pub async fn start(
        w: World,
        sink: Arc<dyn Sink>,
        mut cfg: RelayConfig,
        keys: usize,
        per_key: usize,
    ) -> Self {
        w.store()
            .insert(&super::interleaved(&super::keys("k", keys), 0..per_key))
            .await
            .unwrap();
        cfg.retry.max_attempts = 1000;
        let probe = Arc::new(Probe {
            inner: sink,
            in_flight: AtomicUsize::new(0),
            caught: Mutex::default(),
        });
        let relay = Relay::new(w.dyn_store(), probe.clone(), cfg);
        let breaker = relay.breaker();
        let stop = CancellationToken::new();
        let h = tokio::spawn(relay.run(stop.clone()));
        Self {
            w,
            keys,
            per_key,
            breaker,
            probe,
            stop,
            h,
        }
    }

    pub fn total(&self) -> usize {
        self.keys * self.per_key
    }

    /// Waits until at least `n` messages are recorded published and a publish call is
    /// outstanding: the moment to take the broker down with messages in flight.
    pub async fn publishing(&self, n: i64) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let s = self.w.stats().await;
            assert!(
                s.published < self.total() as i64,
                "the backlog drained before the broker went down: make it longer ({s:?})"
            );
            if s.published >= n && self.probe.in_flight.load(Ordering::SeqCst) > 0 {
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
        wait_state(&self.breaker, CircuitState::Open, limit).await;
        let s = self.w.stats().await;
        assert_eq!(s.failed, 0, "an outage fails nothing: {s:?}");
        assert!(
            s.published < self.total() as i64,
            "the outage was seen only after the backlog drained: {s:?}"
        );
        s.published
    }

    /// With the broker back: waits until everything is published and the circuit closed, stops
    /// the relay, and checks the record: every message published, none failed. Returns the
    /// world and the largest call the outage caught.
    pub async fn finish(self, limit: Duration) -> (World, usize) {
        let total = self.total() as i64;
        self.w.wait_drained(limit).await;
        wait_state(&self.breaker, CircuitState::Closed, limit).await;
        self.stop.cancel();
        self.h.await.unwrap();
        let s = self.w.stats().await;
        assert_eq!(
            (s.published, s.failed),
            (total, 0),
            "every message recorded published once, none failed: {s:?}"
        );
        let caught = self.probe.caught.lock().unwrap().clone();
        assert!(!caught.is_empty(), "no publish call found the broker down");
        (self.w, caught.into_iter().max().unwrap_or(0))
    }
}

/// Reads `reader` until `n` distinct messages arrived (or `limit` passed), then a moment more
/// for duplicates; everything read, in arrival order.
pub async fn read_distinct(reader: &mut dyn Reader, n: usize, limit: Duration) -> Vec<Delivered> {
    let mut got = Vec::new();
    read_more(reader, &mut got, n, limit).await;
    got
}

/// Reads `reader` into `got` until `got` holds `n` distinct messages (or `limit` passed), then
/// a moment more for duplicates: for a reader that takes over from another (a queue made anew
/// after its server's restart).
pub async fn read_more(
    reader: &mut dyn Reader,
    got: &mut Vec<Delivered>,
    n: usize,
    limit: Duration,
) {
    let before: HashSet<_> = got.iter().map(|d| d.id).collect();
    let more = read_until(reader, limit, |d| {
        let new: HashSet<_> = d
            .iter()
            .map(|m| m.id)
            .filter(|id| !before.contains(id))
            .collect();
        before.len() + new.len() >= n
    })
    .await;
    got.extend(more.delivered);
    got.extend(reader.poll(Duration::from_millis(500)).await.delivered);
}

/// (id, key, n) of each delivery, in arrival order.
pub fn triples(got: &[Delivered]) -> Vec<(String, String, u64)> {
    got.iter()
        .map(|d| {
            let v: serde_json::Value = serde_json::from_slice(&d.payload).unwrap();
            (d.id.to_string(), d.key.clone(), v["n"].as_u64().unwrap())
        })
        .collect()
}

/// Asserts that `got` holds every message of a [`Backlog`] of `keys` × `per_key`, and that
/// each key's first deliveries came in `n` order (a message delivered again after the outage
/// is at-least-once, allowed; a new message before an older one of its key is not). Returns
/// how many deliveries were duplicates.
pub fn assert_all_arrived_in_key_order(got: &[Delivered], keys: usize, per_key: usize) -> usize {
    let distinct: HashSet<_> = got.iter().map(|d| d.id).collect();
    let counts: HashMap<String, u64> = super::assert_key_order(triples(got));
    assert_eq!(
        counts.len(),
        keys,
        "{} of {} messages arrived: {counts:?}",
        distinct.len(),
        keys * per_key
    );
    assert!(
        counts.values().all(|&n| n == per_key as u64),
        "{} of {} messages arrived: {counts:?}",
        distinct.len(),
        keys * per_key
    );
    got.len() - distinct.len()
}
