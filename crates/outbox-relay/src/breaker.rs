//! Circuit breaker per sink: after consecutive publishes that found the broker unavailable the
//! relay stops hammering it, probes with one message after a growing pause, and resumes at full
//! speed when the broker answers.
//!
//! Only [`SinkErrorKind::Unavailable`](outbox_core::SinkErrorKind::Unavailable) feeds it. A
//! rejected or invalid message says the broker is up and refused *that* message: counting it would
//! let one bad message pause every subject, and a probe that picked it would never end.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use tracing::{info, warn};

/// Publish calls in a row that found the broker unavailable and open the circuit.
pub const DEFAULT_THRESHOLD: u32 = 5;
/// First pause after the circuit opens.
pub const MIN_COOLDOWN: Duration = Duration::from_millis(500);
/// Longest pause between probes.
pub const MAX_COOLDOWN: Duration = Duration::from_secs(30);
/// A probe without a verdict after this long is given up, and the next caller probes.
pub const PROBE_DEADLINE: Duration = Duration::from_secs(60);

/// What a worker may do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Permit {
    /// Circuit closed: claim and publish normally.
    Proceed,
    /// Circuit half-open: publish one message to see whether the broker is back.
    Probe,
    /// Circuit open: do not touch the broker for this long.
    Wait(Duration),
}

/// Circuit state, for logs and `outbox status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CircuitState {
    /// Publishing normally.
    Closed,
    /// Broker considered down; waiting before the next probe.
    Open,
    /// One probe in flight.
    HalfOpen,
}

impl CircuitState {
    /// `closed`, `open` or `half-open`.
    pub fn as_str(self) -> &'static str {
        match self {
            CircuitState::Closed => "closed",
            CircuitState::Open => "open",
            CircuitState::HalfOpen => "half-open",
        }
    }
}

struct Inner {
    state: CircuitState,
    consecutive: u32,
    cooldown: Duration,
    reopen_at: Instant,
    probe_started: Instant,
    last_error: Option<String>,
    /// When the circuit last left `Closed` (`None` while closed): how long the sink has been
    /// considered down, for metrics and the readiness probe.
    opened_at: Option<Instant>,
}

/// One breaker per sink, shared by the workers of a relay process.
pub struct Breaker {
    sink: String,
    threshold: u32,
    inner: Mutex<Inner>,
}

impl Breaker {
    /// A closed breaker for `sink` that opens after `threshold` failed calls in a row.
    pub fn new(sink: &str, threshold: u32) -> Self {
        Self {
            sink: sink.to_string(),
            threshold: threshold.max(1),
            inner: Mutex::new(Inner {
                state: CircuitState::Closed,
                consecutive: 0,
                cooldown: MIN_COOLDOWN,
                reopen_at: Instant::now(),
                probe_started: Instant::now(),
                last_error: None,
                opened_at: None,
            }),
        }
    }

    /// Asks whether to publish now.
    pub fn permit(&self) -> Permit {
        let Ok(mut s) = self.inner.lock() else {
            return Permit::Proceed;
        };
        match s.state {
            CircuitState::Closed => Permit::Proceed,
            // Another worker is probing: wait for its verdict, unless the probe is lost (its
            // worker died or its publish never returned).
            CircuitState::HalfOpen if s.probe_started.elapsed() > PROBE_DEADLINE => {
                s.probe_started = Instant::now();
                Permit::Probe
            }
            CircuitState::HalfOpen => Permit::Wait(Duration::from_millis(100)),
            CircuitState::Open => {
                let now = Instant::now();
                if now >= s.reopen_at {
                    s.state = CircuitState::HalfOpen;
                    s.probe_started = now;
                    Permit::Probe
                } else {
                    Permit::Wait(s.reopen_at - now)
                }
            }
        }
    }

    /// Records one publish call: `any_ok` when the broker accepted something, `unavailable` (the
    /// error) when nothing was accepted and at least one message failed because the broker is
    /// unavailable. Calls whose messages were only rejected change nothing: the broker answered.
    pub fn record(&self, any_ok: bool, unavailable: Option<&str>) {
        let Ok(mut s) = self.inner.lock() else { return };
        if any_ok {
            if s.state != CircuitState::Closed {
                info!(sink = %self.sink, "circuit closed: the broker answers again; publishing at full speed");
            }
            s.state = CircuitState::Closed;
            s.consecutive = 0;
            s.cooldown = MIN_COOLDOWN;
            s.last_error = None;
            s.opened_at = None;
            return;
        }
        let Some(error) = unavailable else {
            if s.state == CircuitState::HalfOpen {
                // A rejected probe says nothing about the broker's health: let the next probe
                // (another message: this one spent an attempt and backs off) decide.
                s.state = CircuitState::Open;
                s.reopen_at = Instant::now();
            }
            return;
        };
        s.consecutive = s.consecutive.saturating_add(1);
        s.last_error = Some(error.to_string());
        match s.state {
            CircuitState::HalfOpen => {
                s.cooldown = (s.cooldown * 2).min(MAX_COOLDOWN);
                s.state = CircuitState::Open;
                s.reopen_at = Instant::now() + s.cooldown;
                warn!(sink = %self.sink, %error, next_probe_in = ?s.cooldown, "circuit stays open: probe failed");
            }
            CircuitState::Closed if s.consecutive >= self.threshold => {
                s.state = CircuitState::Open;
                s.opened_at = Some(Instant::now());
                s.reopen_at = Instant::now() + s.cooldown;
                warn!(sink = %self.sink, %error, failures = s.consecutive, next_probe_in = ?s.cooldown,
                      "circuit opened: the broker keeps failing; pausing publishes");
            }
            _ => {}
        }
    }

    /// The probe granted by [`Breaker::permit`] was not used (nothing was due to publish): let
    /// the next caller probe instead, rather than waiting for a verdict that never comes.
    pub fn probe_unused(&self) {
        if let Ok(mut s) = self.inner.lock() {
            if s.state == CircuitState::HalfOpen {
                s.state = CircuitState::Open;
                s.reopen_at = Instant::now();
            }
        }
    }

    /// How long the circuit has been open or half-open without closing since it opened;
    /// `None` while closed.
    pub fn not_closed_for(&self) -> Option<Duration> {
        self.inner
            .lock()
            .ok()
            .and_then(|s| s.opened_at.map(|t| t.elapsed()))
    }

    /// The sink this breaker guards, as the sink names itself.
    pub fn sink(&self) -> &str {
        &self.sink
    }

    /// Current state and the last broker error.
    pub fn snapshot(&self) -> (CircuitState, Option<String>) {
        self.inner
            .lock()
            .map(|s| (s.state, s.last_error.clone()))
            .unwrap_or((CircuitState::Closed, None))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_after_threshold_probes_and_closes_on_success() {
        let b = Breaker::new("test", 3);
        for _ in 0..2 {
            b.record(false, Some("down"));
            assert_eq!(b.permit(), Permit::Proceed);
        }
        b.record(false, Some("down"));
        assert!(matches!(b.permit(), Permit::Wait(_)));
        assert_eq!(b.snapshot().0, CircuitState::Open);
        std::thread::sleep(MIN_COOLDOWN + Duration::from_millis(20));
        assert_eq!(b.permit(), Permit::Probe);
        assert!(
            matches!(b.permit(), Permit::Wait(_)),
            "only one probe at a time"
        );
        assert!(b.not_closed_for().is_some(), "open since the threshold");
        b.record(true, None);
        assert_eq!(b.permit(), Permit::Proceed);
        assert_eq!(b.snapshot(), (CircuitState::Closed, None));
        assert_eq!(b.not_closed_for(), None, "closed again");
    }

    #[test]
    fn failed_probe_doubles_the_pause() {
        let b = Breaker::new("test", 1);
        b.record(false, Some("down"));
        std::thread::sleep(MIN_COOLDOWN + Duration::from_millis(20));
        assert_eq!(b.permit(), Permit::Probe);
        b.record(false, Some("still down"));
        match b.permit() {
            Permit::Wait(d) => assert!(d > MIN_COOLDOWN, "{d:?}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_unused_probe_is_handed_to_the_next_caller() {
        let b = Breaker::new("test", 1);
        b.record(false, Some("down"));
        std::thread::sleep(MIN_COOLDOWN + Duration::from_millis(20));
        assert_eq!(b.permit(), Permit::Probe);
        b.probe_unused();
        assert_eq!(b.permit(), Permit::Probe);
    }

    #[test]
    fn rejected_messages_do_not_open_the_circuit() {
        let b = Breaker::new("test", 1);
        for _ in 0..10 {
            b.record(false, None);
        }
        assert_eq!(b.permit(), Permit::Proceed);
    }

    #[test]
    fn a_rejected_probe_hands_the_next_probe_out_at_once() {
        let b = Breaker::new("test", 1);
        b.record(false, Some("down"));
        std::thread::sleep(MIN_COOLDOWN + Duration::from_millis(20));
        assert_eq!(b.permit(), Permit::Probe);
        b.record(false, None);
        assert_eq!(b.permit(), Permit::Probe, "no cooldown after a rejection");
        assert_eq!(b.snapshot().0, CircuitState::HalfOpen);
    }
}
