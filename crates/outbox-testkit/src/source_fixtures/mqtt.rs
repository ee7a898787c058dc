//! MQTT (Mosquitto): a topic and a persistent session per channel.

use std::time::{Duration, Instant};

use async_trait::async_trait;

use super::{env_or, with_password, SETTLE};
use crate::source_suite::{open, Channel, DaemonScale, Mistake, Scale, SourceFixture, SECRET};
use crate::unique_name;

/// MQTT (Mosquitto, `OUTBOX_TEST_MQTT_URL`): a topic and a persistent session per channel.
/// MQTT keeps no history, so the channel creates the session (the source subscribes once)
/// before anything is published. Mosquitto queues at most 1,000 QoS 1 messages per session
/// (`max_queued_messages`) and has at most 20 in flight, so the workloads stay below both.
pub struct Mqtt(pub String);

impl Mqtt {
    /// The shared broker.
    pub fn new() -> Self {
        Self(env_or("OUTBOX_TEST_MQTT_URL", "mqtt://127.0.0.1:1883"))
    }
}

/// A raw MQTT v5 client of the broker at `url` under `client_id`, with manual
/// acknowledgements: a consumer that can receive and not acknowledge.
pub fn mqtt_client(
    url: &str,
    client_id: &str,
    clean: bool,
    receive_max: u16,
) -> (rumqttc::v5::AsyncClient, rumqttc::v5::EventLoop) {
    let cfg = outbox_sinks::mqtt::MqttConfig::from_url(url).unwrap();
    let mut o = rumqttc::v5::MqttOptions::new(client_id, cfg.host, cfg.port);
    o.set_clean_start(clean)
        .set_session_expiry_interval(Some(600))
        .set_manual_acks(true)
        .set_receive_maximum(Some(receive_max));
    rumqttc::v5::AsyncClient::new(o, 100)
}

/// A topic and a session of its own.
pub struct MqttChannel {
    url: String,
    /// The topic published to.
    pub topic: String,
    /// The persistent session's client id (the source subscribes with it).
    pub client_id: String,
}

impl MqttChannel {
    /// A topic `<name>/orders` and the session `<name>` subscribed to it.
    pub async fn new(url: &str, tag: &str) -> Self {
        let name = unique_name(tag);
        let ch = Self {
            url: url.to_string(),
            topic: format!("{name}/orders"),
            client_id: name,
        };
        let mut source = open(&ch.source_url(), 20).await;
        source.recover().await.unwrap();
        ch
    }

    /// Connects to the session, and to `clean` it when asked; returns every message it was
    /// sent within a moment (disconnecting after).
    async fn visit_session(&self, clean: bool) -> Vec<rumqttc::v5::mqttbytes::v5::Publish> {
        use rumqttc::v5::mqttbytes::v5::Packet;
        use rumqttc::v5::Event;
        let (client, mut events) = mqtt_client(&self.url, &self.client_id, clean, 100);
        let mut sent = Vec::new();
        let visit = async {
            let mut connected: Option<Instant> = None;
            loop {
                let wait = match connected {
                    Some(at) => Duration::from_secs(2).saturating_sub(at.elapsed()),
                    None => SETTLE,
                };
                match tokio::time::timeout(wait, events.poll()).await {
                    Ok(Ok(Event::Incoming(Packet::ConnAck(_)))) => connected = Some(Instant::now()),
                    Ok(Ok(Event::Incoming(Packet::Publish(p)))) => sent.push(p),
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => panic!("MQTT session {}: {e}", self.client_id),
                    Err(_) => return,
                }
            }
        };
        visit.await;
        let _ = client.try_disconnect();
        let _ = tokio::time::timeout(Duration::from_secs(2), events.poll()).await;
        sent
    }

    /// Ends the session on the broker (clean start, then disconnect).
    pub async fn end_session(&self) {
        self.visit_session(true).await;
    }
}

#[async_trait]
impl Channel for MqttChannel {
    fn source_url(&self) -> String {
        format!(
            "{}?topic={}&client_id={}&session_expiry=10m",
            self.url, self.topic, self.client_id
        )
    }
    fn sink_url(&self) -> String {
        self.url.clone()
    }
    fn destination(&self) -> String {
        self.topic.clone()
    }
    /// Nothing is sent again to the session when it reconnects: every message it received was
    /// acknowledged, and nothing is queued.
    async fn assert_drained(&mut self, _published: usize) {
        let sent = self.visit_session(false).await;
        assert!(
            sent.is_empty(),
            "the session still had {} messages for its consumer",
            sent.len()
        );
    }
    async fn cleanup(self: Box<Self>) {
        self.end_session().await;
    }
}

#[async_trait]
impl SourceFixture for Mqtt {
    async fn channel(&self, tag: &str) -> Box<dyn Channel> {
        Box::new(MqttChannel::new(&self.0, tag).await)
    }
    fn scale(&self) -> Scale {
        Scale {
            keys: 5,
            per_key: 20,
            dead_takes: 15,
            batch: 20,
        }
    }
    fn daemon_scale(&self) -> DaemonScale {
        DaemonScale {
            keys: 10,
            per_key: 40,
            kill_after: 100,
            more_per_key: 5,
            batch: 20,
        }
    }
    fn mistakes(&self) -> Vec<Mistake> {
        let base = with_password(&self.0, "app");
        vec![
            Mistake::new(base.clone(), "name the topic filter"),
            Mistake::new(format!("{base}?topic=t&qos=2"), "`qos`"),
            Mistake::new(
                format!("mqtt://app:{SECRET}@127.0.0.1:port?topic=t"),
                "mqtt://",
            ),
        ]
    }
}
