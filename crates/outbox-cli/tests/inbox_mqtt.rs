//! `outbox inbox` from MQTT as users run it: the real binary subscribed to Mosquitto
//! (127.0.0.1:1883) with a persistent session, killed with `kill -9` mid-stream and restarted:
//! nothing lost, nothing twice, each key in publish order. Messages are published by the
//! relay's own MQTT sink (QoS 1, headers as user properties).
//!
//! MQTT keeps no history: a subscription receives only what is published after it exists, so
//! each test starts the daemon (which creates the session) before publishing. Mosquitto's
//! default `max_queued_messages` is 1000 per session: beyond that it drops QoS 1 messages for a
//! client that is away or slow, so the workloads stay below it. Every test ends its session.

#![allow(clippy::unwrap_used)]

mod common;
#[path = "common/inbox.rs"]
mod inboxkit;

use inboxkit::{calls, workload, Inbox};
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::{sigterm, wait_exit};
use outbox_core::{Envelope, Sink};
use outbox_sinks::mqtt::{MqttConfig, MqttSink};
use rumqttc::v5::mqttbytes::v5::{Filter, Packet, Publish};
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::{AsyncClient, Event, EventLoop, MqttOptions};
use uuid::Uuid;

fn mqtt_url() -> String {
    std::env::var("OUTBOX_TEST_MQTT_URL").unwrap_or_else(|_| "mqtt://127.0.0.1:1883".into())
}

/// A topic and a session id of the test's own, published to by the relay's MQTT sink.
struct Topic {
    sink: MqttSink,
    topic: String,
    client_id: String,
}

impl Topic {
    fn new() -> Self {
        let name = outbox_testkit::unique_name("ibx");
        Self {
            sink: MqttSink::connect(MqttConfig::from_url(&mqtt_url()).unwrap()).unwrap(),
            topic: format!("{name}/orders"),
            client_id: name,
        }
    }

    fn source(&self) -> String {
        format!(
            "{}?topic={}&client_id={}&session_expiry=10m",
            mqtt_url(),
            self.topic,
            self.client_id
        )
    }

    /// Publishes through the MQTT sink, in order, as the relay does.
    async fn publish(&self, msgs: &[(Uuid, String, i64)]) {
        for chunk in calls(msgs) {
            let batch: Vec<Envelope> = chunk
                .iter()
                .map(|(id, key, n)| Envelope {
                    id: *id,
                    destination: self.topic.clone(),
                    key: key.clone(),
                    headers: vec![
                        ("outbox-message-id".into(), id.to_string()),
                        ("outbox-event-type".into(), "order.paid".into()),
                        ("outbox-aggregate-type".into(), "order".into()),
                        ("outbox-aggregate-id".into(), key.clone()),
                    ],
                    payload: bytes::Bytes::from(serde_json::json!({ "n": n }).to_string()),
                    created_at: chrono::Utc::now(),
                })
                .collect();
            let deadline = Instant::now() + Duration::from_secs(30);
            // The sink connects in the background: a first call may find it not connected yet.
            loop {
                let results = self.sink.publish(&batch).await;
                if results.iter().all(|r| r.is_ok()) {
                    break;
                }
                assert!(Instant::now() < deadline, "{results:?}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }

    /// Ends the session on the broker (clean start, then disconnect).
    async fn end_session(&self) {
        let (client, mut events) = client(&self.client_id, true, 10);
        let ended = async {
            loop {
                match events.poll().await {
                    Ok(Event::Incoming(Packet::ConnAck(_))) => {
                        let _ = client.try_disconnect();
                    }
                    Ok(Event::Outgoing(rumqttc::Outgoing::Disconnect)) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        };
        let _ = tokio::time::timeout(Duration::from_secs(5), ended).await;
    }
}

/// A raw client with manual acknowledgements: a consumer that can receive and not acknowledge.
fn client(client_id: &str, clean: bool, receive_max: u16) -> (AsyncClient, EventLoop) {
    let mut o = MqttOptions::new(client_id, "127.0.0.1", 1883);
    o.set_clean_start(clean)
        .set_session_expiry_interval(Some(600))
        .set_manual_acks(true)
        .set_receive_maximum(Some(receive_max));
    AsyncClient::new(o, 100)
}

/// Polls `events` until `n` messages came (subscribing to `topic` on CONNACK), at most 20 s.
async fn receive(
    client: &AsyncClient,
    events: &mut EventLoop,
    topic: &str,
    n: usize,
) -> Vec<Publish> {
    let mut got = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while got.len() < n {
        match tokio::time::timeout_at(deadline, events.poll()).await {
            Ok(Ok(Event::Incoming(Packet::ConnAck(_)))) => {
                client
                    .try_subscribe_many([Filter::new(topic, QoS::AtLeastOnce)])
                    .unwrap();
            }
            Ok(Ok(Event::Incoming(Packet::Publish(p)))) => got.push(p),
            Ok(Ok(_)) => {}
            Ok(Err(e)) => panic!("{e}"),
            Err(_) => panic!("{} of {n} messages", got.len()),
        }
    }
    got
}

/// Connects `client` and subscribes it to `topic`; returns on the SUBACK.
async fn subscribed(client: &AsyncClient, events: &mut EventLoop, topic: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        match tokio::time::timeout_at(deadline, events.poll()).await {
            Ok(Ok(Event::Incoming(Packet::ConnAck(_)))) => client
                .try_subscribe_many([Filter::new(topic, QoS::AtLeastOnce)])
                .unwrap(),
            Ok(Ok(Event::Incoming(Packet::SubAck(_)))) => return,
            Ok(Ok(_)) => {}
            Ok(Err(e)) => panic!("{e}"),
            Err(_) => panic!("no SUBACK"),
        }
    }
}

/// The `outbox-message-id` user property of `p`.
fn id_of(p: &Publish) -> Uuid {
    p.properties
        .as_ref()
        .unwrap()
        .user_properties
        .iter()
        .find(|(k, _)| k == "outbox-message-id")
        .unwrap()
        .1
        .parse()
        .unwrap()
}

/// Runs the daemon once, briefly, so its session and subscription exist: MQTT keeps no
/// history, and the broker queues for the session only what is published after that.
async fn create_session(inbox: &Inbox, topic: &Topic) {
    let mut d = inbox.daemon(&topic.source(), 20);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    sigterm(&d);
    assert!(wait_exit(&mut d, Duration::from_secs(15)).success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inbox_killed_with_sigkill_mid_stream_from_mqtt_loses_nothing_and_keeps_key_order() {
    let inbox = Inbox::new().await;
    let topic = Topic::new();
    create_session(&inbox, &topic).await;
    // Queued in the session while no daemon runs, so the next one is mid-stream when killed.
    let msgs = workload(10, 40, 0);
    topic.publish(&msgs).await;
    let mut a = inbox.daemon(&topic.source(), 20);
    inbox.wait_count(100, Duration::from_secs(60)).await;
    a.kill().unwrap(); // SIGKILL: the batch in hand is neither committed nor acknowledged
    a.wait().unwrap();
    assert!(
        inbox.count().await < msgs.len() as i64,
        "the daemon finished before it was killed: nothing tested"
    );
    // More arrive while no daemon runs: the broker queues them in the session.
    let more = workload(10, 5, 40);
    topic.publish(&more).await;
    let all: Vec<_> = msgs.iter().chain(&more).cloned().collect();
    let mut b = inbox.daemon(&topic.source(), 20);
    inbox
        .wait_count(all.len() as i64, Duration::from_secs(60))
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    inbox.check(&all).await;
    sigterm(&b);
    assert!(wait_exit(&mut b, Duration::from_secs(15)).success());
    topic.end_session().await;
    inbox.drop_all().await;
}

/// What the source's recovery rests on, observed on Mosquitto: a client received messages,
/// acknowledged none and went away; on reconnecting to its session it gets those messages
/// first, again (DUP set, same packet ids), in the order they first came, then the rest in
/// publish order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mosquitto_sends_unacknowledged_messages_again_first_and_in_order_on_reconnect() {
    let topic = Topic::new();
    let (c, mut events) = client(&topic.client_id, true, 10);
    subscribed(&c, &mut events, &topic.topic).await;
    let msgs = workload(3, 10, 0);
    topic.publish(&msgs).await;
    let first = receive(&c, &mut events, &topic.topic, 10).await;
    drop((c, events)); // gone without a PUBACK or a DISCONNECT
    let (c, mut events) = client(&topic.client_id, false, 100);
    let again = receive(&c, &mut events, &topic.topic, 30).await;
    let firsts: Vec<(u16, Uuid)> = first.iter().map(|p| (p.pkid, id_of(p))).collect();
    let resent: Vec<(u16, Uuid)> = again[..10].iter().map(|p| (p.pkid, id_of(p))).collect();
    assert_eq!(
        resent, firsts,
        "the unacknowledged ones first, same packet ids, same order"
    );
    assert!(again[..10].iter().all(|p| p.dup), "marked DUP");
    let order: Vec<Uuid> = again.iter().map(id_of).collect();
    let want: Vec<Uuid> = msgs.iter().map(|m| m.0).collect();
    assert_eq!(order, want, "then the rest, in publish order");
    for p in &again {
        c.ack(p).await.unwrap();
    }
    drop((c, events));
    topic.end_session().await;
}

/// A consumer on the daemon's session received messages and died without acknowledging them:
/// the daemon records them before anything newer, every key in publish order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_a_dead_consumer_received_from_mqtt_are_recorded_before_anything_newer() {
    let inbox = Inbox::new().await;
    let topic = Topic::new();
    let (c, mut events) = client(&topic.client_id, true, 15);
    subscribed(&c, &mut events, &topic.topic).await;
    let msgs = workload(5, 20, 0);
    topic.publish(&msgs[..50]).await;
    let stolen = receive(&c, &mut events, &topic.topic, 15).await;
    assert_eq!(stolen.len(), 15, "the dead consumer's messages");
    drop((c, events));
    topic.publish(&msgs[50..]).await;
    let mut d = inbox.daemon(&topic.source(), 20);
    inbox
        .wait_count(msgs.len() as i64, Duration::from_secs(60))
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    inbox.check(&msgs).await;
    sigterm(&d);
    assert!(wait_exit(&mut d, Duration::from_secs(15)).success());
    topic.end_session().await;
    inbox.drop_all().await;
}

/// URL mistakes end the daemon with an error that names the problem, never the password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mqtt_source_url_mistakes_are_clear_errors_without_the_password() {
    let inbox = Inbox::new().await;
    for (source, says) in [
        ("mqtt://app:s3cret@127.0.0.1:1883", "name the topic filter"),
        ("mqtt://app:s3cret@127.0.0.1:1883?topic=t&qos=2", "`qos`"),
        ("mqtt://app:s3cret@127.0.0.1:port?topic=t", "mqtt://"),
    ] {
        let o = inbox
            .command(source, 20)
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{source}: {err}");
        assert!(err.contains(says), "{source}: {err}");
        assert!(!err.contains("s3cret"), "{source}: {err}");
    }
    inbox.drop_all().await;
}
