//! [`Relay`]: starts the workers and the notification listener, stops them on shutdown.

use std::sync::Arc;
use std::time::Duration;

use outbox_core::{MemberId, Sink, Store};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::breaker::Breaker;
use crate::config::RelayConfig;
use crate::metrics::RelayMetrics;
use crate::worker::Worker;

/// A relay process: `workers` members that each own a share of the partitions.
pub struct Relay {
    store: Arc<dyn Store>,
    sink: Arc<dyn Sink>,
    config: RelayConfig,
    metrics: Arc<RelayMetrics>,
    breaker: Arc<Breaker>,
}

impl Relay {
    /// A relay publishing rows of `store` to `sink`.
    ///
    /// A sink whose ack timeout does not fit in a third of the lease (see
    /// [`RelayConfig::check_ack_timeout`]; the CLI refuses such settings) is given a third of
    /// the lease per call anyway, with a warning: the lease margin wins over the ack timeout.
    pub fn new(store: Arc<dyn Store>, sink: Arc<dyn Sink>, config: RelayConfig) -> Self {
        if let Some(Err(why)) = sink.ack_timeout().map(|a| config.check_ack_timeout(a)) {
            warn!(
                sink = sink.name(),
                "{why}; publishes are cut at a third of the lease"
            );
        }
        let breaker = Arc::new(Breaker::new(sink.name(), config.breaker_threshold));
        Self {
            store,
            sink,
            config,
            metrics: Arc::new(RelayMetrics::default()),
            breaker,
        }
    }

    /// Counters of this relay, live while it runs.
    pub fn metrics(&self) -> Arc<RelayMetrics> {
        self.metrics.clone()
    }

    /// The sink's circuit breaker, shared by the workers.
    pub fn breaker(&self) -> Arc<Breaker> {
        self.breaker.clone()
    }

    fn worker(
        &self,
        i: usize,
        wake: &watch::Receiver<u64>,
        shutdown: &CancellationToken,
    ) -> Worker {
        Worker {
            id: MemberId::random(&format!("{}-w{i}", self.config.member_prefix)),
            store: self.store.clone(),
            sink: self.sink.clone(),
            breaker: self.breaker.clone(),
            cfg: self.config.clone(),
            publish_deadline: self.config.publish_deadline(self.sink.ack_timeout()),
            metrics: self.metrics.clone(),
            wake: wake.clone(),
            shutdown: shutdown.clone(),
        }
    }

    /// Runs until `shutdown` is cancelled. Then each worker stops claiming, finishes the batch
    /// in hand (publish and record), gives its partitions back and the call returns.
    pub async fn run(self, shutdown: CancellationToken) {
        let (wake_tx, wake_rx) = watch::channel(0u64);
        let listener = self.config.listen.then(|| {
            // Aborted on drop too (see `AbortOnDrop`).
            let store = self.store.clone();
            let wake_tx = wake_tx.clone();
            let stop = shutdown.clone();
            tokio::spawn(async move {
                let mut delay = Duration::from_millis(200);
                loop {
                    tokio::select! {
                        r = store.listen(wake_tx.clone()) => match r {
                            Ok(()) => return, // the store has no notifications: poll only
                            Err(error) => warn!(%error, retry_in = ?delay, "notification listener stopped; polling meanwhile"),
                        },
                        _ = stop.cancelled() => return,
                    }
                    tokio::select! {
                        _ = tokio::time::sleep(delay) => {}
                        _ = stop.cancelled() => return,
                    }
                    delay = (delay * 2).min(Duration::from_secs(10));
                }
            })
        }).map(AbortOnDrop);
        let maintenance = (!self.config.maintain_every.is_zero()).then(|| {
            let store = self.store.clone();
            let stop = shutdown.clone();
            let (every, retention) = (self.config.maintain_every, self.config.retention);
            AbortOnDrop(tokio::spawn(maintain_loop(store, every, retention, stop)))
        });
        let workers = self.config.workers.max(1);
        info!(
            workers,
            batch_size = self.config.batch_size,
            sink = self.sink.name(),
            destination = self.config.destination.as_str(),
            "relay started"
        );
        // A JoinSet aborts its tasks when dropped: if this future is dropped (the caller's task
        // aborted), the workers stop with it, mid-batch, exactly like a killed process.
        let mut handles = tokio::task::JoinSet::new();
        let mut slots = std::collections::HashMap::new();
        for i in 0..workers {
            let id = handles
                .spawn(self.worker(i, &wake_rx, &shutdown).run())
                .id();
            slots.insert(id, i);
        }
        while let Some(done) = handles.join_next_with_id().await {
            let Err(error) = done else { continue };
            let slot = slots.remove(&error.id());
            if !error.is_panic() || shutdown.is_cancelled() {
                continue;
            }
            // A bug must not silently shrink the relay: its leases expire, and a fresh worker
            // (a new member) takes its place.
            let i = slot.unwrap_or(0);
            tracing::error!(worker = i, %error, "relay worker panicked; starting a new one in 1 s");
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                _ = shutdown.cancelled() => continue,
            }
            let id = handles
                .spawn(self.worker(i, &wake_rx, &shutdown).run())
                .id();
            slots.insert(id, i);
        }
        drop(listener);
        drop(maintenance);
        drop(wake_tx);
        info!(
            published = RelayMetrics::get(&self.metrics.published),
            failed = RelayMetrics::get(&self.metrics.failed),
            "relay stopped"
        );
    }
}

/// Runs store maintenance now and every `every`: segments ahead of the writers, retention. It
/// runs beside the workers, never inside their loop, because dropping a segment waits for
/// transactions that might still read it.
async fn maintain_loop(
    store: Arc<dyn Store>,
    every: Duration,
    retention: Duration,
    stop: CancellationToken,
) {
    loop {
        match store.maintain(retention).await {
            Ok(m) if m.segments_created + m.segments_dropped > 0 => info!(
                created = m.segments_created,
                dropped = m.segments_dropped,
                "storage segments maintained"
            ),
            Ok(_) => {}
            Err(error) => warn!(%error, "store maintenance failed; will try again"),
        }
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stop.cancelled() => return,
        }
    }
}

/// Aborts a task when dropped, so no helper task outlives the relay.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
