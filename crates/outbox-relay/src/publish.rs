//! A relay member's publish: a claimed batch routed to its lanes, cut into calls with several in
//! flight and at most one unit per key out at a time, and each answer turned into the outcomes
//! the worker then completes ([`Store::complete`](outbox_core::Store::complete)).

use std::collections::{HashSet, VecDeque};
use std::time::{Duration, Instant};

use futures::stream::{FuturesUnordered, StreamExt};
use futures::FutureExt;
use outbox_core::retry::RetryDecision;
use outbox_core::{Envelope, Message, Outcome, SinkError};
use tracing::{debug, warn};

use crate::breaker::{Permit, MIN_COOLDOWN};
use crate::deliver::{envelope, key_units};
use crate::lane::Lane;
use crate::metrics::RelayMetrics;
use crate::worker::{Lease, Worker};

/// What [`Worker::publish`] did with a batch.
pub(crate) struct Published {
    /// An outcome per message tried (or deferred).
    pub(crate) outcomes: Vec<Outcome>,
    /// Seqs of the messages that failed because the broker was unavailable (not rejected).
    pub(crate) unavailable: HashSet<i64>,
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

/// A batch's publish under way: what each message was routed to, each key's units still to
/// send, the keys that may send their next unit now, and the outcomes so far.
struct Round<'b> {
    batch: &'b [Message],
    /// The lanes' breakers' answers for this batch.
    permits: &'b [Permit],
    /// Each message's lane and envelope, taken when its unit goes out.
    prepared: Vec<Option<Prepared>>,
    /// Each key's units, in order (see `key_units`).
    keys: Vec<VecDeque<Vec<usize>>>,
    /// Keys whose next unit may be sent now.
    ready: VecDeque<usize>,
    /// Lanes whose one probe this batch has used.
    probe_taken: Vec<bool>,
    outcomes: Vec<Outcome>,
    unavailable: HashSet<i64>,
}

impl Worker {
    /// Lets the next caller probe every lane whose probe this batch did not use.
    pub(crate) fn probes_unused(&self, permits: &[Permit]) {
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
    pub(crate) async fn publish(
        &self,
        batch: &[Message],
        lease: &mut Lease,
        permits: &[Permit],
    ) -> Published {
        let mut round = self.prepare(batch, permits);
        let mut in_flight = FuturesUnordered::new();
        let mut sending = true;
        loop {
            if sending && !round.ready.is_empty() && !self.lease_holds(lease).await {
                warn!(member = %self.id, "lease ran short mid-batch; leaving the rest for the next claim");
                sending = false;
            }
            if sending {
                let units = self.units_to_send(&mut round);
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
                self.take_answer(&mut round, l, call, results, acked_at);
            }
        }
        Published {
            outcomes: round.outcomes,
            unavailable: round.unavailable,
        }
    }

    /// Routes every message of `batch` and builds its envelope, then groups the batch into
    /// each key's units: the start of [`Worker::publish`], every key ready.
    fn prepare<'b>(&self, batch: &'b [Message], permits: &'b [Permit]) -> Round<'b> {
        let lanes = &self.lanes.0;
        // Routed and built up front: grouping a key's messages by lane and destination needs
        // both.
        let prepared: Vec<Option<Prepared>> = batch
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
        let keys = key_units(batch, |p, i| match (&prepared[p], &prepared[i]) {
            (Some(Prepared::Routed(a, Ok(x))), Some(Prepared::Routed(b, Ok(y)))) => {
                a == b && lanes[*a].sink.orders_keys() && x.destination == y.destination
            }
            _ => false,
        });
        Round {
            batch,
            permits,
            prepared,
            // Keys whose next unit may be sent now, in order of their first message.
            ready: (0..keys.len()).collect(),
            keys,
            probe_taken: vec![false; lanes.len()],
            outcomes: Vec::with_capacity(batch.len()),
            unavailable: HashSet::new(),
        }
    }

    /// Takes the next unit of every ready key: per lane, the units to send now. A message with
    /// no route, one its lane's breaker defers, or one that cannot be published as stored gets
    /// its outcome here and ends its key's round.
    fn units_to_send(&self, round: &mut Round<'_>) -> Vec<Vec<Unit>> {
        let lanes = &self.lanes.0;
        let mut units: Vec<Vec<Unit>> = (0..lanes.len()).map(|_| Vec::new()).collect();
        while let Some(k) = round.ready.pop_front() {
            let Some(unit) = round.keys[k].pop_front() else {
                continue;
            };
            let mut sent: Option<(usize, Vec<(usize, Envelope)>)> = None;
            for i in unit {
                let m = &round.batch[i];
                let Some(Prepared::Routed(l, built)) = round.prepared[i].take() else {
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
                    round
                        .outcomes
                        .push(self.failure(m, SinkError::invalid(why), None));
                    round.keys[k].clear();
                    break;
                };
                let lane = &lanes[l];
                let defer = match round.permits.get(l).copied().unwrap_or(Permit::Proceed) {
                    Permit::Proceed => None,
                    Permit::Probe if !round.probe_taken[l] => {
                        round.probe_taken[l] = true;
                        None
                    }
                    Permit::Probe => Some(MIN_COOLDOWN),
                    Permit::Wait(d) => Some(d),
                };
                if let Some(delay) = defer {
                    round.outcomes.push(self.deferral(m, lane, delay));
                    round.keys[k].clear();
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
                        round
                            .outcomes
                            .push(self.failure(m, SinkError::invalid(why), Some(lane)));
                        round.keys[k].clear();
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
        units
    }

    /// Takes the `results` of `call` through lane `l` (acknowledged at `acked_at`): each key's
    /// rows in order up to its first failure get their outcome; a key with no failure and more
    /// units is ready again.
    fn take_answer(
        &self,
        round: &mut Round<'_>,
        l: usize,
        call: LaneCall,
        results: Vec<Result<(), SinkError>>,
        acked_at: chrono::DateTime<chrono::Utc>,
    ) {
        let lane = &self.lanes.0[l];
        lane.breaker.record(
            results.iter().any(Result::is_ok),
            results
                .iter()
                .find_map(|r| r.as_ref().err().filter(|e| e.is_unavailable()))
                .map(|e| e.message.as_str()),
        );
        let retry_first = round.outcomes.len();
        let probing = round.permits.get(l) == Some(&Permit::Probe) && self.lanes.routed();
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
                let m = &round.batch[i];
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
                    Ok(()) => round.outcomes.push(Outcome::Published { seq: m.seq }),
                    // A routed probe that found its broker still down says nothing
                    // about the message: it waits for the next probe without spending
                    // an attempt.
                    Err(e) if probing && e.is_unavailable() => {
                        failed = true;
                        round.outcomes.push(self.deferral(m, lane, MIN_COOLDOWN));
                    }
                    Err(e) => {
                        failed = true;
                        if e.is_unavailable() {
                            round.unavailable.insert(m.seq);
                        }
                        round.outcomes.push(self.failure(m, e, Some(lane)));
                    }
                }
            }
            if failed {
                round.keys[k].clear();
            } else if !round.keys[k].is_empty() {
                round.ready.push_back(k);
            }
        }
        let retried: Vec<&Outcome> = round.outcomes[retry_first..]
            .iter()
            .filter(|o| matches!(o, Outcome::Retry { .. }))
            .collect();
        if let Some(Outcome::Retry { error, delay, .. }) = retried.first() {
            warn!(member = %self.id, sink = lane.sink.name(), route = %lane.name,
                  messages = retried.len(), %error, first_retry_in = ?delay,
                  "publish failed; those messages and their keys will retry");
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
}
