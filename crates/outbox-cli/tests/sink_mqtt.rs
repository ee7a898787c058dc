//! The MQTT sink end to end: PostgreSQL, the relay and the real Mosquitto on this machine
//! (private brokers of the test's own for ACLs and the restart), read back by the sink's reader.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::{HashMap, HashSet};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::outage::{assert_all_arrived_in_key_order, read_distinct, Backlog};
use common::{wait_state, World};
use outbox_core::{DestinationTemplate, Store};
use outbox_relay::{CircuitState, Relay, RelayConfig};
use outbox_sinks::mqtt::{MqttConfig, MqttReader, MqttSink};
use outbox_sinks::read::{read_until, scratch, Delivered, Reader, Scratch, ScratchOptions};
use tokio_util::sync::CancellationToken;

fn mqtt_url() -> String {
    std::env::var("OUTBOX_TEST_MQTT_URL").unwrap_or_else(|_| "mqtt://127.0.0.1:1883".into())
}

/// The test relay's publish deadline is a third of its 3 s lease: the PUBACK wait fits in it.
fn sink_url(base: &str, extra: &str) -> String {
    format!("{base}?ack_timeout=800ms{extra}")
}

fn sink(url: &str) -> Arc<MqttSink> {
    Arc::new(MqttSink::connect(MqttConfig::from_url(url).unwrap()).unwrap())
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

async fn new_scratch(url: &str, tag: &str) -> Scratch {
    scratch(url, &ScratchOptions::new(tag))
        .await
        .expect("Mosquitto must be running")
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
async fn minimal_sql_insert_arrives_with_its_id_and_headers_as_user_properties() {
    let w = World::with_stream(false).await;
    let mut s = new_scratch(&mqtt_url(), "mqttmin").await;
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
        sink(&sink_url(&mqtt_url(), "")),
        config(&w, &s.destination),
    ));
    w.wait_drained(Duration::from_secs(20)).await;
    stop.cancel();
    h.await.unwrap();
    let got = read_n(s.reader.as_mut(), 1).await;
    assert_eq!(got.len(), 1);
    let m = &got[0];
    assert_eq!(m.id, id);
    assert_eq!(
        m.destination,
        s.destination.replace("{event_type}", "created")
    );
    assert_eq!(m.key, "p-42");
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
    let mut s = new_scratch(&mqtt_url(), "mqttorder").await;
    let (keys, per_key) = (20, 50);
    w.store()
        .insert(&common::interleaved(&common::keys("k", keys), 0..per_key))
        .await
        .unwrap();
    let (stop, h) = spawn(Relay::new(
        w.dyn_store(),
        sink(&sink_url(&mqtt_url(), "")),
        config(&w, &s.destination),
    ));
    w.wait_drained(Duration::from_secs(60)).await;
    stop.cancel();
    h.await.unwrap();
    let got = read_n(s.reader.as_mut(), keys * per_key).await;
    let distinct: HashSet<_> = got.iter().map(|d| d.id).collect();
    assert_eq!(distinct.len(), keys * per_key);
    let per = key_order(&got);
    assert_eq!(per.len(), keys);
    assert!(per.values().all(|&n| n as usize == per_key));
    s.reader.cleanup().await;
    w.drop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wildcard_topic_and_an_oversized_row_fail_at_once_and_others_flow() {
    let w = World::with_stream(false).await;
    let mut s = new_scratch(&mqtt_url(), "mqttinv").await;
    let prefix = s.destination.split('/').next().unwrap().to_string();
    sqlx::query(&w.schema.render(
        "INSERT INTO {schema}.outbox (aggregate_type, aggregate_id, event_type, payload, headers, topic)
         VALUES ('order', 'wild', 'placed', '{}', '{}', $1),
                ('order', 'big', 'placed', $2::jsonb, '{}', NULL),
                ('order', 'good', 'placed', '{\"n\": 0}', '{}', NULL),
                ('order', 'good', 'placed', '{\"n\": 1}', '{}', NULL)",
    ))
    .bind(format!("{prefix}/+/x"))
    .bind(serde_json::json!({ "blob": "x".repeat(4096) }).to_string())
    .execute(&w.pool)
    .await
    .unwrap();
    let relay = Relay::new(
        w.dyn_store(),
        sink(&sink_url(&mqtt_url(), "&max_message_size=1KiB")),
        config(&w, &s.destination),
    );
    let breaker = relay.breaker();
    let (stop, h) = spawn(relay);
    wait_failed(&w, 2).await;
    w.wait_drained(Duration::from_secs(20)).await;
    assert_eq!(breaker.snapshot().0, CircuitState::Closed);
    stop.cancel();
    h.await.unwrap();
    let errors = failed_errors(&w).await;
    let (wild, attempts) = &errors["wild"];
    assert!(wild.contains("wildcard"), "{wild}");
    assert_eq!(*attempts, 1);
    let (big, attempts) = &errors["big"];
    assert!(big.contains("max_message_size"), "{big}");
    assert_eq!(*attempts, 1);
    let got = read_n(s.reader.as_mut(), 2).await;
    assert_eq!(key_order(&got)["good"], 2);
    s.reader.cleanup().await;
    w.drop_all().await;
}

/// A mosquitto of this test's own on a free port, with its own persistence file and `acl`
/// (anonymous clients may use the topics its lines allow): it can be stopped and started
/// without disturbing anything else on the machine.
struct PrivateMosquitto {
    port: u16,
    dir: std::path::PathBuf,
    child: Option<Child>,
}

impl PrivateMosquitto {
    fn start(acl: &str) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let dir = std::env::temp_dir().join(outbox_testkit::unique_name("mosquitto"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("acl"), acl).unwrap();
        std::fs::write(
            dir.join("mosquitto.conf"),
            format!(
                // `user root`: run as the test's user (root here) rather than dropping to
                // `mosquitto`, which could not write the persistence file in the test's folder.
                // `max_queued_messages`: the QoS 1 messages queued for a subscriber are capped
                // far above any test's backlog (1,000 by default, beyond which mosquitto drops
                // them), so a reader that reconnects after a restart a moment later than the
                // relay misses nothing. Not 0 ("no cap"): with it, mosquitto 2.0.11 drops a
                // client's connection after it denies one of its publishes.
                "listener {port} 127.0.0.1\nuser root\nallow_anonymous true\npersistence true\n\
                 persistence_location {}/\nacl_file {}\nmax_queued_messages 100000\n",
                dir.display(),
                dir.join("acl").display()
            ),
        )
        .unwrap();
        let mut me = Self {
            port,
            dir,
            child: None,
        };
        me.up();
        me
    }

    fn up(&mut self) {
        let child = Command::new("mosquitto")
            .arg("-c")
            .arg(self.dir.join("mosquitto.conf"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("mosquitto must be installed");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(Instant::now() < deadline, "private mosquitto did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stops the broker with SIGTERM: it writes its sessions and queued messages to its
    /// persistence file on the way out (mosquitto saves on shutdown, not on every message).
    fn down(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-TERM", &c.id().to_string()])
                .status();
            let deadline = Instant::now() + Duration::from_secs(10);
            while c.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn url(&self) -> String {
        format!("mqtt://127.0.0.1:{}", self.port)
    }
}

impl Drop for PrivateMosquitto {
    fn drop(&mut self) {
        self.down();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_the_acl_denies_is_rejected_with_its_reason_and_others_flow() {
    let prefix = outbox_testkit::unique_name("outbox_mqtt_acl");
    let broker = PrivateMosquitto::start(&format!("topic readwrite {prefix}/#\n"));
    let w = World::with_stream(false).await;
    let cfg = MqttConfig::from_url(&broker.url()).unwrap();
    let mut reader = MqttReader::open(cfg, &format!("{prefix}_reader"), &format!("{prefix}/#"))
        .await
        .unwrap();
    sqlx::query(&w.schema.render(
        "INSERT INTO {schema}.outbox (aggregate_type, aggregate_id, event_type, payload, headers, topic)
         VALUES ('order', 'denied', 'placed', '{}', '{}', $1),
                ('order', 'good', 'placed', '{\"n\": 0}', '{}', NULL),
                ('order', 'good', 'placed', '{\"n\": 1}', '{}', NULL)",
    ))
    .bind(format!("{prefix}_elsewhere/x"))
    .execute(&w.pool)
    .await
    .unwrap();
    let mut relay_cfg = config(&w, &format!("{prefix}/{{event_type}}"));
    relay_cfg.retry.max_attempts = 2;
    let relay = Relay::new(w.dyn_store(), sink(&sink_url(&broker.url(), "")), relay_cfg);
    let breaker = relay.breaker();
    let (stop, h) = spawn(relay);
    wait_failed(&w, 1).await;
    w.wait_drained(Duration::from_secs(20)).await;
    assert_eq!(breaker.snapshot().0, CircuitState::Closed);
    stop.cancel();
    h.await.unwrap();
    let errors = failed_errors(&w).await;
    let (denied, attempts) = &errors["denied"];
    assert!(
        denied.contains("NotAuthorized") && denied.contains(&format!("`{prefix}_elsewhere/x`")),
        "{denied}"
    );
    assert_eq!(*attempts, 2, "a rejection spends its budget");
    let got = read_n(&mut reader, 2).await;
    assert_eq!(key_order(&got)["good"], 2);
    w.drop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_stopped_and_started_opens_and_closes_the_circuit_and_loses_nothing() {
    let prefix = outbox_testkit::unique_name("outbox_mqtt_restart");
    let mut broker = PrivateMosquitto::start("topic readwrite #\n");
    let w = World::with_stream(false).await;
    // Subscribed, with a persistent session, before anything is published; it stays across the
    // broker's restart.
    let mut reader = MqttReader::open(
        MqttConfig::from_url(&broker.url()).unwrap(),
        &format!("{prefix}_reader"),
        &format!("{prefix}/#"),
    )
    .await
    .unwrap();
    let keys = common::keys("k", 10);
    let mut relay_cfg = config(&w, &format!("{prefix}/{{event_type}}"));
    relay_cfg.retry.max_attempts = 1000;
    let relay = Relay::new(w.dyn_store(), sink(&sink_url(&broker.url(), "")), relay_cfg);
    let breaker = relay.breaker();
    let (stop, h) = spawn(relay);
    w.store()
        .insert(&common::interleaved(&keys, 0..10))
        .await
        .unwrap();
    w.wait_drained(Duration::from_secs(30)).await;
    let mut got = read_n(&mut reader, 100).await;
    broker.down();
    assert!(
        broker.dir.join("mosquitto.db").exists(),
        "the broker saved its sessions on the way out"
    );
    w.store()
        .insert(&common::interleaved(&keys, 10..20))
        .await
        .unwrap();
    wait_state(&breaker, CircuitState::Open, Duration::from_secs(30)).await;
    assert_eq!(w.stats().await.failed, 0, "an outage fails nothing");
    broker.up();
    wait_state(&breaker, CircuitState::Closed, Duration::from_secs(60)).await;
    w.wait_drained(Duration::from_secs(60)).await;
    stop.cancel();
    h.await.unwrap();
    got.extend(read_n(&mut reader, 100).await);
    let distinct: HashSet<_> = got.iter().map(|d| d.id).collect();
    assert_eq!(distinct.len(), 200, "every message reached the subscriber");
    assert!(key_order(&got).values().all(|&n| n == 20));
    let s = w.stats().await;
    assert_eq!((s.published, s.failed), (200, 0));
    w.drop_all().await;
}

/// The broker is stopped (SIGTERM) while the relay is half-way through a backlog, with QoS 1
/// publishes awaiting their PUBACK, and started again. mosquitto writes its sessions and the
/// messages queued for them to its persistence file on the way out, so the subscriber (a
/// persistent session, reconnecting under the same client id) gets, after the restart, what
/// the broker acknowledged before it; what the stop cut off unacknowledged the relay publishes
/// again. Every message arrives, at least once, each key's first deliveries in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_stopped_mid_stream_with_messages_in_flight_loses_nothing_and_keeps_key_order() {
    let prefix = outbox_testkit::unique_name("outbox_mqtt_midstream");
    let mut broker = PrivateMosquitto::start("topic readwrite #\n");
    let w = World::with_stream(false).await;
    // Subscribed before anything is published, and reading all along (its own task takes every
    // message as it comes), across the restart.
    let mut reader = MqttReader::open(
        MqttConfig::from_url(&broker.url()).unwrap(),
        &format!("{prefix}_reader"),
        &format!("{prefix}/#"),
    )
    .await
    .unwrap();
    let (keys, per_key) = (20, 150);
    let cfg = config(&w, &format!("{prefix}/{{event_type}}"));
    let d = Backlog::start(w, sink(&sink_url(&broker.url(), "")), cfg, keys, per_key).await;
    d.publishing(500).await;
    broker.down();
    assert!(
        broker.dir.join("mosquitto.db").exists(),
        "the broker saved its sessions on the way out"
    );
    let before = d.outage(Duration::from_secs(30)).await;
    broker.up();
    let (w, most) = d.finish(Duration::from_secs(45)).await;
    let got = read_distinct(&mut reader, keys * per_key, Duration::from_secs(30)).await;
    let dups = assert_all_arrived_in_key_order(&got, keys, per_key);
    eprintln!(
        "{before} of {} published before the stop was seen; a call caught by it held {most} \
         messages; {dups} deliveries were duplicates",
        keys * per_key
    );
    w.drop_all().await;
}
