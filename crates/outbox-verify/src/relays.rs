//! The processes `outbox verify` runs, kills, pauses and restarts: real OS processes of the
//! `outbox` binary (relays; with `--through-inbox` also `outbox inbox` daemons and inbox
//! handlers), so a fault hits them as it would in production.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context as _;

/// Relay processes under test.
pub struct Relays {
    /// One slot per relay; a restarted relay takes its predecessor's slot.
    pub children: Vec<Child>,
    /// The `outbox` binary.
    program: PathBuf,
    /// Command-line arguments: nothing secret (see the fields below).
    args: Vec<String>,
    /// Folder of the relays' logs (`relay-<i>.log`).
    logs: PathBuf,
    /// The database URL, passed in the environment: a password must not show in `ps`.
    database_url: String,
    /// The sink URL, in the environment for the same reason (`nats://user:pass@…`).
    sink_url: String,
    /// Where every relay's standard output goes (the `stdout:` sink), appended.
    stdout: Option<PathBuf>,
    /// What these processes are, for logs and fault reports (`relay`, `inbox`, `handler`).
    role: String,
    /// The environment variable the second URL goes in (`OUTBOX_SINK` for relays,
    /// `OUTBOX_INBOX_SOURCE` for inbox daemons); `None`: only the database URL.
    url_env: Option<&'static str>,
    /// With [`Relays::with_probes`]: the `--metrics-addr` port of each slot, kept across
    /// restarts, so `/readyz` can be asked.
    probe_ports: Option<Vec<u16>>,
}

impl Drop for Relays {
    /// No relay process outlives the run, whatever ends it.
    fn drop(&mut self) {
        for i in 0..self.children.len() {
            if matches!(self.children[i].try_wait(), Ok(None)) {
                self.signal(i, "-CONT");
                let _ = self.children[i].kill();
                let _ = self.children[i].wait();
            }
        }
    }
}

impl Relays {
    /// Relays run as `outbox <args>` with `OUTBOX_DATABASE_URL` and `OUTBOX_SINK` set; none is
    /// started yet.
    pub fn new(
        program: PathBuf,
        args: Vec<String>,
        logs: PathBuf,
        database_url: String,
        sink_url: String,
        stdout: Option<PathBuf>,
    ) -> Self {
        Self {
            children: Vec::new(),
            program,
            args,
            logs,
            database_url,
            sink_url,
            stdout,
            role: "relay".into(),
            url_env: Some("OUTBOX_SINK"),
            probe_ports: None,
        }
    }

    /// Each process also serves `/metrics`, `/livez` and `/readyz` (`--metrics-addr`) on a
    /// port of its own, kept across restarts: see [`Relays::readiness_urls`].
    pub fn with_probes(mut self) -> Self {
        self.probe_ports = Some(Vec::new());
        self
    }

    /// The `/readyz` URL of every process, with [`Relays::with_probes`] (else none).
    pub fn readiness_urls(&self) -> Vec<String> {
        self.probe_ports
            .iter()
            .flatten()
            .map(|p| format!("http://127.0.0.1:{p}/readyz"))
            .collect()
    }

    /// The same for processes of another `role`, whose second URL (if any) goes in `url_env`.
    pub fn with_role(mut self, role: &str, url_env: Option<&'static str>) -> Self {
        self.role = role.to_string();
        self.url_env = url_env;
        self
    }

    /// Replaces argument `from` by `to` for every later start (`spawn_one`): how a run
    /// switches its relays from `--mode polling` to `--mode cdc`.
    pub fn replace_arg(&mut self, from: &str, to: &str) {
        for a in self.args.iter_mut().filter(|a| a.as_str() == from) {
            *a = to.to_string();
        }
    }

    /// What these processes are (`relay`, `inbox`, `handler`).
    pub fn role(&self) -> &str {
        &self.role
    }

    /// Starts process `i` (its log appended to `<role>-<i>.log`).
    pub fn spawn_one(&mut self, i: usize) -> anyhow::Result<Child> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.logs.join(format!("{}-{i}.log", self.role)))?;
        let stdout = match &self.stdout {
            Some(path) => Stdio::from(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)?,
            ),
            None => Stdio::null(),
        };
        let mut c = Command::new(&self.program);
        c.args(&self.args);
        if let Some(ports) = &mut self.probe_ports {
            while ports.len() <= i {
                // A free port now; the process binds it in a moment.
                ports.push(
                    std::net::TcpListener::bind("127.0.0.1:0")?
                        .local_addr()?
                        .port(),
                );
            }
            c.args(["--metrics-addr", &format!("127.0.0.1:{}", ports[i])]);
        }
        c.env("OUTBOX_LOG", "warn")
            .env("OUTBOX_DATABASE_URL", &self.database_url);
        if let Some(name) = self.url_env {
            c.env(name, &self.sink_url);
        }
        c.stdin(Stdio::null())
            .stdout(stdout)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting a {} process", self.role))
    }

    /// Sends `sig` (`-STOP`, `-CONT`, `-TERM`) to relay `i` if it still runs (once a child
    /// is reaped, its pid may be reused by another process).
    pub fn signal(&mut self, i: usize, sig: &str) {
        if !matches!(self.children[i].try_wait(), Ok(None)) {
            return;
        }
        let _ = Command::new("kill")
            .args([sig, &self.children[i].id().to_string()])
            .stderr(Stdio::null())
            .status();
    }
}

impl Relays {
    /// Stops every process gracefully: SIGCONT (a paused one must be able to hear it), SIGTERM,
    /// then waits up to `grace` for all of them. A process still running then has ignored its
    /// SIGTERM, which is a defect of its own (an operator's `systemctl stop` would hang too): it
    /// is killed with SIGKILL and named in the returned list, with the end of its log.
    pub fn stop_all(&mut self, grace: Duration) -> Vec<String> {
        for i in 0..self.children.len() {
            self.signal(i, "-CONT");
            self.signal(i, "-TERM");
        }
        let deadline = Instant::now() + grace;
        let mut stuck = Vec::new();
        for i in 0..self.children.len() {
            loop {
                match self.children[i].try_wait() {
                    Ok(None) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(50))
                    }
                    Ok(None) => {
                        let pid = self.children[i].id();
                        let _ = self.children[i].kill();
                        let _ = self.children[i].wait();
                        stuck.push(format!(
                            "{} {i} (pid {pid}) still ran {grace:?} after SIGTERM and was killed; \
                             the end of its log: {}",
                            self.role,
                            self.log_tail(i, 5)
                        ));
                        break;
                    }
                    _ => break,
                }
            }
        }
        stuck
    }

    /// The last `lines` lines of process `i`'s log, on one line.
    fn log_tail(&self, i: usize, lines: usize) -> String {
        let path = self.logs.join(format!("{}-{i}.log", self.role));
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(lines).collect();
        tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
    }
}

/// How long a fault command (`--broker-stop-cmd`, …) may run before the run gives up on it.
const SHELL_TIMEOUT: Duration = Duration::from_secs(120);

/// Runs a fault command of the user's (`--broker-stop-cmd`, …) through `sh -c`.
/// A command that runs longer than two minutes is killed and is an error: a fault that
/// cannot end must fail the run, not hang it.
pub async fn shell(cmd: &str) -> anyhow::Result<()> {
    let mut child = tokio::process::Command::new("sh")
        .args(["-c", cmd])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting fault command `{cmd}`"))?;
    let st = match tokio::time::timeout(SHELL_TIMEOUT, child.wait()).await {
        Ok(st) => st?,
        Err(_) => {
            let _ = child.kill().await;
            anyhow::bail!("fault command `{cmd}` still ran after {SHELL_TIMEOUT:?}; killed");
        }
    };
    anyhow::ensure!(st.success(), "fault command `{cmd}` exited with {st}");
    Ok(())
}
