//! Liveness and readiness of a running relay, as the `/livez` and `/readyz` probes of
//! `outbox-observe` read them.
//!
//! **Liveness.** Each worker beats its [`Pulse`] whenever it finishes a step of its loop: a
//! store call, a publish call's answer, a pause, a turn of the loop. Every step is bounded (a
//! store call by the store deadline, a publish call by its publish deadline, a pause by the
//! reconnect backoff's 10 s, a wait for work by the next rebalance, at most a second away), so
//! a worker that stays silent for longer than [`RelayHealth::live_bound`] is wedged: a blocking
//! call inside async code, a deadlock, a loop that never yields. Nothing the relay does by
//! itself gets it out; a restart does.
//!
//! **Readiness.** A member can make progress when its last lease call (a rebalance or a renew)
//! succeeded within the lease, whether the store gave it partitions or none because the other
//! members hold their fair share, and not every sink's circuit has been open for longer than
//! the caller's threshold. Whether the database answers right now is the probe's own round trip
//! (`Store::ping`), not judged here.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::breaker::{Breaker, CircuitState};

/// A loop's heartbeat: when it last finished a step. Cheap to beat (one relaxed store).
#[derive(Debug)]
pub struct Pulse {
    epoch: Instant,
    /// Milliseconds since `epoch` at the last beat.
    last_ms: AtomicU64,
    stopped: AtomicBool,
}

impl Default for Pulse {
    fn default() -> Self {
        Self::new()
    }
}

impl Pulse {
    /// A pulse that beat just now.
    pub fn new() -> Self {
        Self {
            epoch: Instant::now(),
            last_ms: AtomicU64::new(0),
            stopped: AtomicBool::new(false),
        }
    }

    /// The loop finished a step now.
    pub fn beat(&self) {
        let ms = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    /// The loop ended on purpose (shutdown): it is no longer judged.
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::Relaxed);
    }

    /// How long since the last beat; `None` once stopped.
    pub fn silent_for(&self) -> Option<Duration> {
        if self.stopped.load(Ordering::Relaxed) {
            return None;
        }
        let last = Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
        Some(self.epoch.elapsed().saturating_sub(last))
    }
}

/// One worker (relay member) as the probes and the metrics see it.
#[derive(Debug)]
pub struct MemberHealth {
    /// The member id (as `outbox status` shows it).
    pub member: String,
    /// The worker's slot in its relay (0-based); a worker restarted after a panic keeps it.
    pub slot: usize,
    /// Beaten at every step of the worker's loop.
    pub pulse: Pulse,
    partitions: AtomicUsize,
    /// Milliseconds since `pulse`'s epoch of the last successful rebalance or renew, plus one
    /// (0: never).
    lease_ok_ms: AtomicU64,
}

impl MemberHealth {
    pub(crate) fn new(member: String, slot: usize) -> Self {
        Self {
            member,
            slot,
            pulse: Pulse::new(),
            partitions: AtomicUsize::new(0),
            lease_ok_ms: AtomicU64::new(0),
        }
    }

    /// A rebalance or renew succeeded; the member owns `partitions` partitions now.
    pub(crate) fn leased(&self, partitions: usize) {
        self.partitions.store(partitions, Ordering::Relaxed);
        let ms = u64::try_from(self.pulse.epoch.elapsed().as_millis()).unwrap_or(u64::MAX - 1);
        self.lease_ok_ms.store(ms + 1, Ordering::Relaxed);
    }

    /// A rebalance failed: the member counts on no partition until the next one succeeds.
    pub(crate) fn lease_lost(&self) {
        self.partitions.store(0, Ordering::Relaxed);
    }

    /// Partitions the member owns, as of its last lease call.
    pub fn partitions(&self) -> usize {
        self.partitions.load(Ordering::Relaxed)
    }

    /// How long since its last successful rebalance or renew; `None` before the first.
    pub fn since_lease_ok(&self) -> Option<Duration> {
        match self.lease_ok_ms.load(Ordering::Relaxed) {
            0 => None,
            ms => Some(
                self.pulse
                    .epoch
                    .elapsed()
                    .saturating_sub(Duration::from_millis(ms - 1)),
            ),
        }
    }
}

/// A sink's circuit as the probes and the metrics see it.
#[derive(Debug, Clone, PartialEq)]
pub struct CircuitView {
    /// Route name (`default` for the relay's `--sink`).
    pub route: String,
    /// The sink's name (`nats`, `kafka`, …).
    pub sink: String,
    /// Circuit state.
    pub state: CircuitState,
    /// How long it has been open or half-open; `None` while closed.
    pub open_for: Option<Duration>,
}

/// A probe's answer: whether it passed, and one line per check (the HTTP body).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// Every check passed.
    pub ok: bool,
    /// What each check found, failures first.
    pub lines: Vec<String>,
}

impl Verdict {
    /// A verdict from checks: `(passed, what it found)`.
    pub fn of(checks: Vec<(bool, String)>) -> Self {
        let ok = checks.iter().all(|(pass, _)| *pass);
        let mut lines: Vec<(bool, String)> = checks;
        lines.sort_by_key(|(pass, _)| *pass);
        Self {
            ok,
            lines: lines
                .into_iter()
                .map(|(pass, line)| format!("{} {line}", if pass { "ok" } else { "FAIL" }))
                .collect(),
        }
    }

    /// Both verdicts' checks.
    pub fn and(mut self, other: Verdict) -> Self {
        self.ok &= other.ok;
        self.lines.extend(other.lines);
        self.lines.sort_by_key(|l| !l.starts_with("FAIL"));
        self
    }
}

/// The health of one relay: its workers and its sinks' circuits. Shared between the relay (which
/// updates it) and whoever serves the probes.
pub struct RelayHealth {
    members: Mutex<Vec<Arc<MemberHealth>>>,
    circuits: Vec<(String, Arc<Breaker>)>,
    live_bound: Duration,
    lease: Duration,
}

impl std::fmt::Debug for RelayHealth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RelayHealth")
            .field("members", &self.members())
            .field("circuits", &self.circuits())
            .finish_non_exhaustive()
    }
}

impl RelayHealth {
    pub(crate) fn new(
        circuits: Vec<(String, Arc<Breaker>)>,
        live_bound: Duration,
        lease: Duration,
    ) -> Self {
        Self {
            members: Mutex::new(Vec::new()),
            circuits,
            live_bound,
            lease,
        }
    }

    /// Registers the worker of `slot` (replacing a predecessor that panicked).
    pub(crate) fn register(&self, member: Arc<MemberHealth>) {
        if let Ok(mut m) = self.members.lock() {
            m.retain(|old| old.slot != member.slot);
            m.push(member);
            m.sort_by_key(|h| h.slot);
        }
    }

    /// The workers, by slot.
    pub fn members(&self) -> Vec<Arc<MemberHealth>> {
        self.members.lock().map(|m| m.clone()).unwrap_or_default()
    }

    /// Every sink's circuit, one per route.
    pub fn circuits(&self) -> Vec<CircuitView> {
        self.circuits
            .iter()
            .map(|(route, b)| CircuitView {
                route: route.clone(),
                sink: b.sink().to_string(),
                state: b.snapshot().0,
                open_for: b.not_closed_for(),
            })
            .collect()
    }

    /// How long a worker may stay silent before `/livez` fails (see the module documentation).
    pub fn live_bound(&self) -> Duration {
        self.live_bound
    }

    /// `/livez`: every worker finished a step within [`RelayHealth::live_bound`]. A relay with
    /// no worker registered yet is live (it is starting).
    pub fn liveness(&self) -> Verdict {
        let bound = self.live_bound;
        Verdict::of(
            self.members()
                .iter()
                .filter_map(|m| {
                    let silent = m.pulse.silent_for()?;
                    Some((
                        silent <= bound,
                        format!(
                            "worker {} ({}): last step {:.1}s ago (bound {:.0}s)",
                            m.slot,
                            m.member,
                            silent.as_secs_f64(),
                            bound.as_secs_f64()
                        ),
                    ))
                })
                .collect(),
        )
    }

    /// `/readyz`, without the database round trip: every worker's last lease call succeeded
    /// within the lease (it holds partitions, or waits for its fair share), and at least one
    /// sink's circuit has not been open for longer than `unready_after`.
    pub fn readiness(&self, unready_after: Duration) -> Verdict {
        let members = self.members();
        let mut checks = Vec::new();
        if members.is_empty() {
            checks.push((false, "no worker started yet".to_string()));
        }
        for m in &members {
            if m.pulse.silent_for().is_none() {
                continue; // stopped: shutting down
            }
            checks.push(match m.since_lease_ok() {
                None => (
                    false,
                    format!(
                        "worker {} ({}): no partition lease taken yet",
                        m.slot, m.member
                    ),
                ),
                Some(d) if d > self.lease => (
                    false,
                    format!(
                        "worker {} ({}): no successful rebalance or renew for {:.1}s (lease {:.0}s)",
                        m.slot,
                        m.member,
                        d.as_secs_f64(),
                        self.lease.as_secs_f64()
                    ),
                ),
                Some(_) if m.partitions() == 0 => (
                    true,
                    format!(
                        "worker {} ({}): waiting for its fair share of partitions",
                        m.slot, m.member
                    ),
                ),
                Some(_) => (
                    true,
                    format!(
                        "worker {} ({}): owns {} partitions",
                        m.slot,
                        m.member,
                        m.partitions()
                    ),
                ),
            });
        }
        let circuits = self.circuits();
        let down = circuits
            .iter()
            .filter(|c| c.open_for.is_some_and(|d| d > unready_after))
            .count();
        let said: Vec<String> = circuits
            .iter()
            .map(|c| match c.open_for {
                None => format!("{}={} closed", c.route, c.sink),
                Some(d) => format!(
                    "{}={} {} for {:.1}s",
                    c.route,
                    c.sink,
                    c.state.as_str(),
                    d.as_secs_f64()
                ),
            })
            .collect();
        checks.push((
            circuits.is_empty() || down < circuits.len(),
            format!(
                "sinks: {} (unready when every circuit is open longer than {:.0}s)",
                said.join(", "),
                unready_after.as_secs_f64()
            ),
        ));
        Verdict::of(checks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_silent_worker_fails_liveness_and_a_stopped_one_is_not_judged() {
        let h = RelayHealth::new(
            Vec::new(),
            Duration::from_millis(50),
            Duration::from_secs(3),
        );
        let m = Arc::new(MemberHealth::new("m0".into(), 0));
        h.register(m.clone());
        assert!(h.liveness().ok);
        std::thread::sleep(Duration::from_millis(80));
        let v = h.liveness();
        assert!(!v.ok, "{v:?}");
        assert!(v.lines[0].starts_with("FAIL worker 0 (m0)"), "{v:?}");
        m.pulse.beat();
        assert!(h.liveness().ok);
        std::thread::sleep(Duration::from_millis(80));
        m.pulse.stop();
        assert!(h.liveness().ok, "a stopped loop is not wedged");
    }

    #[test]
    fn readiness_needs_a_lease_call_and_one_circuit_not_long_open() {
        let b = Arc::new(Breaker::new("test", 1));
        let h = RelayHealth::new(
            vec![("default".into(), b.clone())],
            Duration::from_secs(30),
            Duration::from_secs(3),
        );
        assert!(!h.readiness(Duration::ZERO).ok, "no worker yet");
        let m = Arc::new(MemberHealth::new("m0".into(), 0));
        h.register(m.clone());
        assert!(!h.readiness(Duration::ZERO).ok, "no lease yet");
        m.leased(0);
        let v = h.readiness(Duration::ZERO);
        assert!(v.ok, "waiting for a fair share is ready: {v:?}");
        b.record(false, Some("down"));
        std::thread::sleep(Duration::from_millis(5));
        let v = h.readiness(Duration::ZERO);
        assert!(!v.ok, "{v:?}");
        assert!(
            h.readiness(Duration::from_secs(60)).ok,
            "not open for long yet"
        );
        b.record(true, None);
        assert!(h.readiness(Duration::ZERO).ok);
    }
}
