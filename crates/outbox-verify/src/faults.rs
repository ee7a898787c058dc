//! The fault schedule of `outbox verify`: seeded, so a run can be replayed; every requested
//! kind is injected at least once (in a seeded order), then kinds are drawn at random.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::relays::{shell, Relays};

/// One injected fault.
#[derive(Debug, Clone, Serialize)]
pub struct FaultEvent {
    /// `kill`, `pause`, `broker` or `db`.
    pub kind: String,
    /// When it started, in seconds since the start of the run.
    pub at_seconds: f64,
    /// When it ended (the relay restarted or resumed, the broker or database back).
    pub ended_seconds: f64,
    /// What was done.
    pub detail: String,
}

/// What the schedule may do and when.
pub struct Schedule {
    /// Fault kinds to inject (validated by the caller).
    pub kinds: Vec<String>,
    /// Mean pause between faults (each pause is drawn from 0.5–1.5 times it).
    pub interval: Duration,
    /// Length of the load; no new random fault starts in its last 3 s.
    pub duration: Duration,
    /// The relays' lease: a pause lasts one second longer.
    pub lease: Duration,
    /// Shell commands for the `broker` and `db` kinds.
    pub broker_stop: Option<String>,
    /// See `broker_stop`.
    pub broker_start: Option<String>,
    /// See `broker_stop`.
    pub db_restart: Option<String>,
}

/// Picks a process among `groups` (every process equally likely): (group, index).
fn victim(groups: &[Arc<Mutex<Relays>>], rng: &mut fastrand::Rng) -> (usize, usize) {
    let sizes: Vec<usize> = groups
        .iter()
        .map(|g| g.lock().map(|r| r.children.len()).unwrap_or(0))
        .collect();
    let total: usize = sizes.iter().sum();
    let mut pick = rng.usize(..total.max(1));
    for (g, n) in sizes.iter().enumerate() {
        if pick < *n {
            return (g, pick);
        }
        pick -= n;
    }
    (0, 0)
}

/// Starts injecting faults into the processes of `groups` (relays, and with `--through-inbox`
/// inbox daemons and handlers) and the broker and database, through the commands; every fault
/// is appended to `log` once it ends. The task ends after the load (`stop`) once every kind was
/// injected, or at the first fault command that fails.
pub fn spawn(
    schedule: Schedule,
    groups: Vec<Arc<Mutex<Relays>>>,
    log: Arc<Mutex<Vec<FaultEvent>>>,
    seed: u64,
    started: Instant,
    stop: CancellationToken,
) -> JoinHandle<anyhow::Result<()>> {
    tokio::spawn(async move {
        let s = schedule;
        let mut rng = fastrand::Rng::with_seed(seed);
        let mut order = s.kinds.clone();
        rng.shuffle(&mut order);
        let mut i = 0usize;
        loop {
            tokio::time::sleep(s.interval.mul_f64(0.5 + rng.f64())).await;
            // Every requested kind is injected at least once, even if that outlasts the load.
            let all_done = i >= order.len();
            if s.kinds.is_empty()
                || (all_done
                    && (stop.is_cancelled()
                        || started.elapsed() + Duration::from_secs(3) > s.duration))
            {
                return Ok(());
            }
            let kind = if i < order.len() {
                order[i].clone()
            } else {
                s.kinds[rng.usize(..s.kinds.len())].clone()
            };
            i += 1;
            let at = started.elapsed().as_secs_f64();
            let detail = match kind.as_str() {
                "kill" => {
                    let (g, victim) = victim(&groups, &mut rng);
                    let mut role = String::new();
                    if let Ok(mut r) = groups[g].lock() {
                        role = r.role().to_string();
                        let _ = r.children[victim].kill();
                        let _ = r.children[victim].wait();
                    }
                    tokio::time::sleep(Duration::from_millis(300 + rng.u64(..1000))).await;
                    if let Ok(mut r) = groups[g].lock() {
                        let c = r.spawn_one(victim)?;
                        r.children[victim] = c;
                    }
                    format!("kill -9 {role} {victim}, restarted")
                }
                "pause" => {
                    let (g, victim) = victim(&groups, &mut rng);
                    let paused = s.lease + Duration::from_secs(1);
                    let mut role = String::new();
                    if let Ok(mut r) = groups[g].lock() {
                        role = r.role().to_string();
                        r.signal(victim, "-STOP");
                    }
                    tokio::time::sleep(paused).await;
                    if let Ok(mut r) = groups[g].lock() {
                        r.signal(victim, "-CONT");
                    }
                    format!("SIGSTOP {role} {victim} for {paused:?} (past its lease), SIGCONT")
                }
                "broker" => {
                    if let (Some(a), Some(b)) = (&s.broker_stop, &s.broker_start) {
                        shell(a).await?;
                        tokio::time::sleep(Duration::from_secs(2)).await;
                        shell(b).await?;
                    }
                    "broker stopped for 2 s, started".to_string()
                }
                "db" => {
                    if let Some(c) = &s.db_restart {
                        shell(c).await?;
                    }
                    "database restarted".to_string()
                }
                _ => continue,
            };
            let ended = started.elapsed().as_secs_f64();
            if let Ok(mut f) = log.lock() {
                f.push(FaultEvent {
                    kind,
                    at_seconds: at,
                    ended_seconds: ended,
                    detail,
                });
            }
        }
    })
}
