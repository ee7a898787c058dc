//! [`Target`]: what one process exposes: its store's figures, set just before each render, and
//! the verdicts of its probes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use outbox_core::Store;
use outbox_relay::{CircuitState, Pulse, RelayHealth, Verdict};
use tracing::debug;

use crate::catalogue::{
    StoreNames, CIRCUIT_OPEN, CIRCUIT_STATE, INBOX, PARTITIONS_OWNED, RELAY, ROUTE_OLDEST,
    ROUTE_PENDING, WORKER_SILENCE,
};

/// Default of `--unready-after`: how long every sink's circuit may stay open before `/readyz`
/// fails.
pub const DEFAULT_UNREADY_AFTER: Duration = Duration::from_secs(15);

/// A scrape's store query gives up after this long (the figures keep their last values and
/// the store gauge says 0).
const QUERY_TIMEOUT: Duration = Duration::from_secs(5);
/// The store's figures are read by a scrape at most once per this long; a scrape in between
/// serves the last values.
const STORE_READ_MIN_EVERY: Duration = Duration::from_secs(1);
/// ... and never more often than keeps their query to 1/this of the database's time: after a
/// read that took 150 ms (a backlog just written, its pages not yet all-visible), the next
/// comes 7.5 s later. A scrape a second then costs a drain what one every few seconds does.
const STORE_READ_SHARE: u32 = 50;
/// ... and at least once per this long, whatever the last read cost (a read that timed out
/// after [`QUERY_TIMEOUT`] is tried again after this).
const STORE_READ_MAX_EVERY: Duration = Duration::from_secs(30);
/// The backlog by route needs the status query (it reads the pending rows' types, capped per
/// partition: seconds with a million rows pending), so it is read this often, off the scrape's
/// path, never inside a scrape.
const ROUTES_EVERY: Duration = Duration::from_secs(30);
/// Pending messages the backlog by route counts per partition, as `outbox_pending_messages`
/// does: 64,000 rows read at most, however deep the backlog.
const ROUTES_PENDING_CAP: i64 = 1000;
/// The backlog-by-route query gives up after this long (the gauges keep their last values).
const ROUTES_TIMEOUT: Duration = Duration::from_secs(25);
/// `/readyz`'s database round trip gives up after this long.
const PING_TIMEOUT: Duration = Duration::from_secs(3);

/// A loop of the process other than the relay's workers, judged by `/livez`: a name, its pulse,
/// and how long it may stay silent.
#[derive(Debug, Clone)]
pub struct Loop {
    /// Shown in the probe's body.
    pub name: String,
    /// Beaten by the loop at every step.
    pub pulse: Arc<Pulse>,
    /// Longest silence that is not a wedge.
    pub bound: Duration,
}

/// What one `outbox relay` or `outbox inbox` process exposes.
pub struct Target {
    store: Arc<dyn Store>,
    names: StoreNames,
    relay: Option<Arc<RelayHealth>>,
    loops: Vec<Loop>,
    unready_after: Duration,
    /// The relay's routing rules, to group the backlog by route.
    routes: Vec<outbox_core::RouteSpec>,
    /// One scrape's store query at a time: concurrent scrapes wait for it rather than adding
    /// load. Holds when the next one may run (see [`STORE_READ_SHARE`]).
    collecting: tokio::sync::Mutex<Option<Instant>>,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target")
            .field("names", &self.names.pending)
            .field("loops", &self.loops)
            .finish_non_exhaustive()
    }
}

impl Target {
    /// A relay: `store`'s figures under the `outbox_` names, its workers and circuits from
    /// `health`; `/readyz` fails once every sink's circuit has been open for longer than
    /// `unready_after`.
    pub fn relay(store: Arc<dyn Store>, health: Arc<RelayHealth>, unready_after: Duration) -> Self {
        Self {
            store,
            names: RELAY,
            relay: Some(health),
            loops: Vec::new(),
            unready_after,
            routes: Vec::new(),
            collecting: tokio::sync::Mutex::new(None),
        }
    }

    /// Exports the backlog per route of `routes` (the relay's rules; `default` is added).
    pub fn with_routes(mut self, routes: Vec<outbox_core::RouteSpec>) -> Self {
        self.routes = routes;
        self
    }

    /// The inbox ingest daemon: its processing queue's figures (`queue`, an outbox store) under
    /// the `outbox_inbox_` names, and its `loops` judged by `/livez`.
    pub fn inbox(queue: Arc<dyn Store>, loops: Vec<Loop>) -> Self {
        Self {
            store: queue,
            names: INBOX,
            relay: None,
            loops,
            unready_after: DEFAULT_UNREADY_AFTER,
            routes: Vec::new(),
            collecting: tokio::sync::Mutex::new(None),
        }
    }

    /// Sets the scrape-time gauges: the store's figures (one `Store::gauges` call, bounded by
    /// a timeout, at most once a second and never more often than keeps it to 1/50 of the
    /// database's time), the circuits, the partitions owned and each worker's last step.
    pub async fn collect(&self) {
        let mut next_read = self.collecting.lock().await;
        if next_read.is_none_or(|at| Instant::now() >= at) {
            let started = Instant::now();
            self.read_store().await;
            let every = (started.elapsed() * STORE_READ_SHARE)
                .clamp(STORE_READ_MIN_EVERY, STORE_READ_MAX_EVERY);
            *next_read = Some(started + every);
        }
        drop(next_read);
        self.read_relay();
    }

    /// The store's figures: one `Store::gauges` call under [`QUERY_TIMEOUT`].
    async fn read_store(&self) {
        let n = &self.names;
        let started = Instant::now();
        let read = tokio::time::timeout(QUERY_TIMEOUT, self.store.gauges()).await;
        metrics::gauge!(n.query_duration).set(started.elapsed().as_secs_f64());
        match read {
            Ok(Ok(g)) => {
                metrics::gauge!(n.store_up).set(1.0);
                metrics::gauge!(n.pending).set(g.pending as f64);
                metrics::gauge!(n.pending_capped).set(if g.pending_capped { 1.0 } else { 0.0 });
                metrics::gauge!(n.oldest_age).set(g.oldest_pending_age_seconds.unwrap_or(0.0));
                metrics::gauge!(n.retrying).set(g.retrying as f64);
                metrics::gauge!(n.parked).set(g.parked as f64);
                metrics::gauge!(n.failed).set(g.failed as f64);
                metrics::gauge!(n.at_parking_cap).set(g.partitions_at_parking_cap as f64);
                if let Some(s) = g.segments {
                    metrics::gauge!(n.segments).set(s as f64);
                }
                for p in &g.retention_pins {
                    metrics::gauge!(n.retention_pin, "pin" => p.pin).set(p.age_seconds);
                }
                if let Some(slot) = &g.cdc_slot {
                    use crate::catalogue::{
                        CDC_LAG_BYTES, CDC_LAG_SECONDS, CDC_LOST, CDC_RETAINED_BYTES, CDC_UNREAD,
                    };
                    metrics::gauge!(CDC_LAG_BYTES).set(slot.lag_bytes as f64);
                    metrics::gauge!(CDC_RETAINED_BYTES).set(slot.retained_bytes as f64);
                    metrics::gauge!(CDC_LAG_SECONDS).set(slot.lag_seconds);
                    metrics::gauge!(CDC_LOST).set(if slot.lost { 1.0 } else { 0.0 });
                    metrics::gauge!(CDC_UNREAD).set(slot.unread_wal_bytes as f64);
                }
                if let Some(q) = &g.binlog_sequencer {
                    use crate::catalogue::{
                        BINLOG_FROM_TABLE, BINLOG_LAG_BYTES, BINLOG_LAG_SECONDS, BINLOG_LEASED,
                        BINLOG_PURGED, BINLOG_SAVE_AGE, BINLOG_STUCK, BINLOG_UNSEALED,
                    };
                    let flag = |b: bool| if b { 1.0 } else { 0.0 };
                    metrics::gauge!(BINLOG_LEASED).set(flag(q.leased));
                    metrics::gauge!(BINLOG_SAVE_AGE).set(q.save_age_seconds);
                    metrics::gauge!(BINLOG_PURGED).set(flag(q.lag_bytes.is_none()));
                    if let Some(lag) = q.lag_bytes {
                        metrics::gauge!(BINLOG_LAG_BYTES).set(lag as f64);
                    }
                    metrics::gauge!(BINLOG_UNSEALED).set(q.unsealed_seqs as f64);
                    metrics::gauge!(BINLOG_FROM_TABLE).set(q.rows_from_table as f64);
                    metrics::gauge!(BINLOG_LAG_SECONDS).set(q.lag_seconds);
                    metrics::gauge!(BINLOG_STUCK).set(q.stuck_partitions as f64);
                }
            }
            Ok(Err(error)) => {
                debug!(%error, "metrics: the store's figures could not be read");
                metrics::gauge!(n.store_up).set(0.0);
            }
            Err(_) => {
                debug!("metrics: the store's figures were not read in time");
                metrics::gauge!(n.store_up).set(0.0);
            }
        }
    }

    /// The circuits, the partitions owned and each worker's last step: read from memory.
    fn read_relay(&self) {
        let Some(health) = &self.relay else { return };
        for c in health.circuits() {
            let labels = [("sink", c.sink.clone()), ("route", c.route.clone())];
            let state = match c.state {
                CircuitState::Closed => 0.0,
                CircuitState::HalfOpen => 1.0,
                CircuitState::Open => 2.0,
            };
            metrics::gauge!(CIRCUIT_STATE, &labels).set(state);
            metrics::gauge!(CIRCUIT_OPEN, &labels).set(c.open_for.map_or(0.0, |d| d.as_secs_f64()));
        }
        for m in health.members() {
            let member = m.member.clone();
            metrics::gauge!(PARTITIONS_OWNED, "member" => member.clone())
                .set(m.partitions() as f64);
            if let Some(silent) = m.pulse.silent_for() {
                metrics::gauge!(WORKER_SILENCE, "member" => member).set(silent.as_secs_f64());
            }
        }
    }

    /// Reads the backlog by route every 30 s until `stop` (a relay's target only), so a scrape
    /// never waits for it.
    pub async fn run_routes(self: std::sync::Arc<Self>, stop: tokio_util::sync::CancellationToken) {
        if self.relay.is_none() {
            return;
        }
        loop {
            self.collect_routes().await;
            if stop
                .run_until_cancelled(tokio::time::sleep(ROUTES_EVERY))
                .await
                .is_none()
            {
                return;
            }
        }
    }

    /// The backlog by route, as `outbox status` groups it (one status query, bounded by a
    /// timeout; on failure the gauges keep their last values).
    async fn collect_routes(&self) {
        let read = tokio::time::timeout(
            ROUTES_TIMEOUT,
            self.store.pending_by_type(ROUTES_PENDING_CAP),
        )
        .await;
        let Ok(Ok(pending)) = read else {
            debug!("metrics: the backlog by route could not be read");
            return;
        };
        let report = outbox_core::status::Report::new(
            chrono::Utc::now(),
            outbox_core::Stats::default(),
            outbox_core::status::StatusDetail {
                pending,
                ..Default::default()
            },
            &self.routes,
        );
        for r in report.routes {
            let route = r.route;
            metrics::gauge!(ROUTE_PENDING, "route" => route.clone()).set(r.pending as f64);
            metrics::gauge!(ROUTE_OLDEST, "route" => route)
                .set(r.oldest_pending_age_seconds.unwrap_or(0.0));
        }
    }

    /// `/livez`: every loop finished a step within its bound (the relay's workers within the
    /// relay's live bound).
    pub fn live(&self) -> Verdict {
        let loops = Verdict::of(
            self.loops
                .iter()
                .filter_map(|l| {
                    let silent = l.pulse.silent_for()?;
                    Some((
                        silent <= l.bound,
                        format!(
                            "{}: last step {:.1}s ago (bound {:.0}s)",
                            l.name,
                            silent.as_secs_f64(),
                            l.bound.as_secs_f64()
                        ),
                    ))
                })
                .collect(),
        );
        match &self.relay {
            Some(h) => h.liveness().and(loops),
            None => loops,
        }
    }

    /// `/readyz`: the database answers a round trip now, and (a relay) every worker holds its
    /// lease or waits for its share, and not every sink's circuit has been open for longer than
    /// `--unready-after`.
    pub async fn ready(&self) -> Verdict {
        let ping = match tokio::time::timeout(PING_TIMEOUT, self.store.ping()).await {
            Ok(Ok(())) => (true, "database: answers".to_string()),
            Ok(Err(e)) => (false, format!("database: {e}")),
            Err(_) => (
                false,
                format!(
                    "database: no answer within {:.0}s",
                    PING_TIMEOUT.as_secs_f64()
                ),
            ),
        };
        let db = Verdict::of(vec![ping]);
        match &self.relay {
            Some(h) => db.and(h.readiness(self.unready_after)),
            None => db,
        }
    }
}
