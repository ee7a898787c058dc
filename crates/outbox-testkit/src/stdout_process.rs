//! The `stdout:` sink in a process of its own, so its standard output can be read back: a test
//! cannot read its own (the test runner holds it). The child is the test binary itself, run on
//! one test ([`child_main`]) that feeds a real `StdoutSink` the batches its standard input
//! carries and answers each call on standard error. The parent sees a [`Sink`] whose calls go
//! to the child, and a [`Reader`] of the child's standard output: the sink's real output
//! through a real pipe, with nothing of the broker mocked.
//!
//! "Freezing" it is a pipe nobody reads: the parent stops reading and the child is made to
//! write a line larger than the pipe holds, so its writer thread blocks and every later call
//! waits, as a relay writing to a stalled consumer does.

// Test code: a failed expectation should panic with its message.
#![allow(clippy::unwrap_used)]

use std::collections::{HashMap, VecDeque};
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use outbox_core::{Envelope, Sink, SinkError, SinkErrorKind};
use outbox_sinks::read::{Delivered, Polled, Reader};
use serde_json::{json, Value};
use tokio::sync::oneshot;

/// Set in the child's environment: [`child_main`] runs only there.
const CHILD_ENV: &str = "OUTBOX_TESTKIT_STDOUT_CHILD";

/// The child's side: publishes each batch its stdin carries (one JSON line per call) with a
/// `StdoutSink`, answering each call on stderr. Returns at once outside the child.
pub fn child_main() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let sink = Arc::new(outbox_sinks::stdout::StdoutSink::new().unwrap());
        while let Some(line) = rx.recv().await {
            let sink = sink.clone();
            tokio::spawn(async move {
                let request: Value = serde_json::from_str(&line).unwrap();
                let batch: Vec<Envelope> = request["batch"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(decode)
                    .collect();
                let results: Vec<Value> = sink
                    .publish(&batch)
                    .await
                    .into_iter()
                    .map(|r| match r {
                        Ok(()) => Value::Null,
                        Err(e) => json!({ "kind": format!("{:?}", e.kind), "message": e.message }),
                    })
                    .collect();
                let answer = json!({ "call": request["call"], "results": results });
                let _ = writeln!(std::io::stderr().lock(), "{answer}");
            });
        }
    });
}

fn encode(e: &Envelope) -> Value {
    json!({
        "id": e.id,
        "destination": e.destination,
        "key": e.key,
        "headers": e.headers,
        "payload": String::from_utf8_lossy(&e.payload),
        "created_at": e.created_at.to_rfc3339(),
    })
}

fn decode(v: &Value) -> Envelope {
    Envelope {
        id: v["id"].as_str().unwrap().parse().unwrap(),
        destination: v["destination"].as_str().unwrap().into(),
        key: v["key"].as_str().unwrap().into(),
        headers: serde_json::from_value(v["headers"].clone()).unwrap(),
        payload: outbox_core::Bytes::from(v["payload"].as_str().unwrap().to_string()),
        created_at: chrono::DateTime::parse_from_rfc3339(v["created_at"].as_str().unwrap())
            .unwrap()
            .into(),
    }
}

type Pending = Arc<Mutex<HashMap<u64, oneshot::Sender<Vec<Result<(), SinkError>>>>>>;

/// The child process and the parent's ends of its pipes.
pub struct StdoutProcess {
    child: Child,
    stdin: Arc<Mutex<ChildStdin>>,
    pending: Pending,
    calls: AtomicU64,
    lines: Arc<Mutex<VecDeque<Delivered>>>,
    paused: Arc<AtomicBool>,
}

impl StdoutProcess {
    /// Starts the test binary on its test `child_test` (which calls [`child_main`]).
    pub fn start(child_test: &str) -> Arc<Self> {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([child_test, "--exact", "--ignored", "--nocapture", "-q"])
            .args(["--test-threads", "1"])
            .env(CHILD_ENV, "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (stdout, stderr) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
        let me = Arc::new(Self {
            stdin: Arc::new(Mutex::new(child.stdin.take().unwrap())),
            child,
            pending: Arc::default(),
            calls: AtomicU64::new(1),
            lines: Arc::default(),
            paused: Arc::default(),
        });
        let (lines, paused) = (me.lines.clone(), me.paused.clone());
        std::thread::spawn(move || {
            // Raw reads of at most 4 KiB, the pause checked before each: a paused reader
            // leaves the rest of a long line in the pipe.
            let mut out = stdout;
            let mut buf = [0u8; 4096];
            let mut line = Vec::new();
            loop {
                while paused.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(20));
                }
                let n = match out.read(&mut buf) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                line.extend_from_slice(&buf[..n]);
                while let Some(end) = line.iter().position(|b| *b == b'\n') {
                    let text: Vec<u8> = line.drain(..=end).collect();
                    let text = String::from_utf8_lossy(&text);
                    // The test runner's own lines are not JSON objects.
                    let Some(start) = text.find('{') else {
                        continue;
                    };
                    if let Some(d) = parse_line(text[start..].trim_end()) {
                        lines.lock().unwrap().push_back(d);
                    }
                }
            }
        });
        let pending = me.pending.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { return };
                let Ok(answer) = serde_json::from_str::<Value>(&line) else {
                    continue;
                };
                let results = answer["results"]
                    .as_array()
                    .map(|r| r.iter().map(result).collect())
                    .unwrap_or_default();
                if let Some(tx) = answer["call"]
                    .as_u64()
                    .and_then(|c| pending.lock().unwrap().remove(&c))
                {
                    let _ = tx.send(results);
                }
            }
        });
        me
    }

    fn send(&self, call: u64, batch: &[Envelope]) {
        let request =
            json!({ "call": call, "batch": batch.iter().map(encode).collect::<Vec<_>>() });
        let mut stdin = self.stdin.lock().unwrap();
        writeln!(stdin, "{request}").unwrap();
        stdin.flush().unwrap();
    }

    /// A pipe nobody reads: stops reading, and has the child write a line larger than the
    /// pipe holds (a message of its own, outside any test's ids), so its writer blocks.
    pub fn freeze(&self) {
        self.paused.store(true, Ordering::SeqCst);
        let mut e = crate::relay::envelope("filler", "filler", 0);
        e.payload = outbox_core::Bytes::from(format!("{{\"pad\":\"{}\"}}", "x".repeat(256 * 1024)));
        self.send(0, &[e]);
    }

    /// Reads again.
    pub fn thaw(&self) {
        self.paused.store(false, Ordering::SeqCst);
    }
}

impl Drop for StdoutProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn result(v: &Value) -> Result<(), SinkError> {
    if v.is_null() {
        return Ok(());
    }
    let kind = match v["kind"].as_str() {
        Some("Unavailable") => SinkErrorKind::Unavailable,
        Some("Invalid") => SinkErrorKind::Invalid,
        _ => SinkErrorKind::Rejected,
    };
    Err(SinkError::new(
        kind,
        v["message"].as_str().unwrap_or_default(),
    ))
}

/// One line as the sinks write it (`jsonl.rs`), its payload byte for byte.
fn parse_line(line: &str) -> Option<Delivered> {
    let fields: HashMap<String, Box<serde_json::value::RawValue>> =
        serde_json::from_str(line).ok()?;
    let field =
        |name: &str| -> Option<Value> { serde_json::from_str(fields.get(name)?.get()).ok() };
    Some(Delivered {
        id: field("id")?.as_str()?.parse().ok()?,
        destination: field("destination")?.as_str().unwrap_or_default().into(),
        key: field("key")?.as_str().unwrap_or_default().into(),
        headers: field("headers")?
            .as_object()?
            .iter()
            .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
            .collect(),
        payload: outbox_core::Bytes::from(fields.get("payload")?.get().to_string()),
    })
}

/// The sink in the child process.
pub struct ProcessSink(pub Arc<StdoutProcess>);

#[async_trait]
impl Sink for ProcessSink {
    fn name(&self) -> &str {
        "stdout"
    }

    async fn publish(&self, batch: &[Envelope]) -> Vec<Result<(), SinkError>> {
        let call = self.0.calls.fetch_add(1, Ordering::SeqCst);
        let (tx, rx) = oneshot::channel();
        self.0.pending.lock().unwrap().insert(call, tx);
        self.0.send(call, batch);
        rx.await.unwrap_or_else(|_| {
            batch
                .iter()
                .map(|_| Err(SinkError::unavailable("the stdout sink's process is gone")))
                .collect()
        })
    }
}

/// A reader of the child's standard output.
pub struct ProcessReader(pub Arc<StdoutProcess>);

#[async_trait]
impl Reader for ProcessReader {
    async fn poll(&mut self, wait: Duration) -> Polled {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let delivered: Vec<Delivered> = self.0.lines.lock().unwrap().drain(..).collect();
            if !delivered.is_empty() || tokio::time::Instant::now() >= deadline {
                return Polled {
                    delivered,
                    unreadable: 0,
                };
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn describe(&self) -> String {
        "JSON lines on a child process's standard output".into()
    }

    async fn cleanup(&mut self) {}
}

/// Freezing and thawing the child's pipe; it has no broker to stop.
impl crate::sink_suite::Outage for ProcessReader {
    fn stop(&mut self) {
        panic!("the stdout sink has no broker to stop: except the case");
    }
    fn start(&mut self) {}
    fn freeze(&mut self) {
        self.0.freeze();
    }
    fn thaw(&mut self) {
        self.0.thaw();
    }
}
