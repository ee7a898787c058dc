//! Deadlines: no publish and no store call may hang the relay. A sink that never answers, a
//! database connection that goes silent, and settings whose ack timeout does not fit in the
//! lease are each met with a bounded wait and a clear outcome.

#![allow(clippy::unwrap_used)]

use crate::common;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{sigterm, wait_exit, World};
use outbox_core::{NewMessage, Store};
use outbox_postgres::PgStore;
use outbox_relay::Relay;
use outbox_testkit::sinks::MemorySink;
use tokio_util::sync::CancellationToken;

fn outbox() -> Command {
    common::outbox_command(&std::env::temp_dir())
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A relay whose ack timeout does not fit in a third of its lease could still be waiting for an
/// acknowledgement when its lease runs out: the settings are refused before anything starts.
#[test]
fn relay_refuses_an_ack_timeout_longer_than_a_third_of_the_lease() {
    let relay = |sink: &str, lease: &str| {
        outbox()
            .args([
                "relay",
                "--database-url",
                "postgres://root@127.0.0.1:5432/test",
                "--sink",
                sink,
                "--lease",
                lease,
                "--print-config",
            ])
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    // NATS waits 5 s for an acknowledgement by default; a third of 3 s is 1 s.
    let o = relay("nats://127.0.0.1:4222", "3s");
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(
        e.contains("ack_timeout 5s") && e.contains("lease 3s"),
        "the message must name both values: {e}"
    );
    let o = relay("nats://127.0.0.1:4222?ack_timeout=1500ms", "4s");
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("ack_timeout 1500ms"), "{}", stderr(&o));
    // What fits is accepted.
    let o = relay("nats://127.0.0.1:4222?ack_timeout=1s", "3s");
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let o = relay("nats://127.0.0.1:4222", "15s");
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    // The same rule for a lease from the environment.
    let o = outbox()
        .args([
            "relay",
            "--database-url",
            "postgres://root@127.0.0.1:5432/test",
            "--sink",
            "nats://127.0.0.1:4222",
            "--print-config",
        ])
        .env("OUTBOX_LEASE", "6s")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("lease 6s"), "{}", stderr(&o));
}

/// `stdout:` into a pipe nobody reads: the write blocks for ever once the pipe is full. The
/// relay gives the call a third of its lease, records a retry for its messages, and still stops
/// on SIGTERM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sink_that_never_answers_gets_a_retry_recorded_within_the_deadline() {
    let w = World::new().await;
    // About 300 KB of JSON lines: far more than a pipe holds.
    let pad = "x".repeat(1000);
    let msgs: Vec<NewMessage> = (0..300)
        .map(|i| {
            NewMessage::new(
                "order",
                format!("k{i}"),
                "placed",
                serde_json::json!({ "n": i, "pad": pad }),
            )
        })
        .collect();
    w.store().insert(&msgs).await.unwrap();
    let mut child = outbox()
        .args([
            "relay",
            "--database-url",
            &common::database_url(),
            "--schema",
            w.schema.as_str(),
            "--sink",
            "stdout:",
            "--lease",
            "3s",
            "--workers",
            "1",
            "--poll-interval",
            "100ms",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped()) // never read
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let deadline = started + Duration::from_secs(15);
    let error = loop {
        let e: Option<String> = sqlx::query_scalar(&w.schema.render(
            "SELECT last_error FROM {schema}.outbox_parked WHERE state = 'retrying' LIMIT 1",
        ))
        .fetch_optional(&w.pool)
        .await
        .unwrap()
        .flatten();
        if let Some(e) = e {
            break e;
        }
        assert!(
            Instant::now() < deadline,
            "no retry recorded: the relay hangs on a sink that never answers"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // A third of the 3 s lease, plus the claim and the record.
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "retry recorded only after {:?}",
        started.elapsed()
    );
    assert!(error.contains("no answer within 1s"), "{error}");
    sigterm(&child);
    let status = wait_exit(&mut child, Duration::from_secs(15));
    assert!(status.success(), "{status:?}");
    drop(child.stdout.take());
    w.drop_all().await;
}

/// A TCP proxy in front of the real PostgreSQL that can go silent: connections stay open, bytes
/// stop flowing both ways (a network partition, a frozen VM). Only the database's traffic
/// passes through it; it stops accepting when dropped.
struct SilentableProxy {
    port: u16,
    silent: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
}

impl SilentableProxy {
    fn start(upstream: &str) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let silent = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let upstream = upstream.to_string();
        let (s, st) = (silent.clone(), stop.clone());
        std::thread::spawn(move || {
            while !st.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((client, _)) => {
                        let Ok(server) = TcpStream::connect(&upstream) else {
                            continue;
                        };
                        for (from, to) in [
                            (client.try_clone().unwrap(), server.try_clone().unwrap()),
                            (server, client),
                        ] {
                            let (s, st) = (s.clone(), st.clone());
                            std::thread::spawn(move || pump(from, to, &s, &st));
                        }
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        Self { port, silent, stop }
    }

    fn go_silent(&self) {
        self.silent.store(true, Ordering::SeqCst);
    }
}

impl Drop for SilentableProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// Copies `from` to `to` until either closes or the proxy stops; while silent, holds the bytes.
fn pump(mut from: TcpStream, mut to: TcpStream, silent: &AtomicBool, stop: &AtomicBool) {
    from.set_read_timeout(Some(Duration::from_millis(50)))
        .unwrap();
    let mut buf = [0u8; 16 * 1024];
    while !stop.load(Ordering::SeqCst) {
        if silent.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(20));
            continue;
        }
        match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => break,
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Both);
}

/// A database that stops answering without closing the connection must not hang the relay's
/// workers: every store call has a deadline, so a shutdown completes within a few deadlines.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_database_connection_cannot_hang_the_relay() {
    let w = World::new().await;
    let proxy = SilentableProxy::start("127.0.0.1:5432");
    let url =
        common::database_url().replace("127.0.0.1:5432", &format!("127.0.0.1:{}", proxy.port));
    assert!(url.contains(&proxy.port.to_string()), "{url}");
    let pool = outbox_postgres::connect_pool(&url, 4).await.unwrap();
    let store: Arc<dyn Store> = Arc::new(PgStore::new(pool, w.schema.clone()));
    let mut cfg = w.relay_config();
    cfg.workers = 1;
    cfg.store_timeout = Duration::from_secs(1);
    let sink = Arc::new(MemorySink::default());
    let stop = CancellationToken::new();
    let h = tokio::spawn(Relay::new(store, sink.clone(), cfg).run(stop.clone()));
    w.store()
        .insert(&common::interleaved(&common::keys("k", 10), 0..5))
        .await
        .unwrap();
    w.wait_drained(Duration::from_secs(30)).await;
    assert_eq!(sink.received().len(), 50);

    proxy.go_silent();
    // Let the worker get stuck in a store call, then ask it to stop.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let asked = Instant::now();
    stop.cancel();
    tokio::time::timeout(Duration::from_secs(60), h)
        .await
        .expect("the relay never stopped")
        .unwrap();
    // The call in flight and the release each wait at most the 1 s store deadline.
    assert!(
        asked.elapsed() < Duration::from_secs(5),
        "stopping took {:?}: a store call outlived its deadline",
        asked.elapsed()
    );
    drop(proxy);
    w.drop_all().await;
}
