//! [`Relay`]: starts the workers and the notification listener, stops them on shutdown.

use std::sync::Arc;
use std::time::Duration;

use outbox_core::{MemberId, RouteMatch, Sink, Store};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::breaker::Breaker;
use crate::config::RelayConfig;
use crate::health::{MemberHealth, RelayHealth};
use crate::lane::{Lane, Lanes, Route};
use crate::metrics::RelayMetrics;
use crate::telemetry::EngineMetrics;
use crate::worker::Worker;

/// A relay process: `workers` members that each own a share of the partitions.
pub struct Relay {
    store: Arc<dyn Store>,
    lanes: Arc<Lanes>,
    config: RelayConfig,
    metrics: Arc<RelayMetrics>,
    engine: Arc<EngineMetrics>,
    health: Arc<RelayHealth>,
}

impl Relay {
    /// A relay publishing rows of `store` to `sink`.
    ///
    /// A sink whose ack timeout does not fit in a third of the lease (see
    /// [`RelayConfig::check_ack_timeout`]; the CLI refuses such settings) is given a third of
    /// the lease per call anyway, with a warning: the lease margin wins over the ack timeout.
    pub fn new(store: Arc<dyn Store>, sink: Arc<dyn Sink>, config: RelayConfig) -> Self {
        let name = sink.name().to_string();
        let route = Route {
            name,
            when: RouteMatch::default(),
            sink,
            destination: None,
        };
        Self::build(store, vec![route], config)
    }

    /// A relay publishing each row through the first of `routes` whose rule it matches (put a
    /// catch-all rule last for a default sink). A row no rule matches ends `failed`, naming the
    /// rules, rather than going anywhere by accident. Each route has its own circuit breaker:
    /// while one sink is down its rows wait, in key order and without spending attempts
    /// ([`outbox_core::Outcome::Deferred`]), and the other routes flow. No route at all is a
    /// config error.
    pub fn with_routes(
        store: Arc<dyn Store>,
        routes: Vec<Route>,
        config: RelayConfig,
    ) -> outbox_core::Result<Self> {
        if routes.is_empty() {
            return Err(outbox_core::Error::config(
                "relay: no sink and no route; give a sink, or routes",
            ));
        }
        Ok(Self::build(store, routes, config))
    }

    fn build(store: Arc<dyn Store>, routes: Vec<Route>, config: RelayConfig) -> Self {
        for r in &routes {
            if let Some(Err(why)) = r.sink.ack_timeout().map(|a| config.check_ack_timeout(a)) {
                warn!(
                    sink = r.sink.name(),
                    route = %r.name,
                    "{why}; publishes are cut at a third of the lease"
                );
            }
        }
        let lanes: Vec<Lane> = routes.into_iter().map(|r| Lane::new(r, &config)).collect();
        let health = RelayHealth::new(
            lanes
                .iter()
                .map(|l| (l.name.clone(), l.breaker.clone()))
                .collect(),
            config.live_bound(),
            config.lease,
        );
        Self {
            store,
            lanes: Arc::new(Lanes(lanes)),
            config,
            metrics: Arc::new(RelayMetrics::default()),
            engine: Arc::new(EngineMetrics::new()),
            health: Arc::new(health),
        }
    }

    /// Liveness and readiness of this relay's workers and sinks, live while it runs (what the
    /// `/livez` and `/readyz` probes read).
    pub fn health(&self) -> Arc<RelayHealth> {
        self.health.clone()
    }

    /// Counters of this relay, live while it runs.
    pub fn metrics(&self) -> Arc<RelayMetrics> {
        self.metrics.clone()
    }

    /// The first route's circuit breaker (the only one without routing), shared by the
    /// workers.
    pub fn breaker(&self) -> Arc<Breaker> {
        self.lanes.0[0].breaker.clone()
    }

    fn worker(
        &self,
        i: usize,
        wake: &watch::Receiver<u64>,
        shutdown: &CancellationToken,
    ) -> Worker {
        let id = MemberId::random(&format!("{}-w{i}", self.config.member_prefix));
        let health = Arc::new(MemberHealth::new(id.to_string(), i));
        self.health.register(health.clone());
        Worker {
            id,
            store: self.store.clone(),
            lanes: self.lanes.clone(),
            cfg: self.config.clone(),
            metrics: self.metrics.clone(),
            engine: self.engine.clone(),
            health,
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
                let mut backoff = outbox_core::Backoff::RECONNECT;
                loop {
                    let delay = tokio::select! {
                        r = store.listen(wake_tx.clone()) => match r {
                            Ok(()) => return, // the store has no notifications: poll only
                            Err(error) => {
                                let delay = backoff.failed();
                                warn!(%error, retry_in = ?delay, "notification listener stopped; polling meanwhile");
                                delay
                            }
                        },
                        _ = stop.cancelled() => return,
                    };
                    tokio::select! {
                        _ = tokio::time::sleep(delay) => {}
                        _ = stop.cancelled() => return,
                    }
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
            sinks = %self
                .lanes
                .0
                .iter()
                .map(|l| format!("{}={}", l.name, l.sink.name()))
                .collect::<Vec<_>>()
                .join(","),
            destination = self.config.destination.as_str(),
            "relay started"
        );
        // A JoinSet aborts its tasks when dropped: if this future is dropped (the caller's task
        // aborted), the workers stop with it, mid-batch, exactly like a killed process.
        let mut handles = tokio::task::JoinSet::new();
        let mut slots = std::collections::HashMap::new();
        let first: Vec<Worker> = (0..workers)
            .map(|i| self.worker(i, &wake_rx, &shutdown))
            .collect();
        // Every worker is registered before any takes partitions, so each takes its share at
        // once: one that went first would take them all and hand the others' back only at its
        // next rebalance, a second or two into a backlog. A failed registration only costs that.
        for w in &first {
            if let Err(error) = w.join().await {
                warn!(member = %w.id, %error, "could not register the worker before it starts; it takes its share at a later rebalance");
            }
        }
        for (i, w) in first.into_iter().enumerate() {
            let id = handles.spawn(w.run()).id();
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
            Ok(m) if m.rows_below_floor > 0 => warn!(
                rows = m.rows_below_floor,
                "rows lie below their window's seq floor, where claims pass over them: either a \
                 writer set `seq` or `txid` by hand (never do; see docs/sql-contract.md) or an \
                 engine defect; please report the latter (see docs/engine.md)"
            ),
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
