//! The one harness behind every process a test runs privately (a broker of its own, the
//! `outbox` binary): a free port, waiting for a port to answer, finding a binary, and the
//! signals a fault test sends (SIGTERM, SIGKILL, SIGSTOP, SIGCONT).
//!
//! Signals go through `kill(1)`: the workspace forbids `unsafe`, which `libc::kill` needs.

// Test code: a failed expectation should panic with its message.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// A port on 127.0.0.1 that nothing listens on at the time of the call.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind a free port on 127.0.0.1")
}

/// Whether something accepts connections on 127.0.0.1:`port`.
pub fn port_answers(port: u16) -> bool {
    std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
}

/// Waits until 127.0.0.1:`port` accepts connections; panics naming `what` after `limit`.
pub fn wait_port(port: u16, what: &str, limit: Duration) {
    let deadline = Instant::now() + limit;
    while !port_answers(port) {
        assert!(
            Instant::now() < deadline,
            "{what} did not answer on 127.0.0.1:{port} within {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The program to run for `name`: the path in environment variable `env` when set, else the
/// first of `candidates` that exists (one `*` path component is expanded, for a venv's
/// `python3.*`), else `name` on the `PATH`.
pub fn binary(name: &str, env: &str, candidates: &[&str]) -> String {
    if let Ok(p) = std::env::var(env) {
        return p;
    }
    candidates
        .iter()
        .find_map(|c| expand(c))
        .unwrap_or_else(|| name.to_string())
}

/// The first existing path `pattern` names, with one `*` component expanded.
fn expand(pattern: &str) -> Option<String> {
    let Some((head, tail)) = pattern.split_once('*') else {
        return Path::new(pattern).exists().then(|| pattern.to_string());
    };
    let (dir, prefix) = head.rsplit_once('/')?;
    let (suffix, rest) = tail.split_once('/').unwrap_or((tail, ""));
    let mut found: Vec<String> = std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(prefix) && n.ends_with(suffix))
        .map(|n| format!("{dir}/{n}/{rest}"))
        .filter(|p| Path::new(p).exists())
        .collect();
    found.sort();
    found.into_iter().next()
}

/// A signal a fault test sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// Asks the process to shut down cleanly.
    Term,
    /// Kills it: a crash, nothing saved.
    Kill,
    /// Freezes it: connections stay open, nothing is answered.
    Stop,
    /// Thaws a frozen process.
    Cont,
}

impl Signal {
    fn flag(self) -> &'static str {
        match self {
            Signal::Term => "-TERM",
            Signal::Kill => "-KILL",
            Signal::Stop => "-STOP",
            Signal::Cont => "-CONT",
        }
    }
}

/// Sends `signal` to process `pid`; panics when `kill` fails (no such process).
pub fn signal(pid: u32, signal: Signal) {
    let ok = Command::new("kill")
        .args([signal.flag(), &pid.to_string()])
        .status()
        .expect("run kill(1)");
    assert!(ok.success(), "kill {} {pid} failed", signal.flag());
}

/// Sends SIGTERM to `child`.
pub fn sigterm(child: &Child) {
    signal(child.id(), Signal::Term);
}

/// Waits for `child` to exit, at most `limit` (panics after).
pub fn wait_exit(child: &mut Child, limit: Duration) -> ExitStatus {
    try_wait_exit(child, limit).unwrap_or_else(|| panic!("process did not exit within {limit:?}"))
}

/// Waits for `child` to exit, at most `limit`; `None` if it still runs.
pub fn try_wait_exit(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().ok().flatten() {
            return Some(status);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// How a [`PrivateServer`] is stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopWith {
    /// SIGKILL: a crash; only what the server already wrote survives.
    Kill,
    /// SIGTERM, then SIGKILL if it has not exited after 30 s: a clean shutdown, for servers
    /// that save their state on the way out.
    Term,
}

/// Builds a server's command from its port and directory.
type BuildCommand = dyn Fn(u16, &Path) -> Command + Send + Sync;

/// A server process of one test's own: on a free port, with a scratch directory of its own
/// (removed on drop), stopped and started again on the same port and directory without
/// disturbing anything else on the machine. Frozen and thawed with SIGSTOP and SIGCONT.
pub struct PrivateServer {
    what: String,
    port: u16,
    dir: PathBuf,
    command: Box<BuildCommand>,
    stop_with: StopWith,
    /// The process to signal when the child is a launcher script (RabbitMQ's Erlang VM writes
    /// its own pid here).
    pid_file: Option<PathBuf>,
    start_limit: Duration,
    url: String,
    child: Option<Child>,
    /// Servers this one needs (tansu's storage), stopped after it.
    companions: Vec<PrivateServer>,
}

impl PrivateServer {
    /// A server named `what` for messages, whose command `command(port, dir)` builds; `url`
    /// is how clients reach it, with `{port}` for the port. Not started yet: see
    /// [`PrivateServer::started`].
    pub fn new(
        what: &str,
        url: &str,
        command: impl Fn(u16, &Path) -> Command + Send + Sync + 'static,
    ) -> Self {
        let port = free_port();
        let dir = std::env::temp_dir().join(crate::unique_name(&what.replace(['-', ' '], "_")));
        std::fs::create_dir_all(&dir).expect("create the server's directory");
        Self {
            what: what.to_string(),
            port,
            dir,
            command: Box::new(command),
            stop_with: StopWith::Kill,
            pid_file: None,
            start_limit: Duration::from_secs(30),
            url: url.replace("{port}", &port.to_string()),
            child: None,
            companions: Vec::new(),
        }
    }

    /// Stopped as `how` says (SIGKILL by default).
    pub fn stop_with(mut self, how: StopWith) -> Self {
        self.stop_with = how;
        self
    }

    /// Signals go to the pid the server writes to `file` in its directory, not to the child.
    pub fn pid_file(mut self, file: &str) -> Self {
        self.pid_file = Some(self.dir.join(file));
        self
    }

    /// Gives the server `limit` to answer on its port after each start (30 s by default).
    pub fn start_limit(mut self, limit: Duration) -> Self {
        self.start_limit = limit;
        self
    }

    /// Keeps `other` running as long as this server lives.
    pub fn with_companion(mut self, other: PrivateServer) -> Self {
        self.companions.push(other);
        self
    }

    /// Starts the server and returns it once its port answers.
    pub fn started(mut self) -> Self {
        self.start();
        self
    }

    /// Starts the server (again) and waits until its port answers.
    pub fn start(&mut self) {
        assert!(self.child.is_none(), "{} is already running", self.what);
        let child = (self.command)(self.port, &self.dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start {} (scripts/services.sh installs it): {e}",
                    self.what
                )
            });
        self.child = Some(child);
        wait_port(self.port, &self.what, self.start_limit);
    }

    /// Stops the server as configured and waits until it exited. A frozen server is thawed
    /// first, so it can take a SIGTERM.
    pub fn stop(&mut self) {
        let pid = self.pid();
        let Some(mut child) = self.child.take() else {
            return;
        };
        if let Some(pid) = pid {
            // A frozen server takes no SIGTERM; a launcher's VM outlives its killed launcher.
            let _ = Command::new("kill")
                .args(["-CONT", &pid.to_string()])
                .status();
            let sig = match self.stop_with {
                StopWith::Term => "-TERM",
                StopWith::Kill => "-KILL",
            };
            let _ = Command::new("kill").args([sig, &pid.to_string()]).status();
            if self.pid_file.is_some() {
                wait_gone(pid, Duration::from_secs(30));
            }
        }
        let _ = try_wait_exit(&mut child, Duration::from_secs(30));
        let _ = child.kill();
        let _ = child.wait();
        if let Some(file) = &self.pid_file {
            let _ = std::fs::remove_file(file);
        }
    }

    /// Freezes the server (SIGSTOP): its connections stay open and nothing is answered.
    pub fn freeze(&self) {
        signal(self.running_pid(), Signal::Stop);
    }

    /// Thaws a frozen server (SIGCONT).
    pub fn thaw(&self) {
        signal(self.running_pid(), Signal::Cont);
    }

    /// Sends `sig` to the running server.
    pub fn signal(&self, sig: Signal) {
        signal(self.running_pid(), sig);
    }

    fn running_pid(&self) -> u32 {
        self.pid()
            .unwrap_or_else(|| panic!("{} is not running", self.what))
    }

    /// The pid signals go to: the pid file's when there is one, else the child's.
    fn pid(&self) -> Option<u32> {
        let child = self.child.as_ref()?;
        match &self.pid_file {
            Some(f) => std::fs::read_to_string(f).ok()?.trim().parse().ok(),
            None => Some(child.id()),
        }
    }

    /// How clients reach the server.
    pub fn url(&self) -> String {
        self.url.clone()
    }

    /// The server's port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's own directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Whether the server was started and not stopped since.
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }
}

impl Drop for PrivateServer {
    fn drop(&mut self) {
        self.stop_with = StopWith::Kill;
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
        // Companions are dropped after this server, as fields are.
    }
}

/// Waits until process `pid` is gone (`kill -0` fails), at most `limit`.
fn wait_gone(pid: u32, limit: Duration) {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline
        && Command::new("kill")
            .args(["-0", &pid.to_string()])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    {
        std::thread::sleep(Duration::from_millis(50));
    }
}
