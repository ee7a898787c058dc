//! The fault schedule of `outbox verify`: seeded, so a run can be replayed; every requested
//! kind is injected at least once (in a seeded order), then kinds are drawn at random.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde::Serialize;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::proxy::TcpProxy;
use super::relays::{shell, Relays};

/// One injected fault.
#[derive(Debug, Clone, Serialize)]
pub struct FaultEvent {
    /// `kill`, `pause`, `broker`, `db`, `failover` or `network`.
    pub kind: String,
    /// When it started, in seconds since the start of the run.
    pub at_seconds: f64,
    /// When it ended (the relay restarted or resumed, the broker or database back).
    pub ended_seconds: f64,
    /// What was done, and what the processes did about it.
    pub detail: String,
    /// What the processes failed to do about it (the `network` fault: a relay that did not say
    /// so on `/readyz` within [`NOTICE_WITHIN`], or was not ready again after); a run with any
    /// fails.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
}

/// How soon every relay must report a black-holed database on `/readyz`.
pub const NOTICE_WITHIN: Duration = Duration::from_secs(30);

/// How long after the network heals every relay must be ready again.
const READY_AGAIN_WITHIN: Duration = Duration::from_secs(90);

/// The `network` fault: proxies in front of every database server the relays reach, black-holed
/// together for `blackout`.
pub struct Network {
    /// One per server of the relays' database URL.
    pub proxies: Vec<Arc<TcpProxy>>,
    /// How long nothing passes.
    pub blackout: Duration,
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
    /// Shell command for the `failover` kind.
    pub failover: Option<String>,
    /// The `network` kind's proxies (`None` when the kind was not asked for).
    pub network: Option<Network>,
    /// The database's virtual IP ([`virtual_ip`]), when the URL names one server.
    pub vip: Option<Arc<TcpProxy>>,
}

/// How often the virtual IP asks where the primary is.
const VIP_POLL: Duration = Duration::from_millis(250);

/// A proxy standing for the database's virtual IP, as a MySQL/MariaDB failover moves one: it
/// starts in front of the server `primary_cmd` prints (`host:port`), asks again every
/// [`VIP_POLL`] until `stop`, and sends each new connection to the latest answer. A connection
/// made before a failover stays with the server it reached and dies with it, so writers and
/// relays reach the promoted replica by reconnecting, as through a moved address. A failed or
/// odd answer (the script mid-failover) leaves the address where it was. Returns `url` with
/// its server replaced by the proxy, and the proxy.
pub async fn virtual_ip(
    url: &str,
    primary_cmd: &str,
    stop: CancellationToken,
) -> anyhow::Result<(String, Arc<TcpProxy>)> {
    anyhow::ensure!(
        outbox_db::url::hosts(url)?.len() == 1,
        "verify: --primary-cmd needs a database URL naming one server (its address is replaced \
         by the virtual IP's)"
    );
    let first = primary_now(primary_cmd).await?;
    let vip = Arc::new(TcpProxy::start_to(first).context("starting the virtual IP's proxy")?);
    let url = outbox_db::url::with_hosts(url, &[("127.0.0.1".to_string(), vip.port())])?;
    let moved = vip.clone();
    let cmd = primary_cmd.to_string();
    tokio::spawn(async move {
        while !stop.is_cancelled() {
            tokio::select! {
                _ = tokio::time::sleep(VIP_POLL) => {}
                _ = stop.cancelled() => break,
            }
            if let Ok(p) = primary_now(&cmd).await {
                moved.set_upstream(&p);
            }
        }
    });
    Ok((url, vip))
}

/// What `cmd` prints, when it is one `host:port`.
async fn primary_now(cmd: &str) -> anyhow::Result<String> {
    let out = tokio::time::timeout(
        Duration::from_secs(10),
        tokio::process::Command::new("sh")
            .args(["-c", cmd])
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .with_context(|| format!("`{cmd}` did not answer within 10 s"))?
    .with_context(|| format!("running `{cmd}`"))?;
    let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
    anyhow::ensure!(
        out.status.success()
            && text
                .rsplit_once(':')
                .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok()),
        "`{cmd}` printed `{text}` ({}), not host:port",
        out.status
    );
    Ok(text)
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
            let (detail, problem) = match kind.as_str() {
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
                    (format!("kill -9 {role} {victim}, restarted"), None)
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
                    (
                        format!("SIGSTOP {role} {victim} for {paused:?} (past its lease), SIGCONT"),
                        None,
                    )
                }
                "broker" => {
                    if let (Some(a), Some(b)) = (&s.broker_stop, &s.broker_start) {
                        shell(a).await?;
                        tokio::time::sleep(Duration::from_secs(2)).await;
                        shell(b).await?;
                    }
                    ("broker stopped for 2 s, started".to_string(), None)
                }
                "db" => {
                    if let Some(c) = &s.db_restart {
                        shell(c).await?;
                    }
                    ("database restarted".to_string(), None)
                }
                "failover" => {
                    let before = s.vip.as_ref().map(|v| v.upstream());
                    if let Some(c) = &s.failover {
                        shell(c).await?;
                    }
                    match (&s.vip, before) {
                        (Some(vip), Some(before)) => {
                            // The address follows within a poll of the command's end.
                            tokio::time::sleep(VIP_POLL * 2).await;
                            (
                                format!(
                                    "database failed over: the primary {before} killed, a \
                                     replica promoted; the virtual IP moved to {}",
                                    vip.upstream()
                                ),
                                None,
                            )
                        }
                        _ => (
                            "database failed over: the primary stopped, a standby promoted"
                                .to_string(),
                            None,
                        ),
                    }
                }
                "network" => match &s.network {
                    Some(n) => black_hole(n, &groups[0]).await?,
                    None => continue,
                },
                _ => continue,
            };
            let ended = started.elapsed().as_secs_f64();
            if let Ok(mut f) = log.lock() {
                f.push(FaultEvent {
                    kind,
                    at_seconds: at,
                    ended_seconds: ended,
                    detail,
                    problem,
                });
            }
        }
    })
}

/// The `network` fault: every proxy in front of the database goes silent for the blackout (the
/// relays' connections stay open; nothing passes either way; no RST), then opens again. Every
/// relay must answer `/readyz` with "not ready" within [`NOTICE_WITHIN`] and be ready again
/// within [`READY_AGAIN_WITHIN`] of the network healing; what they did is the detail, what they
/// failed to do the problem.
async fn black_hole(
    n: &Network,
    relays: &Arc<Mutex<Relays>>,
) -> anyhow::Result<(String, Option<String>)> {
    let probes = relays
        .lock()
        .map(|r| r.readiness_urls())
        .unwrap_or_default();
    let started = Instant::now();
    for p in &n.proxies {
        p.go_silent();
    }
    let mut noticed = None;
    while started.elapsed() < n.blackout {
        if noticed.is_none() && all_ready(&probes).await == Some(false) {
            noticed = Some(started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    for p in &n.proxies {
        let p = p.clone();
        tokio::task::spawn_blocking(move || p.open()).await??;
    }
    let healed = Instant::now();
    let mut ready_again = None;
    while healed.elapsed() < READY_AGAIN_WITHIN {
        if all_ready(&probes).await == Some(true) {
            ready_again = Some(healed.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let secs = |d: Option<Duration>| {
        d.map_or("never".to_string(), |d| format!("{:.1} s", d.as_secs_f64()))
    };
    let detail = format!(
        "database connections black-holed for {:?} through a proxy (held open, no RST): every \
         relay unready on /readyz after {}; ready again {} after the network healed",
        n.blackout,
        secs(noticed),
        secs(ready_again)
    );
    let problem = match (noticed, ready_again) {
        (Some(d), Some(_)) if d <= NOTICE_WITHIN => None,
        (Some(_) | None, Some(_)) => Some(format!(
            "the relays did not report the black-holed database on /readyz within {NOTICE_WITHIN:?}"
        )),
        (_, None) => Some(format!(
            "the relays were not ready again within {READY_AGAIN_WITHIN:?} of the network healing"
        )),
    };
    Ok((detail, problem))
}

/// Whether every probe answers ready (`Some(true)`), every one answers not ready
/// (`Some(false)`), or they disagree or cannot be asked (`None`).
async fn all_ready(probes: &[String]) -> Option<bool> {
    // Longer than `/readyz`'s own database round trip (3 s): a slow answer is an answer.
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .ok()?;
    let mut answers = Vec::with_capacity(probes.len());
    for url in probes {
        let ready = client
            .get(url)
            .send()
            .await
            .ok()
            .map(|r| r.status().is_success());
        answers.push(ready?);
    }
    let first = *answers.first()?;
    answers.iter().all(|a| *a == first).then_some(first)
}
