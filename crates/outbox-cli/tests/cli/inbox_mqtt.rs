//! `outbox inbox` from MQTT, in what is particular to MQTT: the Mosquitto behaviour the
//! source's recovery rests on. Every message once in key order across `kill -9`, what a dead
//! consumer on the session received, and bad source URLs are the source conformance suite's
//! (`inbox_sources.rs`, module `mqtt`).

#![allow(clippy::unwrap_used)]

use crate::inboxkit;
use std::time::Duration;

use inboxkit::{mqtt_client, Mqtt, MqttChannel};
use outbox_testkit::source_suite::{publish, workload, Channel};
use rumqttc::v5::mqttbytes::v5::{Filter, Packet, Publish};
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::{AsyncClient, Event, EventLoop};
use uuid::Uuid;

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

/// What the source's recovery rests on, observed on Mosquitto: a client received messages,
/// acknowledged none and went away; on reconnecting to its session it gets those messages
/// first, again (DUP set, same packet ids), in the order they first came, then the rest in
/// publish order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mosquitto_sends_unacknowledged_messages_again_first_and_in_order_on_reconnect() {
    let url = Mqtt::new().0;
    let ch = MqttChannel::new(&url, "ibx").await;
    let (c, mut events) = mqtt_client(&url, &ch.client_id, true, 10);
    subscribed(&c, &mut events, &ch.topic).await;
    let msgs = workload(&ch.destination(), 3, 10, 0);
    publish(&ch, &msgs).await;
    let first = receive(&c, &mut events, &ch.topic, 10).await;
    drop((c, events)); // gone without a PUBACK or a DISCONNECT
    let (c, mut events) = mqtt_client(&url, &ch.client_id, false, 100);
    let again = receive(&c, &mut events, &ch.topic, 30).await;
    let firsts: Vec<(u16, Uuid)> = first.iter().map(|p| (p.pkid, id_of(p))).collect();
    let resent: Vec<(u16, Uuid)> = again[..10].iter().map(|p| (p.pkid, id_of(p))).collect();
    assert_eq!(
        resent, firsts,
        "the unacknowledged ones first, same packet ids, same order"
    );
    assert!(again[..10].iter().all(|p| p.dup), "marked DUP");
    let order: Vec<Uuid> = again.iter().map(id_of).collect();
    let want: Vec<Uuid> = msgs.iter().map(|m| m.id).collect();
    assert_eq!(order, want, "then the rest, in publish order");
    for p in &again {
        c.ack(p).await.unwrap();
    }
    drop((c, events));
    Box::new(ch).cleanup().await;
}
