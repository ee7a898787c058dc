//! `outbox inbox` as users run it, in what is particular to one broker or to the daemon's own
//! machinery (the scenarios every source shares are the source conformance suite, in
//! `inbox_sources.rs`): a second daemon standing by and taking over, a daemon that lost its
//! source lock, a NATS pull request lost with the server, and failed messages listed and
//! redriven from the command line (on PostgreSQL and on MariaDB).

#![allow(clippy::unwrap_used)]

use crate::common;
use crate::inboxkit;
use std::time::{Duration, Instant};

use inboxkit::{outbox, NatsChannel, Redis};
use outbox_testkit::inbox_backends::{MysqlInbox, PgInbox};
use outbox_testkit::inbox_suite::InboxBackend;
use outbox_testkit::source_suite::{
    assert_ingested_once, publish, wait_ingested, workload, Channel, Daemon, SourceFixture,
};
use uuid::Uuid;

const WAIT: Duration = Duration::from_secs(60);

/// A pull request the server took and died before answering is never answered: the client
/// keeps no timer for a no-wait fetch. Freezing the server (SIGSTOP) strands the daemon's next
/// fetch in its socket; killing it then loses the request. The daemon must count such a fetch
/// as broken off, not wait for it forever holding the source lock, and must obey SIGTERM while
/// a fetch is stranded. This hung a CI run for an hour before the fetch was bounded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pull_request_lost_with_the_server_does_not_hang_the_daemon() {
    let b = PgInbox::start().await;
    let mut server = common::PrivateNats::start();
    let ch = NatsChannel::new(&server.url(), "ibx", true).await;
    let first = workload(&ch.destination(), 5, 20, 0);
    publish(&ch, &first).await;
    let a = Daemon::start(outbox, &b, &ch.source_url(), 100);
    wait_ingested(&b, first.len() as i64, WAIT).await;
    // The daemon polls every 20 ms: within half a second its next fetch is in the frozen
    // server's socket. Then the server dies with it and comes back on the same port and store.
    server.signal("-STOP");
    tokio::time::sleep(Duration::from_millis(500)).await;
    server.down(); // SIGKILL, which a stopped process takes without running again
    server.up();
    let second = workload(&ch.destination(), 5, 20, 20);
    publish(&ch, &second).await;
    let all: Vec<_> = first.into_iter().chain(second).collect();
    wait_ingested(&b, all.len() as i64, WAIT).await;
    assert_ingested_once(&b, &all, true).await;
    // And a daemon whose fetch is stranded in a frozen server still stops when asked.
    server.signal("-STOP");
    tokio::time::sleep(Duration::from_millis(500)).await;
    a.stop();
    server.signal("-CONT");
    b.teardown().await;
}

/// A second daemon on the same source stands by, and takes over when the first is killed:
/// every message once, each key in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_daemon_stands_by_and_takes_over_when_the_first_is_killed() {
    let b = PgInbox::start().await;
    let ch = Redis::new().channel("ibx").await;
    let msgs = workload(&ch.destination(), 10, 100, 0);
    publish(ch.as_ref(), &msgs[..500]).await;
    let a = Daemon::start(outbox, &b, &ch.source_url(), 100);
    wait_ingested(&b, 500, WAIT).await;
    let standby = Daemon::start(outbox, &b, &ch.source_url(), 100);
    tokio::time::sleep(Duration::from_millis(800)).await;
    a.kill();
    publish(ch.as_ref(), &msgs[500..]).await;
    wait_ingested(&b, msgs.len() as i64, WAIT).await;
    assert_ingested_once(&b, &msgs, true).await;
    standby.stop();
    ch.cleanup().await;
    b.teardown().await;
}

/// A daemon whose source lock ended (its connection terminated, as a database restart does)
/// fetches nothing until it holds the lock again. Had it fetched, the messages it took could
/// not be recorded on the dead connection and would wait for redelivery (the ack wait, 30 s
/// here) while the lock's next holder went on with newer ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_that_lost_its_lock_fetches_nothing_until_it_holds_it_again() {
    let b = PgInbox::start().await;
    let ch = NatsChannel::new(&common::nats_url(), "ibx", false).await;
    let source = format!("{}?stream={}&ack_wait=30s", ch.url, ch.stream);
    let msgs = workload(&ch.destination(), 10, 20, 0);
    let a = Daemon::start(outbox, &b, &source, 50);
    publish(&ch, &msgs[..100]).await;
    wait_ingested(&b, 100, WAIT).await;
    // The backend holding this daemon's advisory lock (keyed as `outbox inbox` keys it).
    let ended: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(l.pid) FROM pg_locks AS l
         WHERE l.locktype = 'advisory' AND l.granted
           AND ((l.classid::int8 << 32) | l.objid::int8)
               = hashtextextended('outbox-inbox-source:' || $1 || ':nats:' || $2, 0)",
    )
    .bind(&b.name)
    .bind(&ch.stream)
    .fetch_all(&b.pool)
    .await
    .unwrap();
    assert_eq!(ended, [true], "one backend held the source lock");
    publish(&ch, &msgs[100..]).await;
    wait_ingested(&b, msgs.len() as i64, Duration::from_secs(15)).await;
    assert_ingested_once(&b, &msgs, true).await;
    assert_eq!(
        ch.consumer_info().await.num_redelivered,
        0,
        "nothing was fetched and left to the broker"
    );
    a.stop();
    Box::new(ch).cleanup().await;
    b.teardown().await;
}

/// A handler gives up on a message: `outbox status --inbox` and `outbox failed --inbox` show it
/// with its error, `outbox redrive --inbox --id` gives it a fresh budget (audited), and its key
/// drains in order once the handler is fixed. The inbox is made by `outbox migrate --inbox`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_inbox_messages_are_listed_and_redriven_from_the_command_line() {
    let schema = outbox_testkit::unique_name("ibx");
    failed_and_redriven(&common::database_url(), &schema, PgInbox::open(&schema)).await;
}

/// The same with the inbox on MariaDB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_inbox_messages_are_listed_and_redriven_from_the_command_line_on_mariadb() {
    let schema = outbox_testkit::unique_name("ibx");
    failed_and_redriven(
        &outbox_testkit::inbox_backends::mysql_url(),
        &schema,
        MysqlInbox::open(&schema),
    )
    .await;
}

/// The failed-and-redriven scenario on the inbox `url` and `schema` name, which `open` opens
/// once `outbox migrate --inbox` made it.
async fn failed_and_redriven<B: InboxBackend>(
    url: &str,
    schema: &str,
    open: impl std::future::Future<Output = B>,
) {
    use outbox_inbox::{HandlerError, Handlers, InboxMessage, ProcessorConfig};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let db = ["--database-url", url, "--schema", schema];
    let o = outbox()
        .args(["migrate", "--inbox"])
        .args(db)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains("applied migrations [1]"));
    let b = open.await;
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
    outbox_testkit::inbox_suite::ingest(&b, &msgs).await;
    let broken = Arc::new(AtomicBool::new(true));
    let handled = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (brk, h) = (broken.clone(), handled.clone());
    let handlers = Handlers::new().on_fn("order.paid", move |_tx, m| {
        let (brk, h) = (brk.clone(), h.clone());
        Box::pin(async move {
            if brk.load(Ordering::SeqCst) && m.payload["n"] == 0 {
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
    let task = tokio::spawn(b.processor(handlers, config).run(stop.clone()));
    let cli = |args: &[&str]| {
        let o = outbox().args(args).args(db).output().unwrap();
        (
            o.status.success(),
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let deadline = Instant::now() + WAIT;
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
    let deadline = Instant::now() + WAIT;
    while handled.lock().unwrap().len() < 3 {
        assert!(Instant::now() < deadline, "not drained after the redrive");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(*handled.lock().unwrap(), vec![0, 1, 2]);
    let reason = b
        .texts("SELECT reason FROM {schema}_inbox.outbox_redrives")
        .await;
    assert_eq!(reason, vec![vec![Some("currency table fixed".to_string())]]);
    let (ok, _, err) = cli(&["redrive", "--inbox", "--id", &id]);
    assert!(!ok, "no longer failed: {err}");
    stop.cancel();
    task.await.unwrap();
    b.teardown().await;
}
