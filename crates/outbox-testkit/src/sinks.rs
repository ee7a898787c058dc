//! Sink wrappers for tests: fault injection and delivery recording around any real sink.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use outbox_core::{Envelope, Sink, SinkError};
use uuid::Uuid;

/// Fails its first `fail_first` publish calls (every message of a failed call, transiently, as a
/// broker that is down would), then passes everything to the inner sink. With
/// `fail_first = u64::MAX` it never recovers; `permanent` makes its failures permanent.
pub struct FlakySink<S> {
    inner: S,
    fail_first: u64,
    permanent: bool,
    calls: AtomicU64,
}

impl<S: Sink> FlakySink<S> {
    /// Fails the first `n` publish calls transiently.
    pub fn failing_first(inner: S, n: u64) -> Self {
        Self {
            inner,
            fail_first: n,
            permanent: false,
            calls: AtomicU64::new(0),
        }
    }

    /// Fails every call, transiently.
    pub fn always_failing(inner: S) -> Self {
        Self::failing_first(inner, u64::MAX)
    }

    /// Fails every call permanently.
    pub fn permanently_failing(inner: S) -> Self {
        Self {
            inner,
            fail_first: u64::MAX,
            permanent: true,
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
    fn name(&self) -> &str {
        self.inner.name()
    }

    async fn publish(&self, batch: &[Envelope]) -> Vec<Result<(), SinkError>> {
        if self.calls.fetch_add(1, Ordering::SeqCst) < self.fail_first {
            let msg = "injected failure: broker refused the message";
            return batch
                .iter()
                .map(|_| {
                    Err(if self.permanent {
                        SinkError::permanent(msg)
                    } else {
                        SinkError::transient(msg)
                    })
                })
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
    fn name(&self) -> &str {
        self.inner.name()
    }

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
                .map(|_| Err(SinkError::transient("memory sink poisoned")))
                .collect(),
        }
    }
}

/// Fails every message of one ordering key (a poison key), passing the others to the inner sink.
pub struct PoisonKeySink<S> {
    inner: S,
    key: String,
    permanent: bool,
}

impl<S: Sink> PoisonKeySink<S> {
    /// Fails messages of `key` with retriable errors.
    pub fn transient(inner: S, key: impl Into<String>) -> Self {
        Self {
            inner,
            key: key.into(),
            permanent: false,
        }
    }

    /// Fails messages of `key` with permanent errors.
    pub fn permanent(inner: S, key: impl Into<String>) -> Self {
        Self {
            inner,
            key: key.into(),
            permanent: true,
        }
    }
}

#[async_trait]
impl<S: Sink> Sink for PoisonKeySink<S> {
    fn name(&self) -> &str {
        self.inner.name()
    }

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
                    let msg = format!("injected poison for key {}", self.key);
                    Err(if self.permanent {
                        SinkError::permanent(msg)
                    } else {
                        SinkError::transient(msg)
                    })
                } else {
                    passed
                        .next()
                        .unwrap_or_else(|| Err(SinkError::transient("inner sink gave no result")))
                }
            })
            .collect()
    }
}
