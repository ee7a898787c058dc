//! One relay member: owns a share of the partitions and runs claim -> publish -> complete on them
//! (the publish itself is in `crate::publish`).

use std::collections::HashSet;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use outbox_core::Backoff;
use outbox_core::{ClaimLimits, Error, ErrorKind, MemberId, Message, Outcome, Result, Store};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;
use tracing::{debug, info, warn};

use crate::breaker::{CircuitState, Permit};
use crate::config::{RelayConfig, MIN_POLL_INTERVAL};
use crate::health::MemberHealth;
use crate::lane::Lanes;
use crate::metrics::RelayMetrics;
use crate::publish::Published;
use crate::telemetry::EngineMetrics;

/// After a store call succeeds: says once that the store is back, after failures.
fn store_reachable(member: &MemberId, backoff: &mut Backoff) {
    let failures = backoff.succeeded();
    if failures > 0 {
        info!(%member, failures, "store reachable again");
    }
}

pub(crate) struct Worker {
    pub(crate) id: MemberId,
    pub(crate) store: Arc<dyn Store>,
    /// The sinks, one lane per route.
    pub(crate) lanes: Arc<Lanes>,
    pub(crate) cfg: RelayConfig,
    pub(crate) metrics: Arc<RelayMetrics>,
    /// The engine's metric handles (the lanes hold their own).
    pub(crate) engine: Arc<EngineMetrics>,
    /// What the probes read: beaten at every step of the loop (see `crate::health`).
    pub(crate) health: Arc<MemberHealth>,
    pub(crate) wake: watch::Receiver<u64>,
    pub(crate) shutdown: CancellationToken,
}

/// The lease as this worker last saw it.
pub(crate) struct Lease {
    partitions: Vec<i32>,
    /// Local instant by which the lease expires (measured from before the renewing call).
    valid_until: Instant,
    /// When to heartbeat and rebalance next.
    next_rebalance: Instant,
    /// When the lease was last extended.
    renewed_at: Instant,
}

/// The permit a claim goes by. Without routing the one breaker decides the claim, as it always
/// did: a probe claims one message. With routing a claim goes ahead while any lane may publish;
/// rows of a lane that must wait are deferred at publish time.
fn claim_permit(permits: &[Permit]) -> Permit {
    if let Some(d) = permits
        .iter()
        .map(|p| match p {
            Permit::Wait(d) => Some(*d),
            _ => None,
        })
        .collect::<Option<Vec<_>>>()
        .and_then(|waits| waits.into_iter().min())
    {
        Permit::Wait(d)
    } else if permits.contains(&Permit::Proceed) {
        Permit::Proceed
    } else {
        Permit::Probe
    }
}

/// After a probe without routing: a probe that found the broker still unavailable says nothing
/// about the message, so its outcome is dropped and it spends none of its attempts (the breaker
/// paces the next probe), and a long outage cannot push head messages into `failed`. A probe
/// the broker *rejected* is completed like any rejection: it spends an attempt, so a message the
/// broker refuses cannot be probed forever while the rest of the relay waits.
fn keep_probe_verdict(outcomes: &mut Vec<Outcome>, unavailable: &HashSet<i64>) {
    outcomes.retain(|o| matches!(o, Outcome::Published { .. }) || !unavailable.contains(&o.seq()));
}

impl Worker {
    /// The member's loop until shutdown: rebalance when due, claim (or adopt the batch read
    /// ahead), publish, complete; then release the partitions.
    pub(crate) async fn run(mut self) {
        let mut lease = Lease {
            partitions: Vec::new(),
            valid_until: Instant::now(),
            next_rebalance: Instant::now(),
            renewed_at: Instant::now(),
        };
        let mut backoff = Backoff::RECONNECT;
        let mut reported = CircuitState::Closed;
        // Wait before the next claim; doubles while claims come back empty.
        let mut poll = Duration::ZERO;
        // The batch read while the last one was published, and the partitions it was read
        // for: published next if the store adopts it (see `Store::claim_ahead`).
        let mut ahead: Option<(Vec<i32>, Vec<Message>)> = None;
        while !self.shutdown.is_cancelled() {
            self.health.pulse.beat();
            // Kept only by an iteration that goes straight on to claim: a pause, a rebalance
            // failure or a wait for the breaker drops it.
            let read_before = ahead.take();
            if !self.rebalance_when_due(&mut lease, &mut backoff).await {
                continue;
            }
            if lease.partitions.is_empty() {
                let until = (Instant::now() + self.cfg.poll_interval).min(lease.next_rebalance);
                self.wait_until(until).await;
                continue;
            }
            if !poll.is_zero() {
                // The wait chosen after the last batch, cut short by a wake-up or shutdown.
                let until = Instant::now() + poll;
                self.wait_until(until.min(lease.next_rebalance)).await;
            }
            let permits = self.lanes.permits();
            let permit = claim_permit(&permits);
            let limit = match permit {
                Permit::Proceed => self.cfg.batch_size,
                // One message tells whether the broker is back, without risking a batch.
                Permit::Probe => 1,
                Permit::Wait(d) => {
                    let until = lease
                        .next_rebalance
                        .saturating_duration_since(Instant::now());
                    self.pause(d.min(until).max(Duration::from_millis(10)))
                        .await;
                    continue;
                }
            };
            self.wake.borrow_and_update();
            let t_claim = Instant::now();
            let limits = ClaimLimits {
                rows: limit,
                bytes: self.cfg.claim_bytes(),
            };
            let claimed = self
                .claim_or_adopt(read_before, permit, &lease, limits, t_claim)
                .await;
            let batch = match claimed {
                Ok(b) => {
                    store_reachable(&self.id, &mut backoff);
                    b
                }
                Err(error) => {
                    self.probes_unused(&permits);
                    let d = backoff.failed();
                    warn!(member = %self.id, %error, retry_in = ?d, "claim failed");
                    self.pause(d).await;
                    continue;
                }
            };
            // A claim that stopped short (it stepped over rows of a transaction still being
            // written, as far as one claim may) has more to read: claim again at once.
            let more = self.store.more_to_read(&self.id);
            if batch.is_empty() {
                debug!(member = %self.id, claim_ms = t_claim.elapsed().as_secs_f64() * 1e3,
                       more, "claim empty");
                self.probes_unused(&permits);
                poll = if more {
                    Duration::ZERO
                } else {
                    (poll * 2)
                        .max(MIN_POLL_INTERVAL)
                        .min(self.cfg.poll_interval)
                };
                continue;
            }
            // Adaptive polling: a full batch means more is waiting, so claim again at once;
            // a partial one means the relay caught up, so wait the shortest step.
            poll = if batch.len() >= limit || more {
                Duration::ZERO
            } else {
                MIN_POLL_INTERVAL
            };
            RelayMetrics::add(&self.metrics.batches, 1);
            let t_publish = Instant::now();
            self.engine.batch_messages.record(batch.len() as f64);
            // A full batch means a backlog: read the next batch while this one is published,
            // so a hot key's claims cost no time of their own. Within the bytes this batch
            // leaves of the worker's share, so both together stay within it; not at all when
            // that is under half (large payloads: the read would come back short anyway).
            let held: usize = batch.iter().map(|m| m.payload.len()).sum();
            self.engine.batch_bytes.record(held as f64);
            let ahead_limits = ClaimLimits {
                rows: limit,
                bytes: limits.bytes.saturating_sub(held),
            };
            let read_ahead = self.cfg.read_ahead
                && permit == Permit::Proceed
                && batch.len() >= limit
                && ahead_limits.bytes >= limits.bytes / 2;
            let parts = lease.partitions.clone();
            let (
                Published {
                    mut outcomes,
                    unavailable,
                },
                next,
            ) = tokio::join!(self.publish(&batch, &mut lease, &permits), async {
                if !read_ahead {
                    return Ok(Vec::new());
                }
                let (read, took) = self.read_ahead(&parts, ahead_limits).await;
                self.count_claim_took(took);
                debug!(member = %self.id, rows = read.as_ref().map_or(0, Vec::len),
                       took_ms = took.as_secs_f64() * 1e3, "read ahead");
                read
            });
            ahead = self.kept_ahead(parts, next);
            self.report_circuit(&mut reported).await;
            // A probe that never reached its broker (no row for that lane, a malformed row, a
            // short lease) must not leave the circuit waiting for its verdict.
            self.probes_unused(&permits);
            if permit == Permit::Probe && !self.lanes.routed() {
                keep_probe_verdict(&mut outcomes, &unavailable);
            }
            let t_complete = Instant::now();
            self.complete(outcomes).await;
            debug!(member = %self.id, rows = batch.len(),
                   claim_ms = (t_publish - t_claim).as_secs_f64() * 1e3,
                   publish_ms = (t_complete - t_publish).as_secs_f64() * 1e3,
                   record_ms = t_complete.elapsed().as_secs_f64() * 1e3, "batch done");
        }
        self.release().await;
        self.health.pulse.stop();
    }

    /// Rebalances when it is due (or the lease runs short), and takes the partitions it gets;
    /// false when the store failed (the lease is dropped and the worker has paused).
    async fn rebalance_when_due(&self, lease: &mut Lease, backoff: &mut Backoff) -> bool {
        let now = Instant::now();
        if now < lease.next_rebalance && lease.valid_until > now + self.cfg.lease_margin() {
            return true;
        }
        match self
            .store_call("rebalance", self.store.rebalance(&self.id, self.cfg.lease))
            .await
        {
            Ok(p) => {
                store_reachable(&self.id, backoff);
                self.health.leased(p.len());
                if p != lease.partitions {
                    info!(member = %self.id, partitions = p.len(), "partitions assigned");
                }
                lease.partitions = p;
                // A rebalance may leave a lease that still had two thirds to run
                // unextended (see `Store::rebalance`): count on no more than that.
                lease.valid_until = now + self.cfg.lease * 2 / 3;
                lease.renewed_at = now;
                lease.next_rebalance = now + self.rebalance_every();
                true
            }
            Err(error) => {
                let d = backoff.failed();
                warn!(member = %self.id, %error, retry_in = ?d, "rebalance failed");
                lease.partitions.clear();
                self.health.lease_lost();
                self.pause(d).await;
                false
            }
        }
    }

    /// The next batch: the one read ahead when the store adopts it, else a claim of `limits`.
    async fn claim_or_adopt(
        &self,
        read_before: Option<(Vec<i32>, Vec<Message>)>,
        permit: Permit,
        lease: &Lease,
        limits: ClaimLimits,
        t_claim: Instant,
    ) -> Result<Vec<Message>> {
        let adopted = match read_before {
            // Read for the same partitions, the circuit still closed, and the batch before
            // it completed as the read assumed: publish it without claiming.
            Some((parts, messages))
                if permit == Permit::Proceed
                    && parts == lease.partitions
                    && self.store.adopt_ahead(&self.id).await =>
            {
                Some(messages)
            }
            // Dropped before a claim brings another batch: the two never share memory.
            other => {
                drop(other);
                None
            }
        };
        match adopted {
            Some(messages) => {
                RelayMetrics::add(&self.metrics.read_ahead, 1);
                Ok(messages)
            }
            None => {
                let claimed = self
                    .store_call(
                        "claim",
                        self.store
                            .claim(&self.id, &lease.partitions, limits, self.cfg.on_failed),
                    )
                    .await;
                self.count_claim(t_claim);
                claimed
            }
        }
    }

    /// The batch read ahead of `parts`, kept for the next iteration (`None`: nothing read, or
    /// the read failed and the next batch is claimed).
    fn kept_ahead(
        &self,
        parts: Vec<i32>,
        next: Result<Vec<Message>>,
    ) -> Option<(Vec<i32>, Vec<Message>)> {
        match next {
            Ok(messages) if !messages.is_empty() => Some((parts, messages)),
            Ok(_) => None,
            Err(error) => {
                debug!(member = %self.id, %error, "reading ahead failed; the next batch is claimed");
                None
            }
        }
    }

    /// Gives the partitions back at shutdown, so others take them at once.
    async fn release(&self) {
        if let Err(error) = self
            .store_call("release", self.store.release(&self.id))
            .await
        {
            warn!(member = %self.id, %error, "could not release partitions; they free up when the lease expires");
        } else {
            debug!(member = %self.id, "partitions released");
        }
    }

    /// Reads the next batch of `parts` ahead ([`Store::claim_ahead`]) in a task of its own, while
    /// this one publishes: the read's decoding runs on another core than the publish's
    /// encoding, and its time is its own (polled beside the publish in one task, a read that
    /// had returned waited for the publish's next pause to be seen). Dropping the returned
    /// future aborts the read, which changes nothing, as for any claim dropped mid-way.
    ///
    /// Returns the read and how long it took.
    fn read_ahead(
        &self,
        parts: &[i32],
        limits: ClaimLimits,
    ) -> impl Future<Output = (Result<Vec<Message>>, Duration)> {
        // The batch is recorded only once this read returns: bound it well inside the lease
        // margin, so a slow read ahead cannot let the lease of a published batch lapse before
        // it is recorded.
        let budget = self.cfg.store_timeout.min(self.cfg.lease_margin() / 2);
        let (store, id, parts, on_failed) = (
            self.store.clone(),
            self.id.clone(),
            parts.to_vec(),
            self.cfg.on_failed,
        );
        let task = AbortOnDropHandle::new(tokio::spawn(async move {
            let t = Instant::now();
            let read =
                tokio::time::timeout(budget, store.claim_ahead(&id, &parts, limits, on_failed))
                    .await
                    .unwrap_or_else(|_| {
                        Err(Error::new(
                            ErrorKind::Timeout,
                            format!("store claim ahead: no answer within {budget:?}; abandoned"),
                        ))
                    });
            (read, t.elapsed())
        }));
        async move {
            let started = Instant::now();
            match task.await {
                Ok(done) => done,
                // A store that panics panics the worker, as when the read ran in its task.
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                Err(e) => (
                    Err(Error::new(
                        ErrorKind::Other,
                        format!("store claim ahead: the read's task ended without an answer: {e}"),
                    )),
                    started.elapsed(),
                ),
            }
        }
    }

    /// Counts a claim statement begun at `started` (a read ahead included; a batch adopted from
    /// one is no claim of its own).
    fn count_claim(&self, started: Instant) {
        self.count_claim_took(started.elapsed());
    }

    /// Counts a claim statement that took `took`.
    fn count_claim_took(&self, took: Duration) {
        let micros = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        RelayMetrics::add(&self.metrics.claims, 1);
        RelayMetrics::add(&self.metrics.claim_micros, micros);
        self.metrics.claim_times.record(micros);
        self.engine.claim_duration.record(micros as f64 / 1e6);
    }

    /// How often to heartbeat and rebalance: at most every second, so a new member gets its
    /// share (and partitions given back find a new owner) within about a second.
    fn rebalance_every(&self) -> Duration {
        self.renew_every().min(Duration::from_secs(1))
    }

    /// How often to extend the lease while publishing a long batch.
    fn renew_every(&self) -> Duration {
        (self.cfg.lease / 3).max(Duration::from_millis(100))
    }

    /// Writes the circuit state to the member row when it changed, so `outbox status` shows an
    /// outage as the relay sees it.
    async fn report_circuit(&self, reported: &mut CircuitState) {
        let (state, error) = self.lanes.health();
        if state == *reported {
            return;
        }
        match self
            .store_call(
                "report_health",
                self.store
                    .report_health(&self.id, state.as_str(), error.as_deref()),
            )
            .await
        {
            Ok(()) => *reported = state,
            Err(error) => debug!(member = %self.id, %error, "could not record the circuit state"),
        }
    }

    /// Sleeps until `until`, a notification or shutdown.
    async fn wait_until(&mut self, until: Instant) {
        let sleep = tokio::time::sleep_until(until.into());
        tokio::select! {
            r = self.wake.changed() => {
                // A closed channel (no listener) must not turn into a busy loop.
                if r.is_err() { tokio::time::sleep_until(until.into()).await; }
            }
            _ = sleep => {}
            _ = self.shutdown.cancelled() => {}
        }
    }

    async fn pause(&self, d: Duration) {
        tokio::select! {
            _ = tokio::time::sleep(d) => {}
            _ = self.shutdown.cancelled() => {}
        }
    }

    /// Registers this member with the store before it runs (see [`Store::join`]), under the
    /// store deadline.
    pub(crate) async fn join(&self) -> Result<()> {
        self.store_call("join", self.store.join(&self.id)).await
    }

    /// One store call under the store deadline. A call without an answer by then is dropped and
    /// reported as an [`ErrorKind::Timeout`] error, so the caller takes its error path (back off
    /// and claim again, record again, treat the lease as not renewed) instead of waiting on a
    /// connection that went silent. Stores must tolerate a dropped call (see `Store`).
    async fn store_call<T>(&self, what: &str, call: impl Future<Output = Result<T>>) -> Result<T> {
        let deadline = self.cfg.store_timeout;
        // Each end of a store call is a step of the loop: the call itself is bounded by the
        // deadline, so a worker silent for longer is wedged elsewhere.
        self.health.pulse.beat();
        let answer = tokio::time::timeout(deadline, call).await;
        self.health.pulse.beat();
        match answer {
            Ok(r) => r,
            Err(_) => Err(Error::new(
                ErrorKind::Timeout,
                format!(
                    "store {what}: no answer within {deadline:?} (the store deadline); abandoned"
                ),
            )),
        }
    }

    /// Renews the lease inline when a third of it has passed; false when it cannot be trusted.
    pub(crate) async fn lease_holds(&self, lease: &mut Lease) -> bool {
        let now = Instant::now();
        if now.duration_since(lease.renewed_at) >= self.renew_every()
            || lease.valid_until <= now + self.cfg.lease_margin()
        {
            match self
                .store_call("renew", self.store.renew(&self.id, self.cfg.lease))
                .await
            {
                Ok(n) if n == lease.partitions.len() => {
                    lease.valid_until = now + self.cfg.lease;
                    lease.renewed_at = now;
                    self.health.leased(n);
                }
                Ok(_) => {
                    // A partition was taken over while we published: stop and rebalance.
                    lease.next_rebalance = now;
                    return false;
                }
                Err(error) => {
                    warn!(member = %self.id, %error, "lease renewal failed");
                }
            }
        }
        lease.valid_until > Instant::now() + self.cfg.lease_margin()
    }

    /// Completes the batch's outcomes ([`Store::complete`]), retrying the statement through
    /// short store outages. If it never succeeds the rows stay pending and are published again
    /// later (same ids): a duplicate, never a loss.
    async fn complete(&self, outcomes: Vec<Outcome>) {
        if outcomes.is_empty() {
            return;
        }
        let published = outcomes
            .iter()
            .filter(|o| matches!(o, Outcome::Published { .. }))
            .count() as u64;
        let mut backoff = Backoff::RECONNECT;
        for attempt in 1..=5 {
            let started = Instant::now();
            match self
                .store_call("complete", self.store.complete(&self.id, &outcomes))
                .await
            {
                Ok(changed) => {
                    self.engine
                        .record_duration
                        .record(started.elapsed().as_secs_f64());
                    let fenced = outcomes.len() as u64 - changed.min(outcomes.len() as u64);
                    if fenced > 0 {
                        RelayMetrics::add(&self.metrics.fenced, fenced);
                        self.engine.fenced.increment(fenced);
                        warn!(member = %self.id, fenced, "results not recorded: partitions changed owner");
                    }
                    RelayMetrics::add(&self.metrics.published, published.saturating_sub(fenced));
                    return;
                }
                Err(error) => {
                    let d = backoff.failed();
                    warn!(member = %self.id, %error, attempt, "recording results failed; retrying");
                    tokio::time::sleep(d).await;
                }
            }
        }
        warn!(member = %self.id, rows = outcomes.len(), "results not recorded; rows will be published again");
    }
}
