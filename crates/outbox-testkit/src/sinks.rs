//! Sink wrappers for tests: fault injection and delivery recording around any real sink.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use outbox_core::{Envelope, Sink, SinkError};
use uuid::Uuid;

/// Fails the first `fail_first` messages it is given (transiently), then passes everything to
/// the inner sink. With `fail_first = u64::MAX` it never recovers; `permanent` makes its
/// failures permanent.
pub struct FlakySink<S> {
    inner: S,
    fail_first: u64,
    permanent: bool,
    seen: AtomicU64,
}

impl<S: Sink> FlakySink<S> {
    /// Fails the first `n` messages transiently.
    pub fn failing_first(inner: S, n: u64) -> Self {
        Self {
            inner,
            fail_first: n,
            permanent: false,
            seen: AtomicU64::new(0),
        }
    }

    /// Fails every message, transiently.
    pub fn always_failing(inner: S) -> Self {
        Self::failing_first(inner, u64::MAX)
    }

    /// Fails every message permanently.
    pub fn permanently_failing(inner: S) -> Self {
        Self {
            inner,
            fail_first: u64::MAX,
            permanent: true,
            seen: AtomicU64::new(0),
        }
    }

    /// Messages failed so far.
    pub fn failures(&self) -> u64 {
        self.seen.load(Ordering::SeqCst).min(self.fail_first)
    }
}

#[async_trait]
impl<S: Sink> Sink for FlakySink<S> {
    fn name(&self) -> &str {
        self.inner.name()
    }

    async fn publish(&self, batch: &[Envelope]) -> Vec<Result<(), SinkError>> {
        let start = self.seen.fetch_add(batch.len() as u64, Ordering::SeqCst);
        let mut pass = Vec::new();
        let mut verdicts: Vec<Option<Result<(), SinkError>>> = Vec::with_capacity(batch.len());
        for (i, e) in batch.iter().enumerate() {
            if start.saturating_add(i as u64) < self.fail_first {
                let msg = "injected failure: broker refused the message";
                verdicts.push(Some(Err(if self.permanent {
                    SinkError::permanent(msg)
                } else {
                    SinkError::transient(msg)
                })));
            } else {
                verdicts.push(None);
                pass.push(e.clone());
            }
        }
        let mut passed = self.inner.publish(&pass).await.into_iter();
        verdicts
            .into_iter()
            .map(|v| {
                v.unwrap_or_else(|| {
                    passed
                        .next()
                        .unwrap_or_else(|| Err(SinkError::transient("inner sink gave no result")))
                })
            })
            .collect()
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
