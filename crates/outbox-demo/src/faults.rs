//! The demo's two faults, as sink wrappers around the real sink: the broker taken away and
//! brought back, and a relay hung right after the broker took its batch. They live here, not in
//! the test kit, so the `outbox` binary links no test code.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use async_trait::async_trait;
use outbox_core::{Envelope, Sink, SinkError};

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

/// A broker that can be taken away and brought back at any moment: while the outage lasts, every
/// message of every call fails as unavailable without reaching the inner sink; otherwise calls
/// pass through.
/// Starts with the broker up.
pub struct OutageSink<S> {
    inner: S,
    down: AtomicBool,
}

impl<S: Sink> OutageSink<S> {
    /// Wraps `inner`, broker up.
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            down: AtomicBool::new(false),
        }
    }

    /// The broker goes away: publishes from now on fail until [`OutageSink::end_outage`].
    pub fn start_outage(&self) {
        self.down.store(true, Ordering::SeqCst);
    }

    /// The broker is back: publishes from now on reach the inner sink.
    pub fn end_outage(&self) {
        self.down.store(false, Ordering::SeqCst);
    }
}

#[async_trait]
impl<S: Sink> Sink for OutageSink<S> {
    wraps_inner!();

    async fn publish(&self, batch: &[Envelope]) -> Vec<Result<(), SinkError>> {
        if self.down.load(Ordering::SeqCst) {
            return batch
                .iter()
                .map(|_| {
                    Err(SinkError::unavailable(
                        "injected outage: broker unreachable",
                    ))
                })
                .collect();
        }
        self.inner.publish(batch).await
    }
}

/// Crashes its relay at the worst moment: once [armed](CrashingSink::arm), the next call is
/// published by the inner sink (the broker holds the batch) and then never returns, so the
/// relay never records it. Abort the relay's task after [`CrashingSink::crashed`]: its rows
/// stay pending under a lease that must expire before another relay publishes them again, with
/// the same ids (the redelivery a consumer must absorb).
pub struct CrashingSink<S> {
    inner: S,
    armed: AtomicBool,
    crashed: tokio::sync::Notify,
    batch: AtomicU64,
}

impl<S: Sink> CrashingSink<S> {
    /// Wraps `inner`, disarmed: calls pass through.
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            armed: AtomicBool::new(false),
            crashed: tokio::sync::Notify::new(),
            batch: AtomicU64::new(0),
        }
    }

    /// Makes the next call the one that crashes.
    pub fn arm(&self) {
        self.armed.store(true, Ordering::SeqCst);
    }

    /// Waits until the armed call was published and hung (at once if it already has); returns
    /// how many messages it carried.
    pub async fn crashed(&self) -> u64 {
        // `notify_one` keeps a permit when nobody waits yet, so a crash that came first is seen.
        self.crashed.notified().await;
        self.batch.load(Ordering::SeqCst)
    }
}

#[async_trait]
impl<S: Sink> Sink for CrashingSink<S> {
    wraps_inner!();

    async fn publish(&self, batch: &[Envelope]) -> Vec<Result<(), SinkError>> {
        let results = self.inner.publish(batch).await;
        if self.armed.swap(false, Ordering::SeqCst) {
            self.batch.store(batch.len() as u64, Ordering::SeqCst);
            self.crashed.notify_one();
            std::future::pending::<()>().await;
        }
        results
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use outbox_core::SinkErrorKind;
    use uuid::Uuid;

    use super::*;

    /// A broker that takes everything and counts it.
    #[derive(Default)]
    struct Counting(AtomicU64);

    #[async_trait]
    impl Sink for Counting {
        fn name(&self) -> &str {
            "counting"
        }

        async fn publish(&self, batch: &[Envelope]) -> Vec<Result<(), SinkError>> {
            self.0.fetch_add(batch.len() as u64, Ordering::SeqCst);
            batch.iter().map(|_| Ok(())).collect()
        }
    }

    fn batch(n: usize) -> Vec<Envelope> {
        (0..n)
            .map(|i| Envelope {
                id: Uuid::now_v7(),
                destination: "test".into(),
                key: format!("k{i}"),
                headers: Vec::new(),
                payload: Default::default(),
                created_at: chrono::Utc::now(),
            })
            .collect()
    }

    #[tokio::test]
    async fn an_outage_fails_every_message_as_unavailable_until_it_ends() {
        let sink = OutageSink::new(Counting::default());
        assert!(sink.publish(&batch(1)).await.iter().all(Result::is_ok));
        sink.start_outage();
        let failed = sink.publish(&batch(2)).await;
        assert!(failed.iter().all(|r| r
            .as_ref()
            .is_err_and(|e| e.kind == SinkErrorKind::Unavailable)));
        sink.end_outage();
        assert!(sink.publish(&batch(1)).await.iter().all(Result::is_ok));
        assert_eq!(
            sink.inner.0.load(Ordering::SeqCst),
            2,
            "nothing reached the broker while down"
        );
    }

    #[tokio::test]
    async fn an_armed_crash_publishes_the_batch_and_never_returns() {
        let sink = Arc::new(CrashingSink::new(Counting::default()));
        assert_eq!(
            sink.publish(&batch(1)).await.len(),
            1,
            "disarmed: passes through"
        );
        sink.arm();
        let hung = tokio::spawn({
            let sink = sink.clone();
            async move { sink.publish(&batch(3)).await }
        });
        assert_eq!(sink.crashed().await, 3);
        assert_eq!(
            sink.inner.0.load(Ordering::SeqCst),
            4,
            "the broker took the batch"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!hung.is_finished(), "the crashed call never answers");
        hung.abort();
        assert_eq!(sink.publish(&batch(1)).await.len(), 1, "disarmed again");
    }
}
