//! The RabbitMQ sink end to end: PostgreSQL, the relay and the real RabbitMQ on this machine
//! (a private broker of the test's own for the restart), read back by the sink's own reader.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::{HashMap, HashSet};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::outage::{assert_all_arrived_in_key_order, read_distinct, Backlog};
use common::{wait_state, World};
use lapin::options::{BasicGetOptions, ExchangeDeclareOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use outbox_core::{DestinationTemplate, Store};
use outbox_relay::{CircuitState, Relay, RelayConfig};
use outbox_sinks::amqp::{declare_scratch, AmqpConfig, AmqpReader, AmqpSink};
use outbox_sinks::read::{read_until, scratch, Delivered, Reader, Scratch, ScratchOptions};
use tokio_util::sync::CancellationToken;

fn amqp_url() -> String {
    std::env::var("OUTBOX_TEST_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into())
}

/// The test relay's publish deadline is a third of its 3 s lease: the confirms' wait fits in it.
fn sink_url(base: &str, extra: &str) -> String {
    format!("{base}?ack_timeout=800ms{extra}")
}

async fn sink(url: &str) -> Arc<AmqpSink> {
    Arc::new(
        AmqpSink::connect(AmqpConfig::from_url(url).unwrap())
            .await
            .unwrap(),
    )
}

fn spawn(relay: Relay) -> (CancellationToken, tokio::task::JoinHandle<()>) {
    let stop = CancellationToken::new();
    let h = tokio::spawn(relay.run(stop.clone()));
    (stop, h)
}

fn config(w: &World, s: &Scratch) -> RelayConfig {
    let mut cfg = w.relay_config();
    cfg.destination = DestinationTemplate::parse(&s.destination).unwrap();
    cfg
}

async fn new_scratch(tag: &str) -> Scratch {
    scratch(&amqp_url(), &ScratchOptions::new(tag))
        .await
        .expect("RabbitMQ must be running")
}

/// Reads until `n` distinct messages arrived (or 30 s), then a moment more for duplicates.
async fn read_n(reader: &mut dyn Reader, n: usize) -> Vec<Delivered> {
    let mut got = read_until(reader, Duration::from_secs(30), |d| {
        d.iter().map(|m| m.id).collect::<HashSet<_>>().len() >= n
    })
    .await
    .delivered;
    got.extend(reader.poll(Duration::from_millis(300)).await.delivered);
    got
}

/// Every key's messages, at their first delivery, are n = 0, 1, 2 …; returns the count per key.
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

async fn failed_errors(w: &World) -> HashMap<String, (String, i32)> {
    sqlx::query_as::<_, (String, String, i32)>(&w.schema.render(
        "SELECT aggregate_id, last_error, attempts FROM {schema}.outbox_parked WHERE state = 'failed'",
    ))
    .fetch_all(&w.pool)
    .await
    .unwrap()
    .into_iter()
    .map(|(k, e, a)| (k, (e, a)))
    .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn minimal_sql_insert_arrives_persistent_with_message_id_and_headers() {
    let w = World::with_stream(false).await;
    let mut s = new_scratch("amqpmin").await;
    let queue = s.destination.split('/').next().unwrap().to_string();
    sqlx::query(&w.schema.render(
        "INSERT INTO {schema}.outbox (aggregate_type, aggregate_id, event_type, payload, headers)
         VALUES ('payment', 'p-42', 'created', '{\"amount\": 1000}', '{\"traceparent\": \"00-1-2-01\"}')",
    ))
    .execute(&w.pool)
    .await
    .unwrap();
    // A second queue on the scratch exchange, to look at the message with the broker's client
    // (the reader consumes the scratch queue).
    let conn = lapin::Connection::connect(&amqp_url(), Default::default())
        .await
        .unwrap();
    let ch = conn.create_channel().await.unwrap();
    let look = format!("{queue}_look");
    ch.queue_declare(
        look.as_str().into(),
        QueueDeclareOptions {
            auto_delete: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await
    .unwrap();
    ch.queue_bind(
        look.as_str().into(),
        queue.as_str().into(),
        "#".into(),
        Default::default(),
        FieldTable::default(),
    )
    .await
    .unwrap();
    let id: uuid::Uuid = sqlx::query_scalar(&w.schema.render("SELECT id FROM {schema}.outbox"))
        .fetch_one(&w.pool)
        .await
        .unwrap();
    let (stop, h) = spawn(Relay::new(
        w.dyn_store(),
        sink(&sink_url(&amqp_url(), "")).await,
        config(&w, &s),
    ));
    w.wait_drained(Duration::from_secs(20)).await;
    stop.cancel();
    h.await.unwrap();

    // The broker's own view of the message: persistent, message_id, type.
    let got = ch
        .basic_get(look.as_str().into(), BasicGetOptions { no_ack: true })
        .await
        .unwrap()
        .expect("the message is in the queue");
    let p = &got.delivery.properties;
    assert_eq!(*p.delivery_mode(), Some(2), "persistent");
    assert_eq!(
        p.message_id().as_ref().unwrap().as_str(),
        id.to_string(),
        "message_id is the outbox id"
    );
    assert_eq!(p.kind().as_ref().unwrap().as_str(), "created");
    assert_eq!(
        got.delivery.exchange.as_str(),
        queue,
        "the template named the exchange"
    );
    assert_eq!(got.delivery.routing_key.as_str(), "created");
    ch.queue_delete(look.as_str().into(), Default::default())
        .await
        .unwrap();
    conn.close(200, "OK".into()).await.unwrap();

    let got = read_n(s.reader.as_mut(), 1).await;
    assert_eq!(got.len(), 1);
    let m = &got[0];
    assert_eq!(m.id, id);
    assert_eq!(m.destination, format!("{queue}/created"));
    assert_eq!(m.key, "p-42");
    assert_eq!(m.header("outbox-message-id"), Some(id.to_string().as_str()));
    assert_eq!(m.header("outbox-event-type"), Some("created"));
    assert_eq!(m.header("outbox-aggregate-type"), Some("payment"));
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
    let mut s = new_scratch("amqporder").await;
    let (keys, per_key) = (20, 50);
    w.store()
        .insert(&common::interleaved(&common::keys("k", keys), 0..per_key))
        .await
        .unwrap();
    let (stop, h) = spawn(Relay::new(
        w.dyn_store(),
        sink(&sink_url(&amqp_url(), "")).await,
        config(&w, &s),
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

/// Rows whose destination has nothing behind it, or that can never be sent, end `failed` with a
/// reason naming what is wrong, never open the circuit, and the other rows flow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unroutable_missing_exchange_and_oversized_rows_fail_with_their_reason_and_others_flow() {
    let w = World::with_stream(false).await;
    let mut s = new_scratch("amqprej").await;
    // An exchange with no queue bound: whatever goes there comes back (mandatory).
    let lonely = outbox_testkit::unique_name("amqp_lonely");
    let conn = lapin::Connection::connect(&amqp_url(), Default::default())
        .await
        .unwrap();
    let ch = conn.create_channel().await.unwrap();
    ch.exchange_declare(
        lonely.as_str().into(),
        lapin::ExchangeKind::Direct,
        ExchangeDeclareOptions::default(),
        FieldTable::default(),
    )
    .await
    .unwrap();
    let missing = outbox_testkit::unique_name("amqp_missing");
    sqlx::query(&w.schema.render(
        "INSERT INTO {schema}.outbox (aggregate_type, aggregate_id, event_type, payload, headers, topic)
         VALUES ('order', 'unroutable', 'placed', '{}', '{}', $1),
                ('order', 'missing', 'placed', '{}', '{}', $2),
                ('order', 'big', 'placed', $3::jsonb, '{}', NULL),
                ('order', 'bcc', 'placed', '{}', '{\"BCC\": \"elsewhere\"}', NULL),
                ('order', 'good', 'placed', '{\"n\": 0}', '{}', NULL),
                ('order', 'good', 'placed', '{\"n\": 1}', '{}', NULL)",
    ))
    .bind(format!("{lonely}/nowhere.key"))
    .bind(format!("{missing}/any"))
    .bind(serde_json::json!({ "blob": "x".repeat(4096) }).to_string())
    .execute(&w.pool)
    .await
    .unwrap();
    let mut cfg = config(&w, &s);
    cfg.retry.max_attempts = 2;
    let relay = Relay::new(
        w.dyn_store(),
        sink(&sink_url(&amqp_url(), "&max_message_size=1KiB")).await,
        cfg,
    );
    let breaker = relay.breaker();
    let (stop, h) = spawn(relay);
    wait_failed(&w, 4).await;
    w.wait_drained(Duration::from_secs(20)).await;
    assert_eq!(breaker.snapshot().0, CircuitState::Closed);
    stop.cancel();
    h.await.unwrap();

    let errors = failed_errors(&w).await;
    let (unroutable, _) = &errors["unroutable"];
    assert!(
        unroutable.contains("unroutable")
            && unroutable.contains(&format!("exchange `{lonely}` routing key `nowhere.key`")),
        "{unroutable}"
    );
    let (gone, _) = &errors["missing"];
    assert!(
        gone.contains(&format!("exchange `{missing}` does not exist")),
        "{gone}"
    );
    let (big, attempts) = &errors["big"];
    assert!(big.contains("max_message_size"), "{big}");
    assert_eq!(*attempts, 1, "an oversized message fails at once");
    let (bcc, attempts) = &errors["bcc"];
    assert!(bcc.contains("`BCC`"), "{bcc}");
    assert_eq!(*attempts, 1);
    assert_eq!(errors["unroutable"].1, 2, "a rejection spends its budget");

    let got = read_n(s.reader.as_mut(), 2).await;
    assert_eq!(got.len(), 2);
    assert!(got.iter().all(|d| d.key == "good"));
    assert_eq!(key_order(&got)["good"], 2);
    ch.exchange_delete(lonely.as_str().into(), Default::default())
        .await
        .unwrap();
    conn.close(200, "OK".into()).await.unwrap();
    s.reader.cleanup().await;
    w.drop_all().await;
}

/// Closes, from the broker's side, every connection whose client-given name is `name`
/// (`rabbitmqctl close_connection`): the broker stays up for everyone else.
fn close_connections_named(name: &str) -> usize {
    let out = Command::new("rabbitmqctl")
        .args(["-q", "list_connections", "pid", "client_properties"])
        .output()
        .expect("rabbitmqctl must be installed");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // One line per connection: `<pid>\t[{"connection_name",longstr,"NAME"},…]`.
    let quoted = format!("\"{name}\"");
    let mut closed = 0;
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some((pid, props)) = line.split_once('\t') else {
            continue;
        };
        if !props.contains(&quoted) {
            continue;
        }
        let out = Command::new("rabbitmqctl")
            .args(["-q", "close_connection", pid, "outbox-test-close"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "close_connection {pid}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        closed += 1;
    }
    closed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_the_broker_closes_is_reopened_and_nothing_is_lost() {
    let w = World::with_stream(false).await;
    let mut s = new_scratch("amqpclose").await;
    let name = outbox_testkit::unique_name("outbox_close_test");
    let keys = common::keys("k", 10);
    let mut cfg = config(&w, &s);
    cfg.retry.max_attempts = 1000;
    let (stop, h) = spawn(Relay::new(
        w.dyn_store(),
        sink(&sink_url(&amqp_url(), &format!("&connection_name={name}"))).await,
        cfg,
    ));
    w.store()
        .insert(&common::interleaved(&keys, 0..20))
        .await
        .unwrap();
    w.wait_drained(Duration::from_secs(30)).await;
    // Close it while more rows are written, twice.
    for round in 0..2 {
        let from = 20 + round * 20;
        let writer = {
            let store = w.store();
            let msgs = common::interleaved(&keys, from..from + 20);
            tokio::spawn(async move {
                for chunk in msgs.chunks(10) {
                    store.insert(chunk).await.unwrap();
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            })
        };
        let closed = tokio::task::spawn_blocking({
            let name = name.clone();
            move || close_connections_named(&name)
        })
        .await
        .unwrap();
        assert!(closed >= 1, "the relay's connection was not found");
        writer.await.unwrap();
        w.wait_drained(Duration::from_secs(60)).await;
    }
    stop.cancel();
    h.await.unwrap();
    let got = read_n(s.reader.as_mut(), 600).await;
    let distinct: HashSet<_> = got.iter().map(|d| d.id).collect();
    assert_eq!(distinct.len(), 600, "every message arrived");
    assert!(key_order(&got).values().all(|&n| n == 60));
    let s_ = w.stats().await;
    assert_eq!((s_.published, s_.failed), (600, 0));
    s.reader.cleanup().await;
    w.drop_all().await;
}

/// A RabbitMQ node of this test's own (own node name, port, distribution port and data
/// directory): it can be stopped and started without disturbing anything else on the machine.
struct PrivateRabbit {
    port: u16,
    dir: std::path::PathBuf,
    child: Option<Child>,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl PrivateRabbit {
    fn start() -> Self {
        let dir = std::env::temp_dir().join(outbox_testkit::unique_name("rabbit"));
        std::fs::create_dir_all(&dir).unwrap();
        let mut me = Self {
            port: free_port(),
            dir,
            child: None,
        };
        me.up();
        me
    }

    fn up(&mut self) {
        let d = &self.dir;
        let child = Command::new("/usr/lib/rabbitmq/bin/rabbitmq-server")
            .current_dir(d)
            .env("HOME", d)
            .env(
                "RABBITMQ_NODENAME",
                format!("outbox_test_{}@localhost", self.port),
            )
            .env("RABBITMQ_NODE_IP_ADDRESS", "127.0.0.1")
            .env("RABBITMQ_NODE_PORT", self.port.to_string())
            .env("RABBITMQ_DIST_PORT", free_port().to_string())
            .env("RABBITMQ_MNESIA_BASE", d.join("mnesia"))
            .env("RABBITMQ_LOG_BASE", d.join("log"))
            .env("RABBITMQ_ENABLED_PLUGINS_FILE", d.join("enabled_plugins"))
            .env("RABBITMQ_CONFIG_FILE", d.join("rabbitmq"))
            .env("RABBITMQ_PID_FILE", d.join("pid"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("rabbitmq-server must be installed");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(60);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(Instant::now() < deadline, "private RabbitMQ did not start");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Stops the node (SIGTERM to the Erlang VM, whose pid the node wrote) and waits for it.
    fn down(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let pid = std::fs::read_to_string(self.dir.join("pid")).unwrap_or_default();
        if let Ok(pid) = pid.trim().parse::<u32>() {
            let _ = Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status();
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = child.kill();
        let _ = child.wait();
        let _ = std::fs::remove_file(self.dir.join("pid"));
    }

    fn url(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.port)
    }
}

impl Drop for PrivateRabbit {
    fn drop(&mut self) {
        self.down();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_restart_opens_and_closes_the_circuit_and_loses_nothing() {
    let mut rabbit = tokio::task::spawn_blocking(PrivateRabbit::start)
        .await
        .unwrap();
    let w = World::with_stream(false).await;
    let cfg = AmqpConfig::from_url(&rabbit.url()).unwrap();
    let name = outbox_testkit::unique_name("outbox_restart");
    // Durable exchange and queue: they, and the persistent messages confirmed into them,
    // survive the restart.
    declare_scratch(&cfg, &name, true).await.unwrap();
    let keys = common::keys("k", 10);
    let mut relay_cfg = w.relay_config();
    relay_cfg.destination = DestinationTemplate::parse(&format!("{name}/{{event_type}}")).unwrap();
    relay_cfg.retry.max_attempts = 1000;
    let relay = Relay::new(
        w.dyn_store(),
        sink(&sink_url(&rabbit.url(), "")).await,
        relay_cfg,
    );
    let breaker = relay.breaker();
    let (stop, h) = spawn(relay);
    w.store()
        .insert(&common::interleaved(&keys, 0..10))
        .await
        .unwrap();
    w.wait_drained(Duration::from_secs(30)).await;

    rabbit = tokio::task::spawn_blocking(move || {
        rabbit.down();
        rabbit
    })
    .await
    .unwrap();
    w.store()
        .insert(&common::interleaved(&keys, 10..20))
        .await
        .unwrap();
    wait_state(&breaker, CircuitState::Open, Duration::from_secs(30)).await;
    assert_eq!(w.stats().await.failed, 0, "an outage fails nothing");
    rabbit = tokio::task::spawn_blocking(move || {
        rabbit.up();
        rabbit
    })
    .await
    .unwrap();
    wait_state(&breaker, CircuitState::Closed, Duration::from_secs(60)).await;
    w.wait_drained(Duration::from_secs(60)).await;
    stop.cancel();
    h.await.unwrap();

    let mut reader = AmqpReader::open(cfg, &name, &name).await.unwrap();
    let got = read_n(&mut reader, 200).await;
    let distinct: HashSet<_> = got.iter().map(|d| d.id).collect();
    assert_eq!(
        distinct.len(),
        200,
        "every message reached the restarted broker"
    );
    assert!(key_order(&got).values().all(|&n| n == 20));
    let s = w.stats().await;
    assert_eq!((s.published, s.failed), (200, 0));
    drop(rabbit);
    w.drop_all().await;
}

/// The node is stopped while the relay is half-way through a backlog, with publishes awaiting
/// their confirms, and started again. A persistent message confirmed into a durable queue is on
/// disk, so the restarted node still holds it; what the stop cut off unconfirmed the relay
/// publishes again. Every message arrives, at least once, each key's first deliveries in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_stopped_mid_stream_with_messages_in_flight_loses_nothing_and_keeps_key_order() {
    let mut rabbit = tokio::task::spawn_blocking(PrivateRabbit::start)
        .await
        .unwrap();
    let w = World::with_stream(false).await;
    let cfg = AmqpConfig::from_url(&rabbit.url()).unwrap();
    let name = outbox_testkit::unique_name("outbox_midstream");
    declare_scratch(&cfg, &name, true).await.unwrap();
    let (keys, per_key) = (20, 200);
    let mut relay_cfg = w.relay_config();
    relay_cfg.destination = DestinationTemplate::parse(&format!("{name}/{{event_type}}")).unwrap();
    let sink = sink(&sink_url(&rabbit.url(), "")).await;
    let d = Backlog::start(w, sink, relay_cfg, keys, per_key).await;
    d.publishing(500).await;
    rabbit = tokio::task::spawn_blocking(move || {
        rabbit.down();
        rabbit
    })
    .await
    .unwrap();
    let before = d.outage(Duration::from_secs(30)).await;
    rabbit = tokio::task::spawn_blocking(move || {
        rabbit.up();
        rabbit
    })
    .await
    .unwrap();
    let (w, most) = d.finish(Duration::from_secs(45)).await;
    let mut reader = AmqpReader::open(cfg, &name, &name).await.unwrap();
    let got = read_distinct(&mut reader, keys * per_key, Duration::from_secs(30)).await;
    let dups = assert_all_arrived_in_key_order(&got, keys, per_key);
    eprintln!(
        "{before} of {} published before the stop was seen; a call caught by it held {most} \
         messages; {dups} deliveries were duplicates",
        keys * per_key
    );
    drop(rabbit);
    w.drop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_on_the_default_exchange_is_reached_by_its_name() {
    let w = World::with_stream(false).await;
    let queue = outbox_testkit::unique_name("amqp_default");
    let cfg = AmqpConfig::from_url(&amqp_url()).unwrap();
    let conn = lapin::Connection::connect(&amqp_url(), Default::default())
        .await
        .unwrap();
    let ch = conn.create_channel().await.unwrap();
    ch.queue_declare(
        queue.as_str().into(),
        QueueDeclareOptions {
            durable: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await
    .unwrap();
    w.store()
        .insert(&common::interleaved(&common::keys("k", 3), 0..5))
        .await
        .unwrap();
    let mut relay_cfg = w.relay_config();
    // No `/`: a routing key on the URL's exchange, here the default one.
    relay_cfg.destination = DestinationTemplate::parse(&queue).unwrap();
    let (stop, h) = spawn(Relay::new(
        w.dyn_store(),
        sink(&sink_url(&amqp_url(), "")).await,
        relay_cfg,
    ));
    w.wait_drained(Duration::from_secs(20)).await;
    stop.cancel();
    h.await.unwrap();
    let mut reader = AmqpReader::open(cfg, &queue, "").await.unwrap();
    let got = read_n(&mut reader, 15).await;
    assert_eq!(got.len(), 15);
    assert!(got.iter().all(|d| d.destination == queue));
    assert!(key_order(&got).values().all(|&n| n == 5));
    reader.cleanup().await;
    conn.close(200, "OK".into()).await.unwrap();
    w.drop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_credentials_are_a_start_up_error_that_hides_the_password() {
    let url = "amqp://guest:not-the-password@127.0.0.1:5672/%2f?ack_timeout=2s";
    let err = AmqpSink::connect(AmqpConfig::from_url(url).unwrap())
        .await
        .err()
        .expect("refused credentials cannot be retried into working");
    let text = err.to_string();
    assert!(text.contains("127.0.0.1:5672"), "{text}");
    assert!(!text.contains("not-the-password"), "{text}");
    assert!(text.contains("ACCESS_REFUSED"), "{text}");
    // A broker that is not there is an outage, not a start-up error.
    let down = AmqpSink::connect(
        AmqpConfig::from_url("amqp://guest:guest@127.0.0.1:1/%2f?ack_timeout=1s").unwrap(),
    )
    .await
    .unwrap();
    let e = common_envelope("q");
    let r = outbox_core::Sink::publish(&down, std::slice::from_ref(&e)).await;
    assert!(r[0].as_ref().unwrap_err().is_unavailable(), "{r:?}");
}

fn common_envelope(destination: &str) -> outbox_core::Envelope {
    outbox_core::Envelope {
        id: uuid::Uuid::now_v7(),
        destination: destination.into(),
        key: "k".into(),
        headers: vec![],
        payload: outbox_core::Bytes::from_static(b"{}"),
        created_at: chrono::Utc::now(),
    }
}
