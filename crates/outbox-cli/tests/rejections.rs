//! Rejected messages against a real JetStream: a message the broker refuses (no stream captures
//! its subject) spends its attempts and ends `failed`, never opens the circuit breaker, and never
//! holds back the subjects the broker accepts.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use common::World;
use outbox_core::{NewMessage, Store};
use outbox_relay::{CircuitState, Relay};
use outbox_sinks::nats::{NatsConfig, NatsSink};
use tokio_util::sync::CancellationToken;

/// The failure the issue describes: at low traffic with one worker, a single message for a
/// subject without a stream used to open the circuit, was then picked by every probe (the lowest
/// due seq), never spent an attempt, and stalled the whole relay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unstreamed_subject_ends_failed_within_max_attempts_while_a_streamed_one_flows_and_the_breaker_stays_closed(
) {
    let w = World::with_stream(false).await;
    // The stream captures only `<prefix>.good.>`; `<prefix>.bad.…` has no stream at all.
    outbox_sinks::nats::create_stream(
        &w.js,
        &w.stream,
        vec![format!("{}.good.>", w.prefix)],
        false,
    )
    .await
    .unwrap();
    let sink = NatsSink::connect(NatsConfig::from_url(&common::nats_url()).unwrap())
        .await
        .unwrap();
    let mut cfg = w.relay_config();
    cfg.workers = 1;
    cfg.retry.max_attempts = 6;
    // Fewer failures than the attempt budget open the circuit: if rejections counted, it would
    // open long before the message ends `failed`.
    cfg.breaker_threshold = 3;
    let relay = Relay::new(w.dyn_store(), Arc::new(sink), cfg);
    let breaker = relay.breaker();
    let stop = CancellationToken::new();
    let h = tokio::spawn(relay.run(stop.clone()));

    // Watch the breaker the whole time.
    let left_closed = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (breaker, left_closed, stop) = (breaker.clone(), left_closed.clone(), stop.clone());
        tokio::spawn(async move {
            while !stop.is_cancelled() {
                if breaker.snapshot().0 != CircuitState::Closed {
                    left_closed.store(true, Ordering::SeqCst);
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };

    let bad = NewMessage::new("bad", "bad-key", "placed", serde_json::json!({ "n": 0 }));
    w.store().insert(std::slice::from_ref(&bad)).await.unwrap();
    // Low traffic on the streamed subject: one message every 250 ms for 4 s. Each must be
    // published within a second of its insert while the rejected one retries.
    let mut good = 0i64;
    let trickle_until = Instant::now() + Duration::from_secs(4);
    while Instant::now() < trickle_until {
        let m = NewMessage::new(
            "good",
            "good-key",
            "placed",
            serde_json::json!({ "n": good }),
        );
        w.store().insert(&[m]).await.unwrap();
        good += 1;
        let deadline = Instant::now() + Duration::from_secs(1);
        loop {
            let published = w.stats().await.published;
            if published >= good {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "message {good} of the streamed subject was not published within 1 s \
                 ({published} published): the rejected message holds the relay back"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    // The rejected message spent exactly its budget and ended `failed`, with the reason.
    let deadline = Instant::now() + Duration::from_secs(10);
    let (state, attempts, error) = loop {
        let row: Option<(String, i32, Option<String>)> = sqlx::query_as(&w.schema.render(
            "SELECT state, attempts, last_error FROM {schema}.outbox_parked WHERE id = $1",
        ))
        .bind(bad.id)
        .fetch_optional(&w.pool)
        .await
        .unwrap();
        match row {
            Some((state, attempts, error)) if state == "failed" => break (state, attempts, error),
            other => assert!(
                Instant::now() < deadline,
                "the rejected message did not end failed: {other:?}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!((state.as_str(), attempts), ("failed", 6));
    let error = error.unwrap_or_default();
    assert!(error.contains("no JetStream stream"), "{error}");
    assert!(
        error.contains(&format!("{}.bad.placed", w.prefix)),
        "{error}"
    );
    stop.cancel();
    h.await.unwrap();
    watcher.await.unwrap();
    assert!(
        !left_closed.load(Ordering::SeqCst),
        "a rejected message must never open the circuit"
    );
    assert_eq!(w.stream_count().await, good as u64);
    let s = w.stats().await;
    assert_eq!((s.published, s.failed), (good, 1));
    w.drop_all().await;
}

/// A nats-server of this test's own on a free port, whose only user may publish anywhere except
/// `deny` (and JetStream's API, which it needs, stays allowed).
struct RestrictedNats {
    port: u16,
    dir: std::path::PathBuf,
    child: std::process::Child,
}

impl RestrictedNats {
    fn start(deny: &str) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let dir = std::env::temp_dir().join(outbox_testkit::unique_name("nats_perm"));
        std::fs::create_dir_all(&dir).unwrap();
        let conf = dir.join("nats.conf");
        std::fs::write(
            &conf,
            format!(
                "listen: 127.0.0.1:{port}\n\
                 jetstream {{ store_dir: \"{}\" }}\n\
                 authorization {{ users = [ {{ user: relay, password: relaypw, \
                 permissions: {{ publish: {{ allow: \">\", deny: \"{deny}\" }}, subscribe: \">\" }} }} ] }}\n",
                dir.join("js").display()
            ),
        )
        .unwrap();
        let child = std::process::Command::new("nats-server")
            .arg("-c")
            .arg(&conf)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("nats-server must be installed");
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "private nats-server did not start"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Self { port, dir, child }
    }

    fn url(&self) -> String {
        format!("nats://relay:relaypw@127.0.0.1:{}", self.port)
    }
}

impl Drop for RestrictedNats {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// NATS never answers a publish it denies: it sends an asynchronous permissions error and drops
/// the message, so the acknowledgement can only time out. That timeout is a rejection of the
/// message, not an outage: the message ends `failed` with the reason, the circuit stays closed,
/// and subjects the relay may publish to keep flowing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subject_the_relay_may_not_publish_to_ends_failed_and_never_opens_the_circuit() {
    let w = World::with_stream(false).await;
    let nats = RestrictedNats::start(&format!("{}.denied.>", w.prefix));
    let client = async_nats::connect_with_options(
        format!("nats://127.0.0.1:{}", nats.port),
        async_nats::ConnectOptions::with_user_and_password("relay".into(), "relaypw".into()),
    )
    .await
    .unwrap();
    let js = jetstream::new(client);
    // The stream captures both subjects: only the permission keeps `denied` out.
    outbox_sinks::nats::create_stream(&js, &w.stream, vec![format!("{}.>", w.prefix)], false)
        .await
        .unwrap();
    let sink = NatsSink::connect(
        NatsConfig::from_url(&format!("{}?ack_timeout=500ms", nats.url())).unwrap(),
    )
    .await
    .unwrap();
    let mut cfg = w.relay_config();
    cfg.workers = 1;
    cfg.retry.max_attempts = 5;
    cfg.breaker_threshold = 2;
    let relay = Relay::new(w.dyn_store(), Arc::new(sink), cfg);
    let breaker = relay.breaker();
    let stop = CancellationToken::new();
    let h = tokio::spawn(relay.run(stop.clone()));

    let denied = NewMessage::new(
        "denied",
        "denied-key",
        "placed",
        serde_json::json!({ "n": 0 }),
    );
    w.store()
        .insert(std::slice::from_ref(&denied))
        .await
        .unwrap();
    let mut good = 0i64;
    let mut left_closed = false;
    let deadline = Instant::now() + Duration::from_secs(30);
    let error = loop {
        if breaker.snapshot().0 != CircuitState::Closed {
            left_closed = true;
        }
        if good < 10 {
            let m = NewMessage::new(
                "good",
                "good-key",
                "placed",
                serde_json::json!({ "n": good }),
            );
            w.store().insert(&[m]).await.unwrap();
            good += 1;
        }
        let row: Option<(String, i32, Option<String>)> = sqlx::query_as(&w.schema.render(
            "SELECT state, attempts, last_error FROM {schema}.outbox_parked WHERE id = $1",
        ))
        .bind(denied.id)
        .fetch_optional(&w.pool)
        .await
        .unwrap();
        if let Some(("failed", attempts, error)) =
            row.as_ref().map(|(s, a, e)| (s.as_str(), *a, e.clone()))
        {
            assert_eq!(attempts, 5, "failed after exactly its budget");
            break error.unwrap_or_default();
        }
        assert!(
            Instant::now() < deadline,
            "the denied message did not end failed: {row:?}, circuit {:?}",
            breaker.snapshot()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert!(error.contains("permission"), "{error}");
    assert!(
        error.contains(&format!("{}.denied.placed", w.prefix)),
        "{error}"
    );
    assert!(!left_closed, "a denied subject must never open the circuit");
    let deadline = Instant::now() + Duration::from_secs(10);
    while w.stats().await.published < good {
        assert!(Instant::now() < deadline, "the allowed subject stalled");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.cancel();
    h.await.unwrap();
    drop(nats);
    w.drop_all().await;
}
