//! The Redis Streams sink end to end: PostgreSQL, the relay and the real Redis on this machine
//! (a private redis-server of the test's own for the restart), read back by the sink's reader.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::{HashMap, HashSet};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::outage::{assert_all_arrived_in_key_order, read_distinct, Backlog};
use common::{wait_state, World};
use outbox_core::{DestinationTemplate, Envelope, Sink, Store};
use outbox_relay::{CircuitState, Relay, RelayConfig};
use outbox_sinks::read::{read_until, scratch, Delivered, Reader, Scratch, ScratchOptions};
use outbox_sinks::redis::{RedisConfig, RedisReader, RedisSink};
use tokio_util::sync::CancellationToken;

fn redis_url() -> String {
    std::env::var("OUTBOX_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

/// The test relay's publish deadline is a third of its 3 s lease: the reply wait fits in it.
fn sink_url(base: &str, extra: &str) -> String {
    format!("{base}?ack_timeout=800ms{extra}")
}

fn sink(url: &str) -> Arc<RedisSink> {
    Arc::new(RedisSink::connect(RedisConfig::from_url(url).unwrap()).unwrap())
}

fn spawn(relay: Relay) -> (CancellationToken, tokio::task::JoinHandle<()>) {
    let stop = CancellationToken::new();
    let h = tokio::spawn(relay.run(stop.clone()));
    (stop, h)
}

fn config(w: &World, destination: &str) -> RelayConfig {
    let mut cfg = w.relay_config();
    cfg.destination = DestinationTemplate::parse(destination).unwrap();
    cfg
}

async fn new_scratch(tag: &str) -> Scratch {
    scratch(&redis_url(), &ScratchOptions::new(tag))
        .await
        .expect("Redis must be running")
}

async fn read_n(reader: &mut dyn Reader, n: usize) -> Vec<Delivered> {
    let mut got = read_until(reader, Duration::from_secs(30), |d| {
        d.iter().map(|m| m.id).collect::<HashSet<_>>().len() >= n
    })
    .await
    .delivered;
    got.extend(reader.poll(Duration::from_millis(300)).await.delivered);
    got
}

fn key_order(got: &[Delivered]) -> HashMap<String, u64> {
    common::assert_key_order(got.iter().map(|d| {
        let n = serde_json::from_slice::<serde_json::Value>(&d.payload).unwrap()["n"]
            .as_u64()
            .unwrap();
        (d.id.to_string(), d.key.clone(), n)
    }))
}

async fn wait_failed(w: &World, n: i64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while w.stats().await.failed < n {
        assert!(
            Instant::now() < deadline,
            "messages never ended failed: {:?}",
            w.stats().await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn redis_conn(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn minimal_sql_insert_arrives_with_id_key_headers_and_payload_fields() {
    let w = World::with_stream(false).await;
    let mut s = new_scratch("redismin").await;
    sqlx::query(&w.schema.render(
        "INSERT INTO {schema}.outbox (aggregate_type, aggregate_id, event_type, payload, headers)
         VALUES ('payment', 'p-42', 'created', '{\"amount\": 1000}', '{\"traceparent\": \"00-1-2-01\"}')",
    ))
    .execute(&w.pool)
    .await
    .unwrap();
    let id: uuid::Uuid = sqlx::query_scalar(&w.schema.render("SELECT id FROM {schema}.outbox"))
        .fetch_one(&w.pool)
        .await
        .unwrap();
    let (stop, h) = spawn(Relay::new(
        w.dyn_store(),
        sink(&sink_url(&redis_url(), "")),
        config(&w, &s.destination),
    ));
    w.wait_drained(Duration::from_secs(20)).await;
    stop.cancel();
    h.await.unwrap();

    // The raw entry: exactly the four documented fields.
    let mut c = redis_conn(&redis_url()).await;
    let raw: redis::streams::StreamRangeReply =
        redis::AsyncCommands::xrange_all(&mut c, &s.destination)
            .await
            .unwrap();
    assert_eq!(raw.ids.len(), 1);
    let mut fields: Vec<&str> = raw.ids[0].map.keys().map(String::as_str).collect();
    fields.sort();
    assert_eq!(fields, ["headers", "id", "key", "payload"]);

    let got = read_n(s.reader.as_mut(), 1).await;
    assert_eq!(got.len(), 1);
    let m = &got[0];
    assert_eq!(m.id, id);
    assert_eq!(m.destination, s.destination);
    assert_eq!(m.key, "p-42");
    assert_eq!(m.header("outbox-message-id"), Some(id.to_string().as_str()));
    assert_eq!(m.header("outbox-event-type"), Some("created"));
    assert_eq!(m.header("traceparent"), Some("00-1-2-01"));
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&m.payload).unwrap(),
        serde_json::json!({"amount": 1000})
    );
    s.reader.cleanup().await;
    w.drop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_key_keeps_its_order_over_a_thousand_messages() {
    let w = World::with_stream(false).await;
    let mut s = new_scratch("redisorder").await;
    let (keys, per_key) = (20, 50);
    w.store()
        .insert(&common::interleaved(&common::keys("k", keys), 0..per_key))
        .await
        .unwrap();
    let (stop, h) = spawn(Relay::new(
        w.dyn_store(),
        sink(&sink_url(&redis_url(), "")),
        config(&w, &s.destination),
    ));
    w.wait_drained(Duration::from_secs(60)).await;
    stop.cancel();
    h.await.unwrap();
    let got = read_n(s.reader.as_mut(), keys * per_key).await;
    assert_eq!(got.len(), keys * per_key, "each message once");
    let per = key_order(&got);
    assert_eq!(per.len(), keys);
    assert!(per.values().all(|&n| n as usize == per_key));
    s.reader.cleanup().await;
    w.drop_all().await;
}

fn envelope(stream: &str, n: u64) -> Envelope {
    Envelope {
        id: uuid::Uuid::now_v7(),
        destination: stream.into(),
        key: "k".into(),
        headers: vec![("outbox-message-id".into(), "x".into())],
        payload: outbox_core::Bytes::from(serde_json::json!({ "n": n }).to_string()),
        created_at: chrono::Utc::now(),
    }
}

/// On a private server: the restart in the middle empties the script cache (the sink loads the
/// script again) and must keep the dedupe markers (they are in the append-only file).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_republished_message_is_appended_once_inside_the_dedupe_window_and_twice_without() {
    let mut redis = PrivateRedis::start();
    let stream = outbox_testkit::unique_name("outbox_redis_dedupe");
    let plain = format!("{stream}_plain");
    let e = envelope(&stream, 0);
    let deduped = sink(&sink_url(&redis.url(), "&dedupe=1m"));
    // The same message three times (a relay crash after the append, before the record), and a
    // second message once.
    for _ in 0..3 {
        assert!(deduped.publish(std::slice::from_ref(&e)).await[0].is_ok());
    }
    assert!(deduped.publish(&[envelope(&stream, 1)]).await[0].is_ok());
    let mut c = redis_conn(&redis.url()).await;
    let len: u64 = redis::AsyncCommands::xlen(&mut c, &stream).await.unwrap();
    assert_eq!(len, 2, "the republished message is appended once");
    redis.down();
    redis.up();
    // The first publish after the restart may find the connection gone (an outage, retried).
    let deadline = Instant::now() + Duration::from_secs(10);
    while deduped.publish(std::slice::from_ref(&e)).await[0].is_err() {
        assert!(Instant::now() < deadline, "the sink never reconnected");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(deduped.publish(&[envelope(&stream, 2)]).await[0].is_ok());
    let mut c = redis_conn(&redis.url()).await;
    let len: u64 = redis::AsyncCommands::xlen(&mut c, &stream).await.unwrap();
    assert_eq!(
        len, 3,
        "still deduped after the restart, and new messages go on"
    );

    let mut p = e.clone();
    p.destination = plain.clone();
    let undeduped = sink(&sink_url(&redis.url(), ""));
    for _ in 0..2 {
        assert!(undeduped.publish(std::slice::from_ref(&p)).await[0].is_ok());
    }
    let len: u64 = redis::AsyncCommands::xlen(&mut c, &plain).await.unwrap();
    assert_eq!(
        len, 2,
        "without a window Redis keeps both; consumers dedupe on `id`"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maxlen_trims_the_stream_approximately() {
    let stream = outbox_testkit::unique_name("outbox_redis_maxlen");
    let s = sink(&sink_url(&redis_url(), "&maxlen=100"));
    let batch: Vec<Envelope> = (0..1000).map(|n| envelope(&stream, n)).collect();
    for chunk in batch.chunks(100) {
        assert!(s.publish(chunk).await.iter().all(Result::is_ok));
    }
    let mut c = redis_conn(&redis_url()).await;
    let len: u64 = redis::AsyncCommands::xlen(&mut c, &stream).await.unwrap();
    // `~` trims whole macro nodes (100 entries by default): at least 100 stay, far from 1,000.
    assert!((100..=300).contains(&len), "{len}");
    let _: () = redis::AsyncCommands::del(&mut c, &stream).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_of_another_type_and_an_oversized_row_fail_with_their_reason_and_others_flow() {
    let w = World::with_stream(false).await;
    let mut s = new_scratch("redisrej").await;
    let taken = outbox_testkit::unique_name("outbox_redis_string");
    let mut c = redis_conn(&redis_url()).await;
    let _: () = redis::AsyncCommands::set(&mut c, &taken, "not a stream")
        .await
        .unwrap();
    sqlx::query(&w.schema.render(
        "INSERT INTO {schema}.outbox (aggregate_type, aggregate_id, event_type, payload, headers, topic)
         VALUES ('order', 'wrongtype', 'placed', '{}', '{}', $1),
                ('order', 'big', 'placed', $2::jsonb, '{}', NULL),
                ('order', 'good', 'placed', '{\"n\": 0}', '{}', NULL),
                ('order', 'good', 'placed', '{\"n\": 1}', '{}', NULL)",
    ))
    .bind(&taken)
    .bind(serde_json::json!({ "blob": "x".repeat(4096) }).to_string())
    .execute(&w.pool)
    .await
    .unwrap();
    let mut cfg = config(&w, &s.destination);
    cfg.retry.max_attempts = 2;
    let relay = Relay::new(
        w.dyn_store(),
        sink(&sink_url(&redis_url(), "&max_message_size=1KiB")),
        cfg,
    );
    let breaker = relay.breaker();
    let (stop, h) = spawn(relay);
    wait_failed(&w, 2).await;
    w.wait_drained(Duration::from_secs(20)).await;
    assert_eq!(breaker.snapshot().0, CircuitState::Closed);
    stop.cancel();
    h.await.unwrap();
    let errors: HashMap<String, (String, i32)> = sqlx::query_as::<_, (String, String, i32)>(
        &w.schema.render(
            "SELECT aggregate_id, last_error, attempts FROM {schema}.outbox_parked WHERE state = 'failed'",
        ),
    )
    .fetch_all(&w.pool)
    .await
    .unwrap()
    .into_iter()
    .map(|(k, e, a)| (k, (e, a)))
    .collect();
    let (wrong, attempts) = &errors["wrongtype"];
    assert!(
        wrong.contains(&format!("stream `{taken}`")) && wrong.contains("WRONGTYPE"),
        "{wrong}"
    );
    assert_eq!(*attempts, 2, "a rejection spends its budget");
    let (big, attempts) = &errors["big"];
    assert!(big.contains("max_message_size"), "{big}");
    assert_eq!(*attempts, 1, "an oversized message fails at once");
    let got = read_n(s.reader.as_mut(), 2).await;
    assert_eq!(got.len(), 2);
    assert_eq!(key_order(&got)["good"], 2);
    let _: () = redis::AsyncCommands::del(&mut c, &taken).await.unwrap();
    s.reader.cleanup().await;
    w.drop_all().await;
}

/// A redis-server of this test's own on a free port, with an append-only file fsynced on every
/// write in its own directory: it can be killed and started without disturbing anything else,
/// and keeps every entry it acknowledged.
struct PrivateRedis {
    port: u16,
    dir: std::path::PathBuf,
    child: Option<Child>,
}

impl PrivateRedis {
    fn start() -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let dir = std::env::temp_dir().join(outbox_testkit::unique_name("redis"));
        std::fs::create_dir_all(&dir).unwrap();
        let mut me = Self {
            port,
            dir,
            child: None,
        };
        me.up();
        me
    }

    fn up(&mut self) {
        let child = Command::new("redis-server")
            .args([
                "--bind",
                "127.0.0.1",
                "--port",
                &self.port.to_string(),
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--dir",
            ])
            .arg(&self.dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be installed");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "private redis-server did not start"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Kills the server (SIGKILL: no shutdown save, only what the AOF already holds survives).
    fn down(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        self.down();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_killed_and_restarted_opens_and_closes_the_circuit_and_loses_nothing() {
    let mut redis = PrivateRedis::start();
    let w = World::with_stream(false).await;
    let stream = outbox_testkit::unique_name("outbox_redis_restart");
    let keys = common::keys("k", 10);
    let mut cfg = config(&w, &stream);
    cfg.retry.max_attempts = 1000;
    let relay = Relay::new(w.dyn_store(), sink(&sink_url(&redis.url(), "")), cfg);
    let breaker = relay.breaker();
    let (stop, h) = spawn(relay);
    // A reader connected before the outage, reading across it.
    let mut reader = RedisReader::new(RedisConfig::from_url(&redis.url()).unwrap(), &stream);
    w.store()
        .insert(&common::interleaved(&keys, 0..10))
        .await
        .unwrap();
    w.wait_drained(Duration::from_secs(30)).await;
    let mut got = read_n(&mut reader, 100).await;
    redis.down();
    w.store()
        .insert(&common::interleaved(&keys, 10..20))
        .await
        .unwrap();
    wait_state(&breaker, CircuitState::Open, Duration::from_secs(30)).await;
    assert_eq!(w.stats().await.failed, 0, "an outage fails nothing");
    redis.up();
    wait_state(&breaker, CircuitState::Closed, Duration::from_secs(60)).await;
    w.wait_drained(Duration::from_secs(60)).await;
    stop.cancel();
    h.await.unwrap();
    got.extend(read_n(&mut reader, 100).await);
    let distinct: HashSet<_> = got.iter().map(|d| d.id).collect();
    assert_eq!(
        distinct.len(),
        200,
        "every message reached the restarted server"
    );
    assert!(key_order(&got).values().all(|&n| n == 20));
    assert_eq!(reader.stored().await.unwrap(), 200, "and each once");
    let s = w.stats().await;
    assert_eq!((s.published, s.failed), (200, 0));
    w.drop_all().await;
}

/// The server is killed (SIGKILL) while the relay is half-way through a backlog, with a
/// pipeline of `XADD`s outstanding, and started again on its append-only file. Every entry
/// Redis acknowledged was fsynced first (`appendfsync always`), so the restarted server holds
/// it; what the kill cut off unacknowledged the relay sends again, so an entry may appear twice
/// but none is missing, and no key's first appearances are out of order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_killed_mid_stream_with_messages_in_flight_loses_nothing_and_keeps_key_order() {
    let mut redis = PrivateRedis::start();
    let w = World::with_stream(false).await;
    let stream = outbox_testkit::unique_name("outbox_redis_midstream");
    let (keys, per_key) = (20, 200);
    let cfg = config(&w, &stream);
    let d = Backlog::start(w, sink(&sink_url(&redis.url(), "")), cfg, keys, per_key).await;
    d.publishing(500).await;
    redis.down();
    let before = d.outage(Duration::from_secs(30)).await;
    redis.up();
    let (w, most) = d.finish(Duration::from_secs(45)).await;
    let mut reader = RedisReader::new(RedisConfig::from_url(&redis.url()).unwrap(), &stream);
    let got = read_distinct(&mut reader, keys * per_key, Duration::from_secs(30)).await;
    let dups = assert_all_arrived_in_key_order(&got, keys, per_key);
    eprintln!(
        "{before} of {} published before the kill was seen; a call caught by it held {most} \
         messages; {dups} entries appended twice",
        keys * per_key
    );
    w.drop_all().await;
}
