//! `outbox inbox` as users run it: a real process consuming NATS JetStream and Redis Streams
//! into PostgreSQL, killed with `kill -9` mid-stream and restarted: nothing lost, nothing twice
//! in the inbox or its processing queue, each key's messages recorded in the broker's order, and
//! the broker's pending acknowledgements drained. A predecessor that fetched and never
//! acknowledged is caught up with first, in order.

#![allow(clippy::unwrap_used)]

mod common;
#[path = "common/inbox.rs"]
mod inboxkit;

use inboxkit::{workload, Inbox};
use std::collections::HashMap;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer};
use common::{sigterm, wait_exit};
use futures::StreamExt;
use uuid::Uuid;

fn redis_url() -> String {
    std::env::var("OUTBOX_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

fn outbox() -> Command {
    common::outbox_command(&std::env::temp_dir())
}

struct Nats {
    url: String,
    js: jetstream::Context,
    stream: String,
    subject: String,
}

impl Nats {
    async fn new() -> Self {
        Self::at(common::nats_url(), false).await
    }

    /// A stream on the server at `url`, on disk when `durable` (it survives a restart).
    async fn at(url: String, durable: bool) -> Self {
        let client = async_nats::connect(&url).await.unwrap();
        let js = jetstream::new(client);
        let name = outbox_testkit::unique_name("ibx");
        let stream = name.to_uppercase();
        outbox_sinks::nats::create_stream(&js, &stream, vec![format!("{name}.>")], durable)
            .await
            .unwrap();
        Self {
            url,
            js,
            stream,
            subject: format!("{name}.order.paid"),
        }
    }

    fn source(&self) -> String {
        format!("{}?stream={}&ack_wait=2s", self.url, self.stream)
    }

    /// Publishes like `outbox relay` does: message id, type and key headers.
    async fn publish(&self, msgs: &[(Uuid, String, i64)]) {
        let mut acks = Vec::new();
        for (id, key, n) in msgs {
            let mut h = async_nats::HeaderMap::new();
            h.insert("outbox-message-id", id.to_string().as_str());
            h.insert("Nats-Msg-Id", id.to_string().as_str());
            h.insert("outbox-event-type", "order.paid");
            h.insert("outbox-aggregate-id", key.as_str());
            acks.push(
                self.js
                    .publish_with_headers(
                        self.subject.clone(),
                        h,
                        serde_json::json!({ "n": n }).to_string().into(),
                    )
                    .await
                    .unwrap(),
            );
        }
        for a in acks {
            a.await.unwrap();
        }
    }

    async fn consumer_info(&self) -> consumer::Info {
        self.js
            .get_stream(&self.stream)
            .await
            .unwrap()
            .consumer_info("outbox-inbox")
            .await
            .unwrap()
    }

    async fn drop_all(self) {
        let _ = self.js.delete_stream(&self.stream).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inbox_killed_with_sigkill_mid_stream_from_nats_loses_nothing_and_records_nothing_twice() {
    let inbox = Inbox::new().await;
    let nats = Nats::new().await;
    let msgs = workload(20, 150, 0);
    nats.publish(&msgs).await;
    let mut a = inbox.daemon(&nats.source(), 100);
    inbox.wait_count(600, Duration::from_secs(60)).await;
    a.kill().unwrap(); // SIGKILL: the batch in hand is neither committed nor acknowledged
    a.wait().unwrap();
    let at_kill = inbox.count().await;
    assert!(
        at_kill < msgs.len() as i64,
        "the daemon finished before it was killed: nothing tested"
    );
    // More arrive while no daemon runs.
    let more = workload(20, 10, 150);
    nats.publish(&more).await;
    let all: Vec<_> = msgs.iter().chain(&more).cloned().collect();
    let mut b = inbox.daemon(&nats.source(), 100);
    inbox
        .wait_count(all.len() as i64, Duration::from_secs(60))
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    inbox.check(&all).await;
    let info = nats.consumer_info().await;
    assert_eq!(
        (info.num_pending, info.num_ack_pending),
        (0, 0),
        "the broker's pending acks drained"
    );
    sigterm(&b);
    assert!(wait_exit(&mut b, Duration::from_secs(15)).success());
    nats.drop_all().await;
    inbox.drop_all().await;
}

/// A pull request the server took and died before answering is never answered: the client
/// keeps no timer for a no-wait fetch. Freezing the server (SIGSTOP) strands the daemon's next
/// fetch in its socket; killing it then loses the request. The daemon must count such a fetch
/// as broken off, not wait for it forever holding the source lock, and must obey SIGTERM while
/// a fetch is stranded. This hung a CI run for an hour before the fetch was bounded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pull_request_lost_with_the_server_does_not_hang_the_daemon() {
    let inbox = Inbox::new().await;
    let mut server = common::PrivateNats::start();
    let nats = Nats::at(server.url(), true).await;
    let first = workload(5, 20, 0);
    nats.publish(&first).await;
    let mut a = inbox.daemon(&nats.source(), 100);
    inbox
        .wait_count(first.len() as i64, Duration::from_secs(60))
        .await;
    // The daemon polls every 20 ms: within half a second its next fetch is in the frozen
    // server's socket. Then the server dies with it and comes back on the same port and store.
    server.signal("-STOP");
    tokio::time::sleep(Duration::from_millis(500)).await;
    server.down(); // SIGKILL, which a stopped process takes without running again
    server.up();
    let nats = Nats {
        url: server.url(),
        js: jetstream::new(async_nats::connect(server.url()).await.unwrap()),
        stream: nats.stream.clone(),
        subject: nats.subject.clone(),
    };
    let second = workload(5, 20, 20);
    nats.publish(&second).await;
    let all: Vec<_> = first.iter().chain(&second).cloned().collect();
    inbox
        .wait_count(all.len() as i64, Duration::from_secs(60))
        .await;
    inbox.check(&all).await;
    // And a daemon whose fetch is stranded in a frozen server still stops when asked.
    server.signal("-STOP");
    tokio::time::sleep(Duration::from_millis(500)).await;
    sigterm(&a);
    let status = wait_exit(&mut a, Duration::from_secs(15));
    server.signal("-CONT");
    assert!(status.success(), "{status}");
    inbox.drop_all().await;
}

/// A predecessor fetched a batch and died without acknowledging it (simulated by fetching with
/// the daemon's own durable consumer). The daemon must not ingest anything newer first: it
/// waits for those messages to come back (the ack wait, 2 s here) and records them, then the
/// rest, every key in publish order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_a_dead_daemon_fetched_from_nats_are_recorded_before_anything_newer() {
    let inbox = Inbox::new().await;
    let nats = Nats::new().await;
    let msgs = workload(5, 40, 0);
    nats.publish(&msgs).await;
    // The daemon creates its consumer; stop it before it reads (a source URL it accepts, then
    // SIGTERM before any message: simplest is to create the consumer the same way here).
    let stream = nats.js.get_stream(&nats.stream).await.unwrap();
    let c: consumer::PullConsumer = stream
        .create_consumer(consumer::pull::Config {
            durable_name: Some("outbox-inbox".into()),
            ack_policy: consumer::AckPolicy::Explicit,
            ack_wait: Duration::from_secs(2),
            max_deliver: -1,
            max_ack_pending: 100,
            ..Default::default()
        })
        .await
        .unwrap();
    let mut stolen = c.fetch().max_messages(30).messages().await.unwrap();
    let mut n = 0;
    while let Some(m) = stolen.next().await {
        m.unwrap();
        n += 1;
    }
    assert_eq!(n, 30, "the dead daemon's batch");
    let mut d = inbox.daemon(&nats.source(), 100);
    inbox
        .wait_count(msgs.len() as i64, Duration::from_secs(60))
        .await;
    inbox.check(&msgs).await;
    let info = nats.consumer_info().await;
    assert_eq!((info.num_pending, info.num_ack_pending), (0, 0));
    assert_eq!(
        info.config.max_ack_pending, 200,
        "two batches again after the catch-up"
    );
    sigterm(&d);
    assert!(wait_exit(&mut d, Duration::from_secs(15)).success());
    nats.drop_all().await;
    inbox.drop_all().await;
}

struct Redis {
    conn: redis::aio::MultiplexedConnection,
    stream: String,
}

impl Redis {
    async fn new() -> Self {
        let client = redis::Client::open(redis_url()).unwrap();
        let conn = client.get_multiplexed_async_connection().await.unwrap();
        Self {
            conn,
            stream: outbox_testkit::unique_name("ibx"),
        }
    }

    fn source(&self) -> String {
        format!("{}?stream={}", redis_url(), self.stream)
    }

    /// Appends like the Redis Streams sink of `outbox relay`: fields id, key, headers, payload.
    async fn publish(&mut self, msgs: &[(Uuid, String, i64)]) {
        let mut pipe = redis::pipe();
        for (id, key, n) in msgs {
            let headers = serde_json::json!({
                "outbox-message-id": id.to_string(),
                "outbox-event-type": "order.paid",
                "outbox-aggregate-id": key,
            });
            pipe.cmd("XADD")
                .arg(&self.stream)
                .arg("*")
                .arg("id")
                .arg(id.to_string())
                .arg("key")
                .arg(key)
                .arg("headers")
                .arg(headers.to_string())
                .arg("payload")
                .arg(serde_json::json!({ "n": n }).to_string())
                .ignore();
        }
        let () = pipe.query_async(&mut self.conn).await.unwrap();
    }

    /// Entries delivered to the group and not acknowledged.
    async fn pending(&mut self) -> i64 {
        let v: redis::Value = redis::cmd("XPENDING")
            .arg(&self.stream)
            .arg("outbox-inbox")
            .query_async(&mut self.conn)
            .await
            .unwrap();
        match v {
            redis::Value::Array(parts) => match parts.first() {
                Some(redis::Value::Int(n)) => *n,
                _ => -1,
            },
            _ => -1,
        }
    }

    async fn drop_all(mut self) {
        let _: redis::RedisResult<i64> = redis::cmd("DEL")
            .arg(&self.stream)
            .query_async(&mut self.conn)
            .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inbox_killed_with_sigkill_mid_stream_from_redis_loses_nothing_and_records_nothing_twice() {
    let inbox = Inbox::new().await;
    let mut redis = Redis::new().await;
    let msgs = workload(20, 150, 0);
    redis.publish(&msgs).await;
    let mut a = inbox.daemon(&redis.source(), 100);
    inbox.wait_count(600, Duration::from_secs(60)).await;
    a.kill().unwrap();
    a.wait().unwrap();
    assert!(
        inbox.count().await < msgs.len() as i64,
        "finished before the kill: nothing tested"
    );
    let more = workload(20, 10, 150);
    redis.publish(&more).await;
    let all: Vec<_> = msgs.iter().chain(&more).cloned().collect();
    let mut b = inbox.daemon(&redis.source(), 100);
    inbox
        .wait_count(all.len() as i64, Duration::from_secs(60))
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    inbox.check(&all).await;
    assert_eq!(
        redis.pending().await,
        0,
        "the group's pending entries drained"
    );
    sigterm(&b);
    assert!(wait_exit(&mut b, Duration::from_secs(15)).success());
    redis.drop_all().await;
    inbox.drop_all().await;
}

/// Another consumer of the group read entries and died: the daemon takes them over and
/// records them before anything newer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_a_dead_consumer_read_from_redis_are_recorded_before_anything_newer() {
    let inbox = Inbox::new().await;
    let mut redis = Redis::new().await;
    let msgs = workload(5, 40, 0);
    redis.publish(&msgs).await;
    let _: redis::Value = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(&redis.stream)
        .arg("outbox-inbox")
        .arg("0")
        .query_async(&mut redis.conn)
        .await
        .unwrap();
    let _: redis::Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg("outbox-inbox")
        .arg("dead-daemon")
        .arg("COUNT")
        .arg(30)
        .arg("STREAMS")
        .arg(&redis.stream)
        .arg(">")
        .query_async(&mut redis.conn)
        .await
        .unwrap();
    assert_eq!(redis.pending().await, 30);
    let mut d = inbox.daemon(&redis.source(), 100);
    inbox
        .wait_count(msgs.len() as i64, Duration::from_secs(60))
        .await;
    inbox.check(&msgs).await;
    assert_eq!(redis.pending().await, 0);
    sigterm(&d);
    assert!(wait_exit(&mut d, Duration::from_secs(15)).success());
    redis.drop_all().await;
    inbox.drop_all().await;
}

/// A second daemon on the same source stands by, and takes over when the first is killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_daemon_stands_by_and_takes_over_when_the_first_is_killed() {
    let inbox = Inbox::new().await;
    let mut redis = Redis::new().await;
    let msgs = workload(10, 100, 0);
    redis.publish(&msgs[..500]).await;
    let mut a = inbox.daemon(&redis.source(), 100);
    inbox.wait_count(500, Duration::from_secs(60)).await;
    let mut b = inbox.daemon(&redis.source(), 100);
    tokio::time::sleep(Duration::from_millis(800)).await;
    a.kill().unwrap();
    a.wait().unwrap();
    redis.publish(&msgs[500..]).await;
    inbox
        .wait_count(msgs.len() as i64, Duration::from_secs(60))
        .await;
    inbox.check(&msgs).await;
    sigterm(&b);
    assert!(wait_exit(&mut b, Duration::from_secs(15)).success());
    redis.drop_all().await;
    inbox.drop_all().await;
}

/// A daemon whose source lock ended (its connection terminated, as a database restart does)
/// fetches nothing until it holds the lock again. Had it fetched, the messages it took could
/// not be recorded on the dead connection and would wait for redelivery (the ack wait, 30 s
/// here) while the lock's next holder went on with newer ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_that_lost_its_lock_fetches_nothing_until_it_holds_it_again() {
    let inbox = Inbox::new().await;
    let nats = Nats::new().await;
    let source = format!("{}?stream={}&ack_wait=30s", nats.url, nats.stream);
    let msgs = workload(10, 20, 0);
    let mut a = inbox.daemon(&source, 50);
    nats.publish(&msgs[..100]).await;
    inbox.wait_count(100, Duration::from_secs(30)).await;
    // The backend holding this daemon's advisory lock (keyed as `outbox inbox` keys it).
    let ended: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(l.pid) FROM pg_locks AS l
         WHERE l.locktype = 'advisory' AND l.granted
           AND ((l.classid::int8 << 32) | l.objid::int8)
               = hashtextextended('outbox-inbox-source:' || $1 || ':nats:' || $2, 0)",
    )
    .bind(&inbox.schema)
    .bind(&nats.stream)
    .fetch_all(&inbox.pool)
    .await
    .unwrap();
    assert_eq!(ended, [true], "one backend held the source lock");
    nats.publish(&msgs[100..]).await;
    inbox
        .wait_count(msgs.len() as i64, Duration::from_secs(15))
        .await;
    inbox.check(&msgs).await;
    assert_eq!(
        nats.consumer_info().await.num_redelivered,
        0,
        "nothing was fetched and left to the broker"
    );
    sigterm(&a);
    assert!(wait_exit(&mut a, Duration::from_secs(15)).success());
    nats.drop_all().await;
    inbox.drop_all().await;
}

/// A handler gives up on a message: `outbox status --inbox` and `outbox failed --inbox` show it
/// with its error, `outbox redrive --inbox --id` gives it a fresh budget (audited), and its key
/// drains in order once the handler is fixed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_inbox_messages_are_listed_and_redriven_from_the_command_line() {
    use outbox_inbox::{
        HandlerError, Handlers, InboxMessage, InboxProcessor, InboxSchema, ProcessorConfig,
    };
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let inbox = Inbox::new().await;
    let schema = InboxSchema::new(&inbox.schema).unwrap();
    let msgs: Vec<InboxMessage> = (0..3)
        .map(|n| {
            InboxMessage::new(
                Uuid::now_v7(),
                "test",
                "order.paid",
                "k",
                serde_json::json!({ "n": n }),
            )
        })
        .collect();
    let mut tx = inbox.pool.begin().await.unwrap();
    outbox_inbox::Inbox::new(schema.clone())
        .ingest_many(&mut tx, &msgs)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let broken = Arc::new(AtomicBool::new(true));
    let handled = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (b, h) = (broken.clone(), handled.clone());
    let handlers = Handlers::new().on_fn("order.paid", move |_tx, m| {
        let (b, h) = (b.clone(), h.clone());
        Box::pin(async move {
            if b.load(Ordering::SeqCst) && m.payload["n"] == 0 {
                return Err(HandlerError::permanent("unknown currency XXX"));
            }
            h.lock().unwrap().push(m.payload["n"].as_i64().unwrap());
            Ok(())
        })
    });
    let config = ProcessorConfig {
        poll_interval: Duration::from_millis(20),
        lease: Duration::from_secs(3),
        ..ProcessorConfig::default()
    };
    let stop = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(
        InboxProcessor::postgres(inbox.pool.clone(), schema, handlers, config).run(stop.clone()),
    );
    let cli = |args: &[&str]| {
        let o = outbox()
            .args(args)
            .args([
                "--database-url",
                &common::database_url(),
                "--schema",
                &inbox.schema,
            ])
            .output()
            .unwrap();
        (
            o.status.success(),
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let listed = loop {
        let (ok, out, err) = cli(&["failed", "--inbox", "--format", "json"]);
        assert!(ok, "{err}");
        let v: Vec<serde_json::Value> = serde_json::from_str(&out).unwrap();
        if !v.is_empty() {
            break v;
        }
        assert!(Instant::now() < deadline, "nothing failed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(listed[0]["id"], msgs[0].id.to_string());
    assert!(listed[0]["last_error"]
        .as_str()
        .unwrap()
        .contains("unknown currency"));
    let (ok, out, _) = cli(&["status", "--inbox"]);
    assert!(ok && out.contains("failed              1"), "{out}");
    assert!(
        handled.lock().unwrap().is_empty(),
        "the key waits behind its failed head"
    );
    broken.store(false, Ordering::SeqCst);
    let id = msgs[0].id.to_string();
    let (ok, out, err) = cli(&[
        "redrive",
        "--inbox",
        "--id",
        &id,
        "--reason",
        "currency table fixed",
    ]);
    assert!(ok, "{out}{err}");
    assert!(out.contains("redriven 1 message(s)"), "{out}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while handled.lock().unwrap().len() < 3 {
        assert!(Instant::now() < deadline, "not drained after the redrive");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(*handled.lock().unwrap(), vec![0, 1, 2]);
    let reason: String = sqlx::query_scalar(&format!(
        "SELECT reason FROM {}_inbox.outbox_redrives",
        inbox.schema
    ))
    .fetch_one(&inbox.pool)
    .await
    .unwrap();
    assert_eq!(reason, "currency table fixed");
    let (ok, _, err) = cli(&["redrive", "--inbox", "--id", &id]);
    assert!(!ok, "no longer failed: {err}");
    stop.cancel();
    task.await.unwrap();
    inbox.drop_all().await;
}

/// The daemon on SQLite: `outbox migrate --inbox` and `outbox inbox` on one file, from Redis,
/// killed mid-stream and restarted; every message once, each key in order, in the inbox and in
/// its `inbox_queue` table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_ingests_into_sqlite_too_and_survives_sigkill() {
    let dir = std::env::temp_dir().join(outbox_testkit::unique_name("ibx_sqlite"));
    std::fs::create_dir_all(&dir).unwrap();
    let url = format!("sqlite://{}", dir.join("inbox.db").display());
    let o = outbox()
        .args(["migrate", "--inbox", "--database-url", &url])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let mut redis = Redis::new().await;
    let msgs = workload(20, 150, 0);
    redis.publish(&msgs).await;
    let daemon = || {
        outbox()
            .args([
                "inbox",
                "--database-url",
                &url,
                "--batch-size",
                "50",
                "--poll-interval",
                "20ms",
            ])
            .env("OUTBOX_INBOX_SOURCE", redis.source())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap()
    };
    let pool = outbox_sqlite::connect_pool(&url).await.unwrap();
    let count = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM inbox_messages")
            .fetch_one(&pool)
            .await
            .unwrap()
    };
    let mut a = daemon();
    let deadline = Instant::now() + Duration::from_secs(60);
    while count().await < 300 {
        assert!(Instant::now() < deadline, "nothing ingested");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    a.kill().unwrap();
    a.wait().unwrap();
    assert!(
        count().await < msgs.len() as i64,
        "the daemon finished before it was killed: nothing tested"
    );
    let mut b = daemon();
    let deadline = Instant::now() + Duration::from_secs(60);
    while count().await < msgs.len() as i64 {
        assert!(
            Instant::now() < deadline,
            "not everything ingested after the restart"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let rows: Vec<(String, String, String)> =
        sqlx::query_as("SELECT id, key, payload FROM inbox_messages ORDER BY seq")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(rows.len(), msgs.len());
    let mut last: HashMap<String, i64> = HashMap::new();
    for (_, key, payload) in &rows {
        let n = serde_json::from_str::<serde_json::Value>(payload).unwrap()["n"]
            .as_i64()
            .unwrap();
        let prev = last.insert(key.clone(), n);
        assert!(prev.is_none_or(|p| p < n), "key {key}: {n} after {prev:?}");
    }
    let (queued, distinct): (i64, i64) =
        sqlx::query_as("SELECT count(*), count(DISTINCT id) FROM inbox_queue")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!((queued, distinct), (msgs.len() as i64, msgs.len() as i64));
    assert_eq!(redis.pending().await, 0);
    sigterm(&b);
    assert!(wait_exit(&mut b, Duration::from_secs(15)).success());
    pool.close().await;
    redis.drop_all().await;
    std::fs::remove_dir_all(&dir).ok();
}
