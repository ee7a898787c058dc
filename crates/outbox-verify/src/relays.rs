//! The relay processes `outbox verify` runs, kills, pauses and restarts: real OS processes of
//! the `outbox` binary, so a fault hits them as it would in production.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

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
        }
    }

    /// Starts relay `i` (its log appended to `relay-<i>.log`).
    pub fn spawn_one(&mut self, i: usize) -> anyhow::Result<Child> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.logs.join(format!("relay-{i}.log")))?;
        let stdout = match &self.stdout {
            Some(path) => Stdio::from(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)?,
            ),
            None => Stdio::null(),
        };
        Command::new(&self.program)
            .args(&self.args)
            .env("OUTBOX_LOG", "warn")
            .env("OUTBOX_DATABASE_URL", &self.database_url)
            .env("OUTBOX_SINK", &self.sink_url)
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(log)
            .spawn()
            .context("starting a relay process")
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

/// Runs a fault command of the user's (`--broker-stop-cmd`, …) through `sh -c`.
pub fn shell(cmd: &str) -> anyhow::Result<()> {
    let st = Command::new("sh")
        .args(["-c", cmd])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .status()?;
    anyhow::ensure!(st.success(), "fault command `{cmd}` exited with {st}");
    Ok(())
}
