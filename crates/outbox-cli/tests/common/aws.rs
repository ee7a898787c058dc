//! Helpers of the SQS and SNS tests (included by `sink_sqs.rs` and `sink_sns.rs` with
//! `#[path]`): moto's endpoint, a runtime with moto's keys in the standard AWS chain, a relay
//! publishing to one destination, reading back and waiting for outcomes, and a private moto
//! server that a test can stop and start.

#![allow(dead_code, clippy::unwrap_used)] // each test binary uses a different subset

use std::future::Future;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use outbox_core::{DestinationTemplate, Envelope};
use outbox_relay::{CircuitState, Relay, RelayConfig};
use outbox_sinks::read::{read_until, Delivered, Reader};
use tokio_util::sync::CancellationToken;

use crate::common::World;

/// The shared moto server's endpoint (`scripts/services.sh` starts it).
pub fn moto_endpoint() -> String {
    std::env::var("OUTBOX_TEST_MOTO_URL").unwrap_or_else(|_| "http://127.0.0.1:4566".into())
}

/// Runs `test` on a two-thread runtime, after giving the standard AWS chain moto's keys when
/// the environment has none, and turning off its EC2 metadata lookups (they would leave this
/// machine). Set before the runtime starts, so no other thread reads the environment while it
/// changes; sink URLs never carry credentials.
pub fn run<F: Future<Output = ()>>(test: F) {
    for (k, v) in [
        ("AWS_ACCESS_KEY_ID", "test"),
        ("AWS_SECRET_ACCESS_KEY", "test"),
        ("AWS_EC2_METADATA_DISABLED", "true"),
    ] {
        if std::env::var_os(k).is_none() {
            std::env::set_var(k, v);
        }
    }
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(test)
}

/// A relay config publishing everything to `destination`. The lease is long enough for the
/// sink's 5-second ack timeout to fit in a third of it (moto is slow under a loaded machine).
pub fn relay_config(w: &World, destination: &str) -> RelayConfig {
    let mut cfg = w.relay_config();
    cfg.destination = DestinationTemplate::parse(destination).unwrap();
    cfg.lease = Duration::from_secs(15);
    cfg.batch_size = 200;
    cfg
}

pub fn spawn(relay: Relay) -> (CancellationToken, tokio::task::JoinHandle<()>) {
    let stop = CancellationToken::new();
    let h = tokio::spawn(relay.run(stop.clone()));
    (stop, h)
}

/// Reads `reader` until `n` messages came (or 60 s passed), then a little longer for any
/// duplicate.
pub async fn read_n(reader: &mut dyn Reader, n: usize) -> Vec<Delivered> {
    let mut got = read_until(reader, Duration::from_secs(60), |d| d.len() >= n)
        .await
        .delivered;
    got.extend(reader.poll(Duration::from_millis(500)).await.delivered);
    got
}

/// The `outbox_parked` row of `id`: (state, attempts, last_error).
pub async fn parked(w: &World, id: uuid::Uuid) -> Option<(String, i32, Option<String>)> {
    sqlx::query_as(
        &w.schema
            .render("SELECT state, attempts, last_error FROM {schema}.outbox_parked WHERE id = $1"),
    )
    .bind(id)
    .fetch_optional(&w.pool)
    .await
    .unwrap()
}

/// Waits until `id` ended `failed`; returns (attempts, last_error).
pub async fn wait_failed(w: &World, id: uuid::Uuid, limit: Duration) -> (i32, String) {
    let deadline = Instant::now() + limit;
    loop {
        if let Some((state, attempts, error)) = parked(w, id).await {
            if state == "failed" {
                return (attempts, error.unwrap_or_default());
            }
        }
        assert!(
            Instant::now() < deadline,
            "{id} did not end failed: {:?}",
            parked(w, id).await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Watches `breaker` until `stop`; the flag says whether it ever left `Closed`.
pub fn watch_breaker(
    breaker: Arc<outbox_relay::Breaker>,
    stop: CancellationToken,
) -> Arc<AtomicBool> {
    let left = Arc::new(AtomicBool::new(false));
    let flag = left.clone();
    tokio::spawn(async move {
        while !stop.is_cancelled() {
            if breaker.snapshot().0 != CircuitState::Closed {
                flag.store(true, Ordering::SeqCst);
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
    left
}

pub fn envelope(destination: &str, key: &str, n: u64) -> Envelope {
    let id = uuid::Uuid::now_v7();
    Envelope {
        id,
        destination: destination.to_string(),
        key: key.to_string(),
        headers: vec![
            ("outbox-message-id".into(), id.to_string()),
            ("outbox-event-type".into(), "changed".into()),
            ("outbox-aggregate-type".into(), "order".into()),
            ("outbox-aggregate-id".into(), key.to_string()),
        ],
        payload: bytes::Bytes::from(serde_json::json!({ "n": n }).to_string()),
        created_at: chrono::Utc::now(),
    }
}

/// An endpoint on a free port that reads each request and closes the connection without an
/// answer, as a server that dies mid-request does; its URL and its task.
pub async fn closing_endpoint() -> (String, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let task = tokio::spawn(async move {
        while let Ok((mut c, _)) = listener.accept().await {
            let mut buf = [0u8; 16 * 1024];
            let _ = tokio::io::AsyncReadExt::read(&mut c, &mut buf).await;
        }
    });
    (url, task)
}

/// A moto server of the test's own, on a free port: it can be stopped and started without
/// disturbing anything else on the machine. It keeps nothing across a restart (moto's state is
/// in memory).
pub struct PrivateMoto {
    port: u16,
    child: Option<Child>,
}

impl PrivateMoto {
    pub fn start() -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut me = Self { port, child: None };
        me.up();
        me
    }

    /// `OUTBOX_MOTO_SERVER`, else the project venv's `moto_server`, else the one on the PATH.
    fn bin() -> String {
        std::env::var("OUTBOX_MOTO_SERVER").unwrap_or_else(|_| {
            let venv = "/opt/outbox-venv/bin/moto_server";
            if std::path::Path::new(venv).exists() {
                venv.into()
            } else {
                "moto_server".into()
            }
        })
    }

    pub fn up(&mut self) {
        let child = Command::new(Self::bin())
            .args(["-H", "127.0.0.1", "-p", &self.port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("moto_server must be installed (scripts/services.sh installs it)");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(Instant::now() < deadline, "private moto did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn down(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }
}

impl Drop for PrivateMoto {
    fn drop(&mut self) {
        self.down();
    }
}
