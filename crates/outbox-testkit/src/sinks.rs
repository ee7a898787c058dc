//! Sink wrappers for tests: fault injection and delivery recording around any real sink.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use outbox_core::{Envelope, Sink, SinkError, SinkErrorKind};
use uuid::Uuid;

/// The parts of `Sink` a wrapper takes from the sink it wraps (`self.inner`): its name, its ack
/// timeout and whether it orders keys itself. Only `publish` is the wrapper's own.
macro_rules! wraps_inner {
    () => {
        fn name(&self) -> &str {
            self.inner.name()
        }

        fn ack_timeout(&self) -> Option<std::time::Duration> {
            self.inner.ack_timeout()
        }

        fn orders_keys(&self) -> bool {
            self.inner.orders_keys()
        }
    };
}

/// Fails its first `fail_first` publish calls (every message of a failed call, as
/// [`SinkErrorKind::Unavailable`], as a broker that is down would), then passes everything to
/// the inner sink. With `fail_first = u64::MAX` it never recovers; [`FlakySink::permanently_failing`]
/// fails every message as [`SinkErrorKind::Invalid`] instead.
pub struct FlakySink<S> {
    inner: S,
    fail_first: u64,
    kind: SinkErrorKind,
    calls: AtomicU64,
}

impl<S: Sink> FlakySink<S> {
    /// Fails the first `n` publish calls: the broker is unavailable.
    pub fn failing_first(inner: S, n: u64) -> Self {
        Self {
            inner,
            fail_first: n,
            kind: SinkErrorKind::Unavailable,
            calls: AtomicU64::new(0),
        }
    }

    /// Fails every call: the broker stays unavailable.
    pub fn always_failing(inner: S) -> Self {
        Self::failing_first(inner, u64::MAX)
    }

    /// Fails every message as rejected: the broker answers and refuses each one, so messages
    /// spend their attempts and the circuit stays closed.
    pub fn always_rejecting(inner: S) -> Self {
        Self {
            inner,
            fail_first: u64::MAX,
            kind: SinkErrorKind::Rejected,
            calls: AtomicU64::new(0),
        }
    }

    /// Fails every message as invalid: no retry can help it.
    pub fn permanently_failing(inner: S) -> Self {
        Self {
            inner,
            fail_first: u64::MAX,
            kind: SinkErrorKind::Invalid,
            calls: AtomicU64::new(0),
        }
    }

    /// Calls failed so far.
    pub fn failures(&self) -> u64 {
        self.calls.load(Ordering::SeqCst).min(self.fail_first)
    }
}

#[async_trait]
impl<S: Sink> Sink for FlakySink<S> {
    wraps_inner!();

    async fn publish(&self, batch: &[Envelope]) -> Vec<Result<(), SinkError>> {
        if self.calls.fetch_add(1, Ordering::SeqCst) < self.fail_first {
            let msg = match self.kind {
                SinkErrorKind::Unavailable => "injected failure: broker unreachable",
                _ => "injected failure: broker refused the message",
            };
            return batch
                .iter()
                .map(|_| Err(SinkError::new(self.kind, msg)))
                .collect();
        }
        self.inner.publish(batch).await
    }
}

/// Counts, per message id, how many times the inner sink acknowledged it: proves "published
/// exactly once" even where the broker would hide duplicates by deduping.
pub struct RecordingSink<S> {
    inner: S,
    acked: Arc<Mutex<HashMap<Uuid, u32>>>,
}

impl<S: Sink> RecordingSink<S> {
    /// Wraps `inner`.
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            acked: Arc::default(),
        }
    }

    /// Shared view of the acknowledgement counts.
    pub fn acked(&self) -> Arc<Mutex<HashMap<Uuid, u32>>> {
        self.acked.clone()
    }
}

#[async_trait]
impl<S: Sink> Sink for RecordingSink<S> {
    wraps_inner!();

    async fn publish(&self, batch: &[Envelope]) -> Vec<Result<(), SinkError>> {
        let results = self.inner.publish(batch).await;
        if let Ok(mut acked) = self.acked.lock() {
            for (e, r) in batch.iter().zip(&results) {
                if r.is_ok() {
                    *acked.entry(e.id).or_default() += 1;
                }
            }
        }
        results
    }
}

/// A sink that keeps what it is given in memory, in publish order. For engine tests that are
/// about the relay, not a broker.
#[derive(Default)]
pub struct MemorySink {
    received: Mutex<Vec<Envelope>>,
}

impl MemorySink {
    /// Everything published so far.
    pub fn received(&self) -> Vec<Envelope> {
        self.received.lock().map(|v| v.clone()).unwrap_or_default()
    }
}

#[async_trait]
impl Sink for MemorySink {
    fn name(&self) -> &str {
        "memory"
    }

    async fn publish(&self, batch: &[Envelope]) -> Vec<Result<(), SinkError>> {
        match self.received.lock() {
            Ok(mut v) => {
                v.extend_from_slice(batch);
                batch.iter().map(|_| Ok(())).collect()
            }
            Err(_) => batch
                .iter()
                .map(|_| Err(SinkError::unavailable("memory sink poisoned")))
                .collect(),
        }
    }
}

/// Fails every message of one ordering key (a poison key), passing the others to the inner sink.
pub struct PoisonKeySink<S> {
    inner: S,
    key: String,
    kind: SinkErrorKind,
}

impl<S: Sink> PoisonKeySink<S> {
    /// Fails messages of `key` with errors of `kind`.
    pub fn with_kind(inner: S, key: impl Into<String>, kind: SinkErrorKind) -> Self {
        Self {
            inner,
            key: key.into(),
            kind,
        }
    }

    /// Fails messages of `key` as rejected: retried within their budget (a poison message is
    /// the message's fault, not the broker's).
    pub fn transient(inner: S, key: impl Into<String>) -> Self {
        Self::with_kind(inner, key, SinkErrorKind::Rejected)
    }

    /// Fails messages of `key` as invalid: `failed` at once.
    pub fn permanent(inner: S, key: impl Into<String>) -> Self {
        Self::with_kind(inner, key, SinkErrorKind::Invalid)
    }
}

#[async_trait]
impl<S: Sink> Sink for PoisonKeySink<S> {
    wraps_inner!();

    async fn publish(&self, batch: &[Envelope]) -> Vec<Result<(), SinkError>> {
        let pass: Vec<Envelope> = batch
            .iter()
            .filter(|e| e.key != self.key)
            .cloned()
            .collect();
        let mut passed = self.inner.publish(&pass).await.into_iter();
        batch
            .iter()
            .map(|e| {
                if e.key == self.key {
                    Err(SinkError::new(
                        self.kind,
                        format!("injected poison for key {}", self.key),
                    ))
                } else {
                    passed
                        .next()
                        .unwrap_or_else(|| Err(SinkError::rejected("inner sink gave no result")))
                }
            })
            .collect()
    }
}

/// An in-memory sink that orders keys itself ([`Sink::orders_keys`]), so the relay may give it
/// several messages of one key per call. It keeps what it stores in order and records the size
/// of each call and the most messages of one key seen in one call.
///
/// [`KeyOrderingSink::failing_once_at`] makes it fail one message of a key the first time it
/// sees it, and answer `Ok` for the later messages of that key in the same call *without
/// storing them*: a relay that trusted those answers would lose them.
#[derive(Default)]
pub struct KeyOrderingSink {
    stored: Mutex<Vec<Envelope>>,
    calls: Mutex<Vec<usize>>,
    most_of_one_key: AtomicU64,
    fail_once: Mutex<Option<(String, u64)>>,
}

impl KeyOrderingSink {
    /// Fails the message of `key` whose payload is `{"n": n}` the first time it is published.
    pub fn failing_once_at(key: impl Into<String>, n: u64) -> Self {
        Self {
            fail_once: Mutex::new(Some((key.into(), n))),
            ..Self::default()
        }
    }

    /// Everything stored, in order.
    pub fn stored(&self) -> Vec<Envelope> {
        self.stored.lock().map(|v| v.clone()).unwrap_or_default()
    }

    /// Sizes of the calls so far.
    pub fn calls(&self) -> Vec<usize> {
        self.calls.lock().map(|v| v.clone()).unwrap_or_default()
    }

    /// The most messages of one key seen in one call.
    pub fn most_of_one_key_in_a_call(&self) -> u64 {
        self.most_of_one_key.load(Ordering::SeqCst)
    }
}

#[async_trait]
impl Sink for KeyOrderingSink {
    fn name(&self) -> &str {
        "key-ordering-memory"
    }

    fn orders_keys(&self) -> bool {
        true
    }

    async fn publish(&self, batch: &[Envelope]) -> Vec<Result<(), SinkError>> {
        if let Ok(mut calls) = self.calls.lock() {
            calls.push(batch.len());
        }
        let mut per_key: HashMap<&str, u64> = HashMap::new();
        for e in batch {
            *per_key.entry(e.key.as_str()).or_default() += 1;
        }
        let most = per_key.values().copied().max().unwrap_or(0);
        self.most_of_one_key.fetch_max(most, Ordering::SeqCst);
        let (Ok(mut stored), Ok(mut fail_once)) = (self.stored.lock(), self.fail_once.lock())
        else {
            return batch
                .iter()
                .map(|_| Err(SinkError::unavailable("memory sink poisoned")))
                .collect();
        };
        let mut failed_key: Option<String> = None;
        batch
            .iter()
            .map(|e| {
                if failed_key.as_deref() == Some(e.key.as_str()) {
                    // Not stored, yet answered Ok: the relay must not trust it.
                    return Ok(());
                }
                let n = serde_json::from_slice::<serde_json::Value>(&e.payload)
                    .ok()
                    .and_then(|v| v["n"].as_u64());
                if let Some((key, at)) = fail_once.as_ref() {
                    if *key == e.key && Some(*at) == n {
                        *fail_once = None;
                        failed_key = Some(e.key.clone());
                        return Err(SinkError::rejected("injected failure inside a key's run"));
                    }
                }
                stored.push(e.clone());
                Ok(())
            })
            .collect()
    }
}

/// What a [`SlowKeySink`] saw, in order: a message handed to it, or answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    /// The message of `key` whose payload is `{"n": n}` was handed over in a call.
    Sent(String, u64),
    /// That message was answered.
    Answered(String, u64),
}

/// Holds every call that carries a message of `slow_key` for `delay` before passing it to the
/// inner sink, and logs when each message was handed over and answered, with the most messages
/// of one key it ever held at once. Proves that a slow key holds back only itself: other keys'
/// next messages go out while its call is still unanswered, and no key ever has two messages
/// in flight.
pub struct SlowKeySink<S> {
    inner: S,
    slow_key: String,
    delay: std::time::Duration,
    log: Mutex<Vec<Seen>>,
    in_flight: Mutex<HashMap<String, u64>>,
    most_of_one_key: AtomicU64,
}

impl<S: Sink> SlowKeySink<S> {
    /// Delays calls holding a message of `slow_key` by `delay`.
    pub fn new(inner: S, slow_key: impl Into<String>, delay: std::time::Duration) -> Self {
        Self {
            inner,
            slow_key: slow_key.into(),
            delay,
            log: Mutex::default(),
            in_flight: Mutex::default(),
            most_of_one_key: AtomicU64::new(0),
        }
    }

    /// Everything seen so far, in order.
    pub fn log(&self) -> Vec<Seen> {
        self.log.lock().map(|l| l.clone()).unwrap_or_default()
    }

    /// The most messages of one key held at once.
    pub fn most_of_one_key_in_flight(&self) -> u64 {
        self.most_of_one_key.load(Ordering::SeqCst)
    }

    fn n(e: &Envelope) -> u64 {
        serde_json::from_slice::<serde_json::Value>(&e.payload)
            .ok()
            .and_then(|v| v.get("n").and_then(serde_json::Value::as_u64))
            .unwrap_or(u64::MAX)
    }

    fn note(&self, batch: &[Envelope], sent: bool) {
        let (Ok(mut log), Ok(mut in_flight)) = (self.log.lock(), self.in_flight.lock()) else {
            return;
        };
        for e in batch {
            let count = in_flight.entry(e.key.clone()).or_default();
            if sent {
                *count += 1;
                self.most_of_one_key.fetch_max(*count, Ordering::SeqCst);
                log.push(Seen::Sent(e.key.clone(), Self::n(e)));
            } else {
                *count = count.saturating_sub(1);
                log.push(Seen::Answered(e.key.clone(), Self::n(e)));
            }
        }
    }
}

#[async_trait]
impl<S: Sink> Sink for SlowKeySink<S> {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn orders_keys(&self) -> bool {
        self.inner.orders_keys()
    }

    async fn publish(&self, batch: &[Envelope]) -> Vec<Result<(), SinkError>> {
        self.note(batch, true);
        if batch.iter().any(|e| e.key == self.slow_key) {
            tokio::time::sleep(self.delay).await;
        }
        let results = self.inner.publish(batch).await;
        self.note(batch, false);
        results
    }
}

/// Wedges its relay's worker the way no deadline can cut: once [armed](BlockingSink::arm), the
/// next call blocks the thread that polls it (a synchronous wait inside async code, as a
/// blocking client or a `std` lock held elsewhere would) until [`BlockingSink::release`]. The
/// relay's publish deadline is a timer on that same task, so it never fires: only a liveness
/// probe sees the worker stop. Run the relay on a multi-threaded runtime with threads to spare.
pub struct BlockingSink<S> {
    inner: S,
    armed: AtomicBool,
    gate: std::sync::Mutex<bool>,
    opened: std::sync::Condvar,
    blocked: AtomicU64,
}

impl<S: Sink> BlockingSink<S> {
    /// Wraps `inner`, disarmed: calls pass through.
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            armed: AtomicBool::new(false),
            gate: std::sync::Mutex::new(false),
            opened: std::sync::Condvar::new(),
            blocked: AtomicU64::new(0),
        }
    }

    /// Makes the next call block its thread until released.
    pub fn arm(&self) {
        if let Ok(mut open) = self.gate.lock() {
            *open = false;
        }
        self.armed.store(true, Ordering::SeqCst);
    }

    /// Calls blocked so far (the one blocking now included).
    pub fn blocked(&self) -> u64 {
        self.blocked.load(Ordering::SeqCst)
    }

    /// Lets the blocked call (and any later one) through.
    pub fn release(&self) {
        self.armed.store(false, Ordering::SeqCst);
        if let Ok(mut open) = self.gate.lock() {
            *open = true;
        }
        self.opened.notify_all();
    }
}

#[async_trait]
impl<S: Sink> Sink for BlockingSink<S> {
    wraps_inner!();

    async fn publish(&self, batch: &[Envelope]) -> Vec<Result<(), SinkError>> {
        if self.armed.swap(false, Ordering::SeqCst) {
            self.blocked.fetch_add(1, Ordering::SeqCst);
            // Deliberately synchronous: this is the bug being simulated.
            let mut open = self
                .gate
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            while !*open {
                open = self
                    .opened
                    .wait(open)
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
            }
        }
        self.inner.publish(batch).await
    }
}
