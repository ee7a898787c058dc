//! One relay member: owns a share of the partitions and runs claim -> publish -> mark on them.

use std::collections::{HashSet, VecDeque};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::stream::{FuturesUnordered, StreamExt};
use futures::FutureExt;
use outbox_core::retry::RetryDecision;
use outbox_core::Backoff;
use outbox_core::{
    ClaimLimits, Envelope, Error, ErrorKind, MemberId, Message, Outcome, Result, SinkError, Store,
};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;
use tracing::{debug, info, warn};

use crate::breaker::{CircuitState, Permit, MIN_COOLDOWN};
use crate::config::{RelayConfig, MIN_POLL_INTERVAL};
use crate::deliver::{envelope, key_units};
use crate::health::MemberHealth;
use crate::lane::{Lane, Lanes};
use crate::metrics::RelayMetrics;
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

/// What [`Worker::publish`] did with a batch.
struct Published {
    /// An outcome per message tried (or deferred).
    outcomes: Vec<Outcome>,
    /// Seqs of the messages that failed because the broker was unavailable (not rejected).
    unavailable: HashSet<i64>,
}

/// One `publish` call of a lane: indexes into the batch, their envelopes, and the keys whose
/// units it carries (each key at most once, with the number of its rows).
#[derive(Default)]
struct LaneCall {
    rows: Vec<usize>,
    envelopes: Vec<Envelope>,
    keys: Vec<(usize, usize)>,
}

impl LaneCall {
    /// Cuts one lane's `units` into at most `calls` calls of about equal size, never splitting
    /// a unit.
    fn cut(units: Vec<Unit>, calls: usize) -> Vec<LaneCall> {
        let total: usize = units.iter().map(|(_, m)| m.len()).sum();
        let size = total.div_ceil(calls.max(1)).max(1);
        let mut cut = Vec::new();
        let mut call = LaneCall::default();
        for (k, messages) in units {
            call.keys.push((k, messages.len()));
            for (i, e) in messages {
                call.rows.push(i);
                call.envelopes.push(e);
            }
            if call.rows.len() >= size {
                cut.push(std::mem::take(&mut call));
            }
        }
        if !call.rows.is_empty() {
            cut.push(call);
        }
        cut
    }
}

/// A key's unit ready to send: the key, and its messages (batch index and envelope).
type Unit = (usize, Vec<(usize, Envelope)>);

/// Publish calls a worker keeps in flight: what is ready to go is cut into as many calls as
/// are missing, so a key whose message was acknowledged sends its next one while the other
/// calls are still out, instead of every key waiting for the slowest message of a round.
const CALLS_IN_FLIGHT: usize = 4;

/// A claimed message routed to its lane, with its envelope built (or why it cannot be), before
/// the batch is cut into units.
enum Prepared {
    /// No route matches it and the relay has no default sink.
    NoRoute,
    /// Its lane and its envelope, or why the row cannot be published as stored.
    Routed(usize, std::result::Result<Envelope, String>),
}

/// The lease as this worker last saw it.
struct Lease {
    partitions: Vec<i32>,
    /// Local instant by which the lease expires (measured from before the renewing call).
    valid_until: Instant,
    /// When to heartbeat and rebalance next.
    next_rebalance: Instant,
    /// When the lease was last extended.
    renewed_at: Instant,
}

impl Worker {
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
            let now = Instant::now();
            if now >= lease.next_rebalance || lease.valid_until <= now + self.cfg.lease_margin() {
                match self
                    .store_call("rebalance", self.store.rebalance(&self.id, self.cfg.lease))
                    .await
                {
                    Ok(p) => {
                        store_reachable(&self.id, &mut backoff);
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
                    }
                    Err(error) => {
                        let d = backoff.failed();
                        warn!(member = %self.id, %error, retry_in = ?d, "rebalance failed");
                        lease.partitions.clear();
                        self.health.lease_lost();
                        self.pause(d).await;
                        continue;
                    }
                }
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
            // Without routing the one breaker decides the claim, as it always did: a probe claims
            // one message. With routing a claim goes ahead while any lane may publish; rows of a
            // lane that must wait are deferred at publish time.
            let permit = if let Some(d) = permits
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
            };
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
            let adopted = match read_before {
                // Read for the same partitions, the circuit still closed, and the batch before
                // it recorded as the read assumed: publish it without claiming.
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
            let claimed = match adopted {
                Some(messages) => {
                    RelayMetrics::add(&self.metrics.read_ahead, 1);
                    Ok(messages)
                }
                None => {
                    let claimed = self
                        .store_call(
                            "claim",
                            self.store.claim(
                                &self.id,
                                &lease.partitions,
                                limits,
                                self.cfg.on_failed,
                            ),
                        )
                        .await;
                    self.count_claim(t_claim);
                    claimed
                }
            };
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
            ahead = match next {
                Ok(messages) if !messages.is_empty() => Some((parts, messages)),
                Ok(_) => None,
                Err(error) => {
                    debug!(member = %self.id, %error, "reading ahead failed; the next batch is claimed");
                    None
                }
            };
            self.report_circuit(&mut reported).await;
            // A probe that never reached its broker (no row for that lane, a malformed row, a
            // short lease) must not leave the circuit waiting for its verdict.
            self.probes_unused(&permits);
            if permit == Permit::Probe && !self.lanes.routed() {
                // A probe that found the broker still unavailable says nothing about the
                // message: it spends none of its attempts (the breaker paces the next probe), so
                // a long outage cannot push head messages into `failed`. A probe the broker
                // *rejected* is recorded like any rejection: it spends an attempt, so a message
                // the broker refuses cannot be probed forever while the rest of the relay waits.
                outcomes.retain(|o| {
                    matches!(o, Outcome::Published { .. }) || !unavailable.contains(&o.seq())
                });
            }
            let t_record = Instant::now();
            self.record(outcomes).await;
            debug!(member = %self.id, rows = batch.len(),
                   claim_ms = (t_publish - t_claim).as_secs_f64() * 1e3,
                   publish_ms = (t_record - t_publish).as_secs_f64() * 1e3,
                   record_ms = t_record.elapsed().as_secs_f64() * 1e3, "batch done");
        }
        if let Err(error) = self
            .store_call("release", self.store.release(&self.id))
            .await
        {
            warn!(member = %self.id, %error, "could not release partitions; they free up when the lease expires");
        } else {
            debug!(member = %self.id, "partitions released");
        }
        self.health.pulse.stop();
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

    /// Lets the next caller probe every lane whose probe this batch did not use.
    fn probes_unused(&self, permits: &[Permit]) {
        for (lane, p) in self.lanes.0.iter().zip(permits) {
            if *p == Permit::Probe {
                lane.breaker.probe_unused();
            }
        }
    }

    /// Publishes `batch` with several calls in flight, each key's units one after another:
    /// a key's next unit goes out only once its previous one was acknowledged, so at most one
    /// message per key is in flight (one run per key and destination for a lane whose sink
    /// orders keys), while other keys' calls are still out. Returns an outcome for every
    /// message that was tried or deferred; the rest (later messages of a key that failed or
    /// waits, or messages not sent because the lease ran short) get none and stay pending
    /// untouched.
    ///
    /// `permits` are the lanes' breakers' answers for this batch. A lane that must wait, or
    /// whose one probe is already spoken for, gets its messages deferred: they wait with their
    /// keys, spending no attempt, while the other lanes publish.
    ///
    /// A call's results are taken per key in order up to the key's first failure; the key's
    /// later messages in that call (a run, for a sink that orders keys) get no outcome
    /// whatever the sink said (see `Sink::orders_keys`). A call is only sent while the lease
    /// holds (see [`Worker::lease_holds`]), so every call ends within it.
    async fn publish(&self, batch: &[Message], lease: &mut Lease, permits: &[Permit]) -> Published {
        let lanes = &self.lanes.0;
        let mut outcomes = Vec::with_capacity(batch.len());
        let mut unavailable = HashSet::new();
        let mut probe_taken = vec![false; lanes.len()];
        // Routed and built up front: grouping a key's messages by lane and destination needs
        // both.
        let mut prepared: Vec<Option<Prepared>> = batch
            .iter()
            .map(|m| {
                Some(match self.lanes.pick(m) {
                    None => Prepared::NoRoute,
                    Some(l) => Prepared::Routed(
                        l,
                        envelope(m, &lanes[l].destination, &self.cfg.destination_rules),
                    ),
                })
            })
            .collect();
        let mut keys = key_units(batch, |p, i| match (&prepared[p], &prepared[i]) {
            (Some(Prepared::Routed(a, Ok(x))), Some(Prepared::Routed(b, Ok(y)))) => {
                a == b && lanes[*a].sink.orders_keys() && x.destination == y.destination
            }
            _ => false,
        });
        // Keys whose next unit may be sent now, in order of their first message.
        let mut ready: VecDeque<usize> = (0..keys.len()).collect();
        let mut in_flight = FuturesUnordered::new();
        let mut sending = true;
        loop {
            if sending && !ready.is_empty() && !self.lease_holds(lease).await {
                warn!(member = %self.id, "lease ran short mid-batch; leaving the rest for the next claim");
                sending = false;
            }
            if sending {
                // Per lane, the units to send now.
                let mut units: Vec<Vec<Unit>> = (0..lanes.len()).map(|_| Vec::new()).collect();
                while let Some(k) = ready.pop_front() {
                    let Some(unit) = keys[k].pop_front() else {
                        continue;
                    };
                    let mut sent: Option<(usize, Vec<(usize, Envelope)>)> = None;
                    for i in unit {
                        let m = &batch[i];
                        let Some(Prepared::Routed(l, built)) = prepared[i].take() else {
                            let names: Vec<&str> = lanes.iter().map(|l| l.name.as_str()).collect();
                            let why = format!(
                                "no route matches this row (aggregate_type `{}`, event_type `{}`, \
                                 topic {:?}) and the relay has no default sink; routes: {}",
                                m.aggregate_type,
                                m.event_type,
                                m.topic.as_deref().unwrap_or(""),
                                names.join(", ")
                            );
                            warn!(member = %self.id, id = %m.id, error = %why, "message has no route");
                            outcomes.push(self.failure(m, SinkError::invalid(why), None));
                            keys[k].clear();
                            break;
                        };
                        let lane = &lanes[l];
                        let defer = match permits.get(l).copied().unwrap_or(Permit::Proceed) {
                            Permit::Proceed => None,
                            Permit::Probe if !probe_taken[l] => {
                                probe_taken[l] = true;
                                None
                            }
                            Permit::Probe => Some(MIN_COOLDOWN),
                            Permit::Wait(d) => Some(d),
                        };
                        if let Some(delay) = defer {
                            outcomes.push(self.deferral(m, lane, delay));
                            keys[k].clear();
                            break;
                        }
                        match built {
                            // A unit holds one lane's messages (see `key_units`).
                            Ok(e) => sent.get_or_insert_with(|| (l, Vec::new())).1.push((i, e)),
                            Err(why) => {
                                warn!(member = %self.id, id = %m.id, error = %why, "message cannot be published as stored");
                                lane.metrics
                                    .error(outbox_core::SinkErrorKind::Invalid)
                                    .increment(1);
                                outcomes.push(self.failure(m, SinkError::invalid(why), Some(lane)));
                                keys[k].clear();
                                break;
                            }
                        }
                    }
                    // What went out of a unit cut short stays in flight; the key has nothing
                    // after it (cleared above), so it stops once that is answered.
                    if let Some((l, messages)) = sent {
                        units[l].push((k, messages));
                    }
                }
                // As many calls as are missing from the window (one at least).
                let calls = CALLS_IN_FLIGHT.saturating_sub(in_flight.len()).max(1);
                for (l, lane_units) in units.into_iter().enumerate() {
                    for call in LaneCall::cut(lane_units, calls) {
                        in_flight.push(self.send_call(l, call));
                    }
                }
            }
            let Some(first) = in_flight.next().await else {
                break;
            };
            // Every call already answered, so that the keys they free go out together.
            let mut answered = vec![first];
            while let Some(Some(more)) = in_flight.next().now_or_never() {
                answered.push(more);
            }
            self.health.pulse.beat();
            let acked_at = chrono::Utc::now();
            for (l, call, results) in answered {
                let lane = &lanes[l];
                lane.breaker.record(
                    results.iter().any(Result::is_ok),
                    results
                        .iter()
                        .find_map(|r| r.as_ref().err().filter(|e| e.is_unavailable()))
                        .map(|e| e.message.as_str()),
                );
                let retry_first = outcomes.len();
                let probing = permits.get(l) == Some(&Permit::Probe) && self.lanes.routed();
                let mut results = results.into_iter();
                let mut rows = call.rows.into_iter();
                for (k, n) in call.keys {
                    // The key's rows in this call, in order, up to its first failure: the rest
                    // get no outcome and go again after the failed one, whatever the sink said.
                    let mut failed = false;
                    for i in rows.by_ref().take(n) {
                        let result = results.next();
                        if failed {
                            continue;
                        }
                        let m = &batch[i];
                        let result = result.unwrap_or_else(|| {
                            // A sink bug, not an outage: spend attempts rather than open the
                            // circuit.
                            Err(SinkError::rejected(format!(
                                "sink `{}` returned no result for this message",
                                lane.sink.name()
                            )))
                        });
                        match &result {
                            Ok(()) => {
                                lane.metrics.published.increment(1);
                                let waited = (acked_at - m.created_at).num_microseconds();
                                lane.metrics
                                    .latency
                                    .record(waited.unwrap_or(0).max(0) as f64 / 1e6);
                            }
                            Err(e) => lane.metrics.error(e.kind).increment(1),
                        }
                        match result {
                            Ok(()) => outcomes.push(Outcome::Published { seq: m.seq }),
                            // A routed probe that found its broker still down says nothing
                            // about the message: it waits for the next probe without spending
                            // an attempt.
                            Err(e) if probing && e.is_unavailable() => {
                                failed = true;
                                outcomes.push(self.deferral(m, lane, MIN_COOLDOWN));
                            }
                            Err(e) => {
                                failed = true;
                                if e.is_unavailable() {
                                    unavailable.insert(m.seq);
                                }
                                outcomes.push(self.failure(m, e, Some(lane)));
                            }
                        }
                    }
                    if failed {
                        keys[k].clear();
                    } else if !keys[k].is_empty() {
                        ready.push_back(k);
                    }
                }
                let retried: Vec<&Outcome> = outcomes[retry_first..]
                    .iter()
                    .filter(|o| matches!(o, Outcome::Retry { .. }))
                    .collect();
                if let Some(Outcome::Retry { error, delay, .. }) = retried.first() {
                    warn!(member = %self.id, sink = lane.sink.name(), route = %lane.name,
                          messages = retried.len(), %error, first_retry_in = ?delay,
                          "publish failed; those messages and their keys will retry");
                }
            }
        }
        Published {
            outcomes,
            unavailable,
        }
    }

    /// Sends `call` through lane `l`; answers with the lane and the call, for its results.
    async fn send_call(
        &self,
        l: usize,
        call: LaneCall,
    ) -> (usize, LaneCall, Vec<Result<(), SinkError>>) {
        let lane = &self.lanes.0[l];
        let started = Instant::now();
        let span = crate::spans::PublishSpan::start(lane.sink.name(), &lane.name, &call.envelopes);
        let results = self.publish_call(lane, &call.envelopes).await;
        span.end(&results);
        lane.metrics
            .publish_duration
            .record(started.elapsed().as_secs_f64());
        (l, call, results)
    }

    /// The outcome of a message whose lane may not publish now: it waits `delay` with its key,
    /// spending no attempt.
    fn deferral(&self, m: &Message, lane: &Lane, delay: Duration) -> Outcome {
        RelayMetrics::add(&self.metrics.deferred, 1);
        lane.metrics.deferred.increment(1);
        let (_, error) = lane.breaker.snapshot();
        Outcome::Deferred {
            seq: m.seq,
            error: format!(
                "sink `{}` of route `{}` is unavailable (circuit open){}",
                lane.sink.name(),
                lane.name,
                error.map(|e| format!(": {e}")).unwrap_or_default()
            ),
            delay: delay.max(Duration::from_millis(100)),
        }
    }

    /// One `publish` call of `lane` under its publish deadline. A call without every answer by
    /// then is dropped, and each of its messages counts as unavailable: retried (the broker may
    /// have taken some, so they can arrive twice, with the same id) and fed to the lane's
    /// circuit breaker.
    async fn publish_call(
        &self,
        lane: &Lane,
        envelopes: &[Envelope],
    ) -> Vec<Result<(), SinkError>> {
        let deadline = lane.publish_deadline;
        match tokio::time::timeout(deadline, lane.sink.publish(envelopes)).await {
            Ok(results) => results,
            Err(_) => {
                let e = SinkError::unavailable(format!(
                    "sink `{}` gave no answer within {deadline:?} (the publish deadline); \
                     the message is published again later with the same id",
                    lane.sink.name()
                ));
                envelopes.iter().map(|_| Err(e.clone())).collect()
            }
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
    async fn lease_holds(&self, lease: &mut Lease) -> bool {
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

    /// The outcome of a failed attempt, counted for `lane` (`None`: the row matched no route).
    /// Retries are logged once per call by the caller (an outage fails thousands of messages;
    /// one line says it); final failures one by one.
    fn failure(&self, m: &Message, e: SinkError, lane: Option<&Lane>) -> Outcome {
        let attempts = u32::try_from(m.attempts).unwrap_or(0).saturating_add(1);
        match self.cfg.retry.decide(attempts, e.retriable()) {
            RetryDecision::RetryAfter(delay) => {
                // The broker's own `Retry-After`, when it gave one, is a floor.
                let delay = e.retry_after.map_or(delay, |wait| delay.max(wait));
                RelayMetrics::add(&self.metrics.retried, 1);
                if let Some(lane) = lane {
                    lane.metrics.retries.increment(1);
                }
                debug!(member = %self.id, id = %m.id, aggregate_id = %m.aggregate_id, attempts, error = %e.message,
                       kind = %e.kind, retry_in = ?delay, "publish failed; will retry");
                Outcome::Retry {
                    seq: m.seq,
                    error: e.message,
                    delay,
                }
            }
            RetryDecision::Fail => {
                RelayMetrics::add(&self.metrics.failed, 1);
                match lane {
                    Some(lane) => lane.metrics.failed.increment(1),
                    None => self.engine.unrouted_failed.increment(1),
                }
                warn!(member = %self.id, id = %m.id, aggregate_id = %m.aggregate_id, attempts, error = %e.message,
                      kind = %e.kind, "message failed; it stays in the outbox as `failed`");
                Outcome::Failed {
                    seq: m.seq,
                    error: e.message,
                }
            }
        }
    }

    /// Records outcomes, retrying the statement through short store outages. If it never
    /// succeeds the rows stay pending and are published again later (same ids): a duplicate,
    /// never a loss.
    async fn record(&self, outcomes: Vec<Outcome>) {
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
