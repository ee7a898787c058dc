//! "Are events flowing?" answered from one status report, in one word ([`FlowState`]) and one
//! sentence with how long: flowing, idle, no live relay, a route's sink down, partitions stopped
//! at the parking cap, keys held behind failed or retrying heads. `outbox status` prints it
//! first, its JSON carries it as `flow`, and the console's overview leads with it, so the three
//! always agree.
//!
//! A member is live while its heartbeat is younger than [`STALE_AFTER_SECONDS`]: a relay
//! heartbeats at least every second, so a member silent for that long has died or hangs, even
//! while its row and its leases linger.

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::status::{PartitionStatus, RouteLag};
use crate::store::{MemberStatus, Stats};

/// A member whose last heartbeat is older than this many seconds is not live.
pub const STALE_AFTER_SECONDS: f64 = 15.0;

/// Longest sink error quoted in a headline.
const ERROR_IN_HEADLINE: usize = 200;

/// The answer in one word.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FlowState {
    /// Messages are pending and every partition with work has a live owner whose circuits are
    /// closed.
    Flowing,
    /// Nothing is pending, and a relay is live.
    Idle,
    /// No relay member is live: nothing is published.
    NoRelay,
    /// A live relay's circuit towards a sink is open: that route's messages wait.
    SinkDown,
    /// Partitions stopped advancing at the parking cap.
    ParkingCap,
    /// Messages failed and wait for a redrive; their keys' later messages wait behind them.
    Failed,
    /// Partitions with pending messages have no live owner (a relay stopped; the others take
    /// over once its lease runs out).
    Unowned,
    /// Messages are being retried; their keys wait behind them.
    Retrying,
}

impl FlowState {
    /// The state's name as shown to people (`flowing`, `no relay`, `sink down`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            FlowState::Flowing => "flowing",
            FlowState::Idle => "idle",
            FlowState::NoRelay => "no relay",
            FlowState::SinkDown => "sink down",
            FlowState::ParkingCap => "parking cap",
            FlowState::Failed => "failed",
            FlowState::Unowned => "unowned partitions",
            FlowState::Retrying => "retrying",
        }
    }
}

/// One condition that holds events back.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Problem {
    /// Which condition.
    pub state: FlowState,
    /// Whether nothing (or a whole route) flows until someone acts; `false` for conditions
    /// that resolve themselves (retries, a takeover).
    pub critical: bool,
    /// The condition in one sentence, with what waits and for how long.
    pub text: String,
    /// How long it has lasted at least, in seconds.
    pub since_seconds: Option<f64>,
    /// The route concerned (a sink down on a relay that routes).
    pub route: Option<String>,
}

/// Whether events flow, and if not, why.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Flow {
    /// The answer in one word: the most serious problem's, else `flowing` or `idle`.
    pub state: FlowState,
    /// The answer in one sentence, with how long.
    pub headline: String,
    /// Every condition found, the most serious first; empty when events flow.
    pub problems: Vec<Problem>,
    /// Of the pending messages, those that can flow now.
    pub pending_flowing: i64,
    /// Of the pending messages, those held back behind a retrying or failed head of their key.
    pub pending_blocked: i64,
    /// Relay members whose heartbeat is younger than [`STALE_AFTER_SECONDS`].
    pub live_members: usize,
    /// Seconds since the latest heartbeat of any member; `None` when no member is recorded.
    pub last_heartbeat_age_seconds: Option<f64>,
    /// Partitions held by a live lease; `None` for stores that show no partitions.
    pub partitions_owned: Option<usize>,
    /// Partitions in all; `None` for stores that show no partitions.
    pub partitions: Option<usize>,
}

impl Flow {
    /// The answer from a status report's parts, read at `at`: its counts and members, its
    /// partitions and its backlog by route.
    pub fn of(
        at: DateTime<Utc>,
        s: &Stats,
        partitions: &[PartitionStatus],
        routes: &[RouteLag],
    ) -> Self {
        let ago = |t: DateTime<Utc>| ((at - t).num_milliseconds() as f64 / 1000.0).max(0.0);
        let live: Vec<_> = s
            .members
            .iter()
            .filter(|m| ago(m.heartbeat_at) < STALE_AFTER_SECONDS)
            .collect();
        let last_beat = s
            .members
            .iter()
            .map(|m| ago(m.heartbeat_at))
            .reduce(f64::min);
        let (owned, parts) = if partitions.is_empty() {
            (None, None)
        } else {
            let owned = partitions.iter().filter(|p| p.owner.is_some()).count();
            (Some(owned), Some(partitions.len()))
        };
        let blocked = s.waiting.clamp(0, s.pending.max(0));
        let backlog = backlog(s.pending, s.oldest_pending_age_seconds);
        let mut problems = Vec::new();

        if live.is_empty() {
            problems.push(no_relay(last_beat, owned.zip(parts), &backlog));
        }
        sink_problems(s, routes, &live, &mut problems);
        if s.partitions_at_parking_cap > 0 {
            problems.push(Problem {
                state: FlowState::ParkingCap,
                critical: true,
                text: format!(
                    "{} partition(s) stopped at the parking cap: keys stuck behind failing \
                     messages hold every key of their partition; fix the cause, then redrive.",
                    s.partitions_at_parking_cap
                ),
                since_seconds: s.oldest_waiting_age_seconds,
                route: None,
            });
        }
        let behind = match blocked {
            0 => "nothing waits behind them".to_string(),
            n => format!(
                "{} message(s) wait behind the retrying or failed heads of their keys, the \
                 oldest for {}",
                human_count(n),
                human_age(s.oldest_waiting_age_seconds.unwrap_or(0.0))
            ),
        };
        if s.failed > 0 {
            problems.push(Problem {
                state: FlowState::Failed,
                critical: blocked > 0,
                text: format!(
                    "{} message(s) failed and wait for a redrive; {behind}.",
                    human_count(s.failed)
                ),
                since_seconds: s.oldest_waiting_age_seconds,
                route: None,
            });
        }
        if !live.is_empty() {
            problems.extend(unowned(partitions));
        }
        if s.retrying > 0 && s.failed == 0 {
            problems.push(Problem {
                state: FlowState::Retrying,
                critical: false,
                text: format!(
                    "{} message(s) are being retried; {behind}.",
                    human_count(s.retrying)
                ),
                since_seconds: s.oldest_waiting_age_seconds,
                route: None,
            });
        }

        let (state, headline) = match problems.first() {
            Some(p) => (p.state, p.text.clone()),
            None => calm(s.pending, &backlog, live.len(), owned.zip(parts)),
        };
        Flow {
            state,
            headline,
            problems,
            pending_flowing: s.pending.max(0) - blocked,
            pending_blocked: blocked,
            live_members: live.len(),
            last_heartbeat_age_seconds: last_beat,
            partitions_owned: owned,
            partitions: parts,
        }
    }
}

/// No member is live: since the last heartbeat (if any), and whether the leases still hold the
/// partitions (`owned` of all, where the store shows partitions).
fn no_relay(last_beat: Option<f64>, owned: Option<(usize, usize)>, backlog: &str) -> Problem {
    let text = match last_beat {
        None => format!(
            "No relay is running: nothing is published until one starts (`outbox relay`); \
             {backlog}."
        ),
        Some(beat) => format!(
            "No live relay: the last heartbeat was {} ago{}; nothing is published; {backlog}.",
            human_age(beat),
            match owned {
                Some((0, _)) => ", and no partition has a live owner".to_string(),
                Some((o, p)) => {
                    format!(" (its leases still hold {o} of {p} partitions until they run out)")
                }
                None => String::new(),
            }
        ),
    };
    Problem {
        state: FlowState::NoRelay,
        critical: true,
        text,
        since_seconds: last_beat,
        route: None,
    }
}

/// Partitions with pending messages and no live owner while other members live (a relay
/// stopped; its leases run out, then the others take over).
fn unowned(partitions: &[PartitionStatus]) -> Option<Problem> {
    let unowned: Vec<_> = partitions
        .iter()
        .filter(|p| p.owner.is_none() && p.pending > 0)
        .collect();
    if unowned.is_empty() {
        return None;
    }
    let pending: i64 = unowned.iter().map(|p| p.pending).sum();
    Some(Problem {
        state: FlowState::Unowned,
        critical: false,
        text: format!(
            "{} partition(s) with {} pending message(s) have no live owner: a relay stopped, and \
             the live ones take its partitions over once its lease runs out.",
            unowned.len(),
            human_count(pending)
        ),
        since_seconds: unowned
            .iter()
            .filter_map(|p| p.oldest_pending_age_seconds)
            .reduce(f64::max),
        route: None,
    })
}

/// The answer when nothing holds events back: idle or flowing, and who is live.
fn calm(
    pending: i64,
    backlog: &str,
    live: usize,
    owned: Option<(usize, usize)>,
) -> (FlowState, String) {
    let members = match live {
        1 => "1 relay member is live".to_string(),
        n => format!("{n} relay members are live"),
    };
    let owning = match owned {
        Some((o, p)) => format!(
            " and {} {o} of {p} partitions",
            if live == 1 { "owns" } else { "own" }
        ),
        None => String::new(),
    };
    if pending == 0 {
        (
            FlowState::Idle,
            format!("Idle: nothing is pending; {members}{owning}."),
        )
    } else {
        (
            FlowState::Flowing,
            format!("Flowing: {backlog}; {members}{owning}."),
        )
    }
}

/// A sink-down problem per route whose circuit is not closed on some live member (the relay
/// names the route in its error when it routes: [`route_error`]).
fn sink_problems(s: &Stats, lags: &[RouteLag], live: &[&MemberStatus], out: &mut Vec<Problem>) {
    let mut routes: Vec<(Option<String>, Vec<&MemberStatus>)> = Vec::new();
    for m in live.iter().filter(|m| m.circuit != "closed") {
        let route = m
            .sink_error
            .as_deref()
            .and_then(route_of)
            .map(str::to_string);
        match routes.iter_mut().find(|(r, _)| *r == route) {
            Some((_, ms)) => ms.push(m),
            None => routes.push((route, vec![m])),
        }
    }
    for (route, members) in routes {
        let lag = route
            .as_deref()
            .and_then(|name| lags.iter().find(|l| l.route == name));
        let (pending, oldest) = match lag {
            Some(l) => (l.pending, l.oldest_pending_age_seconds),
            None => (s.pending, s.oldest_pending_age_seconds),
        };
        let whose = match &route {
            Some(name) => format!("The sink of route `{name}` is down"),
            None => "The sink is down".to_string(),
        };
        let error = members
            .iter()
            .find_map(|m| m.sink_error.as_deref())
            .map(|e| e.split_once("`: ").map_or(e, |(_, rest)| rest))
            .map(|e| format!(": {}", crate::text::cut(e, ERROR_IN_HEADLINE)))
            .unwrap_or_default();
        let waits = match (lag, route.is_some()) {
            (Some(_), _) | (None, false) => format!("; {}", backlog(pending, oldest)),
            (None, true) => format!(
                "; its messages wait ({} pending in all, the oldest for {})",
                human_count(pending),
                human_age(oldest.unwrap_or(0.0))
            ),
        };
        out.push(Problem {
            state: FlowState::SinkDown,
            critical: true,
            text: format!(
                "{whose} (circuit {} on {} of {} live relay member(s)){error}{waits}.",
                members[0].circuit,
                members.len(),
                live.len()
            ),
            since_seconds: oldest,
            route,
        });
    }
}

/// `12 pending, the oldest for 3 min 5 s`, or `nothing pending`.
fn backlog(pending: i64, oldest: Option<f64>) -> String {
    match (pending, oldest) {
        (p, _) if p <= 0 => "nothing pending".to_string(),
        (p, Some(a)) => format!(
            "{} pending, the oldest for {}",
            human_count(p),
            human_age(a)
        ),
        (p, None) => format!("{} pending", human_count(p)),
    }
}

/// A sink error as the relay reports it for `route` when it routes: `route `NAME`: ERROR`.
pub fn route_error(route: &str, error: &str) -> String {
    format!("route `{route}`: {error}")
}

/// The route a sink error names ([`route_error`]), if it names one.
pub fn route_of(sink_error: &str) -> Option<&str> {
    sink_error
        .strip_prefix("route `")?
        .split_once("`: ")
        .map(|(name, _)| name)
}

/// Seconds as people read them: `0.4 s`, `12 s`, `3 min 5 s`, `2 h 10 min`.
pub fn human_age(s: f64) -> String {
    let s = s.max(0.0);
    if s < 10.0 {
        format!("{s:.1} s")
    } else if s < 120.0 {
        format!("{s:.0} s")
    } else if s < 7200.0 {
        format!("{} min {} s", (s / 60.0) as u64, (s % 60.0) as u64)
    } else if s < 172_800.0 {
        format!(
            "{} h {} min",
            (s / 3600.0) as u64,
            ((s % 3600.0) / 60.0) as u64
        )
    } else {
        format!(
            "{} days {} h",
            (s / 86400.0) as u64,
            ((s % 86400.0) / 3600.0) as u64
        )
    }
}

/// A count with thousands separated: `1,216`.
pub fn human_count(n: i64) -> String {
    let digits = n.unsigned_abs().to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    if n < 0 {
        format!("-{out}")
    } else {
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::{Report, StatusDetail};

    fn member(name: &str, beat_ago: i64, circuit: &str, error: Option<&str>) -> MemberStatus {
        MemberStatus {
            member: name.into(),
            partitions: 32,
            heartbeat_at: Utc::now() - chrono::Duration::seconds(beat_ago),
            circuit: circuit.into(),
            sink_error: error.map(str::to_string),
        }
    }

    fn partitions(owned: usize, pending: i64) -> Vec<PartitionStatus> {
        (0..4)
            .map(|p| PartitionStatus {
                partition: p,
                owner: (p < owned as i32).then(|| "m".to_string()),
                epoch: 1,
                lease_until: None,
                pending,
                oldest_pending_age_seconds: Some(30.0),
                parked: 0,
                failed: 0,
                position: None,
            })
            .collect()
    }

    fn report(stats: Stats, parts: Vec<PartitionStatus>) -> Report {
        let detail = StatusDetail {
            partitions: parts,
            ..StatusDetail::default()
        };
        Report::new(Utc::now(), stats, detail, &[])
    }

    #[test]
    fn a_dead_relay_is_said_first_with_its_last_heartbeat() {
        let stats = Stats {
            pending: 1857,
            oldest_pending_age_seconds: Some(185.0),
            members: vec![
                member("a", 45, "open", None),
                member("b", 46, "closed", None),
            ],
            ..Stats::default()
        };
        let f = report(stats, partitions(0, 10)).flow;
        assert_eq!(f.state, FlowState::NoRelay);
        assert!(
            f.headline
                .starts_with("No live relay: the last heartbeat was 45 s ago, and no partition")
                && f.headline
                    .contains("1,857 pending, the oldest for 3 min 5 s"),
            "{}",
            f.headline
        );
        assert_eq!(f.live_members, 0);
        assert_eq!(
            f.problems.len(),
            1,
            "a dead member's open circuit is no sink problem"
        );
    }

    #[test]
    fn a_routes_sink_down_is_named_by_the_route_in_the_members_error() {
        let error = route_error("payments", "connection refused (http://127.0.0.1:9/)");
        assert_eq!(route_of(&error), Some("payments"));
        let stats = Stats {
            pending: 40,
            oldest_pending_age_seconds: Some(83.0),
            members: vec![member("a", 1, "open", Some(&error))],
            ..Stats::default()
        };
        let f = report(stats, partitions(4, 10)).flow;
        assert_eq!(f.state, FlowState::SinkDown);
        assert_eq!(f.problems[0].route.as_deref(), Some("payments"));
        assert!(
            f.headline
                .starts_with("The sink of route `payments` is down (circuit open on 1 of 1")
                && f.headline.contains(": connection refused"),
            "{}",
            f.headline
        );
    }

    #[test]
    fn failed_heads_say_what_waits_behind_them_and_for_how_long() {
        let stats = Stats {
            pending: 100,
            oldest_pending_age_seconds: Some(83.0),
            failed: 1216,
            waiting: 38,
            oldest_waiting_age_seconds: Some(83.0),
            blocked_keys: 40,
            members: vec![member("a", 0, "closed", None)],
            ..Stats::default()
        };
        let f = report(stats, partitions(4, 25)).flow;
        assert_eq!(f.state, FlowState::Failed);
        assert_eq!((f.pending_flowing, f.pending_blocked), (62, 38));
        assert_eq!(
            f.headline,
            "1,216 message(s) failed and wait for a redrive; 38 message(s) wait behind the \
             retrying or failed heads of their keys, the oldest for 83 s."
        );
    }

    #[test]
    fn flowing_and_idle_say_who_is_live() {
        let mut stats = Stats {
            pending: 12,
            oldest_pending_age_seconds: Some(0.4),
            members: vec![member("a", 0, "closed", None)],
            ..Stats::default()
        };
        let f = report(stats.clone(), partitions(4, 3)).flow;
        assert_eq!(f.state, FlowState::Flowing);
        assert_eq!(
            f.headline,
            "Flowing: 12 pending, the oldest for 0.4 s; 1 relay member is live and owns 4 of 4 \
             partitions."
        );
        stats.pending = 0;
        let f = report(stats, partitions(4, 0)).flow;
        assert_eq!(f.state, FlowState::Idle);
        let none = report(Stats::default(), Vec::new()).flow;
        assert_eq!(none.state, FlowState::NoRelay);
        assert!(
            none.headline.starts_with("No relay is running"),
            "{}",
            none.headline
        );
    }

    #[test]
    fn counts_and_ages_read_as_people_say_them() {
        assert_eq!(human_count(1216), "1,216");
        assert_eq!(human_count(999), "999");
        assert_eq!(human_count(1_000_000), "1,000,000");
        assert_eq!(human_age(0.42), "0.4 s");
        assert_eq!(human_age(185.0), "3 min 5 s");
        assert_eq!(human_age(7800.0), "2 h 10 min");
    }
}
