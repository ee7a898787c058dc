//! [`MqttSource`]: an MQTT v5 subscription at QoS 1 with a persistent session, each message
//! acknowledged (PUBACK) by hand only after the ingest committed.
//!
//! Messages written by the MQTT sink of `outbox relay` carry the relay's headers as user
//! properties (`outbox-message-id`, `outbox-event-type`, `outbox-aggregate-id`, …).
//!
//! **Order across crashes.** The session is persistent: a fixed client id, `clean_start` off
//! and a session expiry. While the daemon is away the broker queues the subscription's QoS 1
//! messages; when it connects again, the broker first sends again, with their original packet
//! ids and the DUP flag, the messages it had sent and never got a PUBACK for, in the order it
//! first sent them, and only then what it queued meanwhile (MQTT v5 §4.4 and §4.6; Mosquitto 2
//! does exactly this, see the tests). So what a dead predecessor received and never
//! acknowledged comes back before anything newer, in order, and [`Source::recover`] only has
//! to (re)connect. It always does: a batch the daemon dropped without acknowledging (its
//! database connection was lost) is sent again only on a new connection.
//!
//! The connection is made in `recover`, which the daemon calls once it holds the source lock,
//! never when a standby opens the source: two clients with one id take the session from each
//! other.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use outbox_core::options::{Bounds, QueryOptions, Role};
use outbox_core::{Error, ErrorKind, Result};
use outbox_sinks::mqtt::MqttConfig;
use rumqttc::v5::mqttbytes::v5::{
    ConnectReturnCode, Filter, Packet, Publish, RetainForwardRule, SubscribeReasonCode,
};
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::{AsyncClient, Event};
use tokio::sync::{mpsc, oneshot};
use tracing::{info, warn};

use super::{AckInner, AckToken, Delivery, Source, SourceRetention};
use crate::message::{position_id, InboxMessage};

/// Default client id (stable: the session is found again under it).
pub const DEFAULT_CLIENT_ID: &str = "outbox-inbox";
/// Default session expiry: how long the broker keeps the session and queues messages for it
/// while no daemon is connected.
pub const DEFAULT_SESSION_EXPIRY: Duration = Duration::from_secs(7 * 24 * 3600);
/// Largest packet accepted.
const MAX_PACKET: u32 = 268_435_455;
/// How long a fetch waits for its first message.
const FETCH_WAIT: Duration = Duration::from_millis(200);
/// Longest wait for a PUBACK to be queued to the client's event loop.
const ACK_QUEUE_WAIT: Duration = Duration::from_secs(5);

/// Where and how to subscribe.
#[derive(Debug, Clone)]
pub struct MqttSourceConfig {
    /// Broker, credentials, keep-alive and the connect bound (`ack_timeout`), as for the sink.
    pub server: MqttConfig,
    /// The topic filter subscribed to at QoS 1 (`+` and `#` allowed; write `#` as `%23`).
    pub topic: String,
    /// The session's client id (`outbox-inbox` unless given).
    pub client_id: String,
    /// How long the broker keeps the session while the daemon is away (`session_expiry=`).
    pub session_expiry: Duration,
    /// The `source` column: `mqtt:<topic filter>` unless given.
    pub name: String,
}

impl MqttSourceConfig {
    /// Parses `mqtt://[user:pass@]host[:port]?topic=FILTER[&client_id=outbox-inbox]
    /// [&session_expiry=7d][&keep_alive=30s][&ack_timeout=5s][&name=N]`.
    pub fn from_url(url: &str) -> Result<Self> {
        let (base, o) = QueryOptions::from_url(
            Role::Source,
            url,
            &[
                "topic",
                "client_id",
                "session_expiry",
                "keep_alive",
                "ack_timeout",
                "name",
                // The sink's TLS and credential options mean the same here.
                "tls_ca",
                "tls_cert",
                "tls_key",
                "password_file",
                "password_env",
            ],
        )?;
        // `+` is MQTT's one-level wildcard in a topic filter: options keep it (a space is %20).
        let topic = o.str("topic").map(str::to_string);
        let name = o.non_empty("name")?;
        // MQTT 5 keeps the session expiry in whole seconds, up to u32::MAX.
        let session_expiry = o
            .whole_seconds(
                "session_expiry",
                Bounds::new(Duration::ZERO, Duration::from_secs(u64::from(u32::MAX))),
            )?
            .unwrap_or(DEFAULT_SESSION_EXPIRY);
        let server = MqttConfig::from_options(base, &o)?;
        let topic = topic.filter(|t| !t.is_empty()).ok_or_else(|| {
            Error::config(format!(
                "source `{}`: name the topic filter, e.g. mqtt://127.0.0.1:1883?topic=orders/%23",
                outbox_core::redact::url(url)
            ))
        })?;
        Ok(Self {
            client_id: server
                .client_id
                .clone()
                .unwrap_or_else(|| DEFAULT_CLIENT_ID.to_string()),
            name: name.map_or_else(|| format!("mqtt:{topic}"), str::to_string),
            server,
            topic,
            session_expiry,
        })
    }
}

/// One connection's client and what its event loop hands over.
struct Connection {
    client: AsyncClient,
    rx: mpsc::UnboundedReceiver<(u64, Publish)>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// An MQTT subscription with a persistent session as an inbox source.
pub struct MqttSource {
    cfg: MqttSourceConfig,
    batch: usize,
    conn: Option<Connection>,
    /// Counts the CONNACKs of the current client: a message is acknowledged only on the
    /// connection it came on (the broker sends it again, same packet id, on the next one).
    generation: Arc<AtomicU64>,
}

fn mqtt_error(what: &str, e: impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::Connection, format!("mqtt source: {what}: {e}"))
}

impl MqttSource {
    /// Checks nothing on the broker: the connection is made by [`Source::recover`].
    pub fn new(cfg: MqttSourceConfig, batch: usize) -> Self {
        Self {
            cfg,
            batch: batch.max(1),
            conn: None,
            generation: Arc::new(AtomicU64::new(0)),
        }
    }

    /// A new client on the persistent session, subscribed; returns once the broker
    /// confirmed the subscription.
    async fn connect(&mut self) -> Result<()> {
        // Dropping the old connection closes its socket: the broker keeps the session and
        // sends its unacknowledged messages again to the new one.
        self.conn = None;
        let mut opts = self
            .cfg
            .server
            .options(self.cfg.client_id.clone(), MAX_PACKET);
        let expiry = u32::try_from(self.cfg.session_expiry.as_secs()).unwrap_or(u32::MAX);
        // At most a batch in flight: the broker sends no more before PUBACKs free room.
        let receive_max = u16::try_from(self.batch).unwrap_or(u16::MAX).max(1);
        opts.set_clean_start(false)
            .set_session_expiry_interval(Some(expiry))
            .set_manual_acks(true)
            .set_receive_maximum(Some(receive_max));
        let (client, mut eventloop) = AsyncClient::new(opts, self.batch * 2 + 16);
        let (tx, rx) = mpsc::unbounded_channel();
        let (ready_tx, ready) = oneshot::channel::<std::result::Result<(), String>>();
        let generation = self.generation.clone();
        let sub_client = client.clone();
        let filter = self.cfg.topic.clone();
        let source = self.cfg.name.clone();
        let task = tokio::spawn(async move {
            let mut ready_tx = Some(ready_tx);
            let mut current = 0;
            loop {
                match eventloop.poll().await {
                    Ok(Event::Incoming(Packet::ConnAck(ack))) => {
                        current = generation.fetch_add(1, Ordering::SeqCst) + 1;
                        if ack.code != ConnectReturnCode::Success {
                            continue;
                        }
                        // Subscribing again on a session that has the subscription replaces
                        // it; retained messages only on a new one.
                        let mut f = Filter::new(filter.clone(), QoS::AtLeastOnce);
                        f.retain_forward_rule = RetainForwardRule::OnNewSubscribe;
                        if sub_client.try_subscribe_many([f]).is_err() {
                            return;
                        }
                        if !ack.session_present {
                            info!(source = %source, "a new MQTT session: only messages published from now on are received");
                        }
                    }
                    Ok(Event::Incoming(Packet::SubAck(ack))) => {
                        let ok = ack
                            .return_codes
                            .iter()
                            .all(|c| matches!(c, SubscribeReasonCode::Success(_)));
                        if let Some(r) = ready_tx.take() {
                            let _ = r.send(if ok {
                                Ok(())
                            } else {
                                Err(format!("subscription refused: {:?}", ack.return_codes))
                            });
                        } else if !ok {
                            warn!(source = %source, codes = ?ack.return_codes, "the broker refused the subscription after a reconnect");
                        }
                    }
                    Ok(Event::Incoming(Packet::Publish(p))) => {
                        if tx.send((current, p)).is_err() {
                            return;
                        }
                    }
                    Ok(_) => {}
                    Err(e) => {
                        match ready_tx.take() {
                            Some(r) => {
                                let _ = r.send(Err(e.to_string()));
                                return;
                            }
                            None => {
                                warn!(source = %source, error = %e, "MQTT connection lost; reconnecting")
                            }
                        }
                        // The next poll reconnects, on the same session.
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                }
            }
        });
        let conn = Connection { client, rx, task };
        let limit =
            self.cfg.server.ack_timeout.max(Duration::from_secs(1)) + Duration::from_secs(5);
        match tokio::time::timeout(limit, ready).await {
            Ok(Ok(Ok(()))) => {
                self.conn = Some(conn);
                Ok(())
            }
            Ok(Ok(Err(why))) => Err(mqtt_error(
                &format!(
                    "subscribing to `{}` on {}",
                    self.cfg.topic, self.cfg.server.display
                ),
                why,
            )),
            _ => Err(mqtt_error(
                &format!(
                    "subscribing to `{}` on {}",
                    self.cfg.topic, self.cfg.server.display
                ),
                format!("no SUBACK within {limit:?}"),
            )),
        }
    }

    fn delivery(&self, generation: u64, p: Publish) -> Delivery {
        let topic = String::from_utf8_lossy(&p.topic).into_owned();
        let headers = p
            .properties
            .as_ref()
            .map(|pr| pr.user_properties.clone())
            .unwrap_or_default();
        // MQTT numbers nothing: without `outbox-message-id` the id comes from the topic and
        // the content, the same on every redelivery.
        let fallback = position_id(
            &format!("mqtt:{topic}"),
            &format!("{headers:?}:{}", String::from_utf8_lossy(&p.payload)),
        );
        let message =
            InboxMessage::from_broker(&self.cfg.name, &p.payload, headers, fallback, &topic, None);
        Delivery {
            message,
            ack: AckToken(AckInner::Mqtt(generation, Box::new(p))),
        }
    }
}

#[async_trait]
impl Source for MqttSource {
    fn name(&self) -> &str {
        &self.cfg.name
    }

    fn describe(&self) -> String {
        format!(
            "MQTT subscription `{}` (session {}) on {}",
            self.cfg.topic, self.cfg.client_id, self.cfg.server.display
        )
    }

    async fn recover(&mut self) -> Result<()> {
        self.connect().await
    }

    async fn fetch(&mut self, max: usize) -> Result<Vec<Delivery>> {
        let Some(conn) = self.conn.as_mut() else {
            return Err(mqtt_error("fetch", "not connected"));
        };
        let mut got = Vec::new();
        match tokio::time::timeout(FETCH_WAIT, conn.rx.recv()).await {
            Ok(Some(item)) => got.push(item),
            Ok(None) => {
                // The event loop ended (the broker refused the subscription): connect again.
                self.conn = None;
                self.connect().await?;
                return Ok(Vec::new());
            }
            Err(_) => return Ok(Vec::new()),
        }
        while got.len() < max.max(1) {
            match conn.rx.try_recv() {
                Ok(item) => got.push(item),
                Err(_) => break,
            }
        }
        Ok(got.into_iter().map(|(g, p)| self.delivery(g, p)).collect())
    }

    async fn ack(&mut self, acks: Vec<AckToken>) -> Result<()> {
        let Some(conn) = self.conn.as_ref() else {
            return Err(mqtt_error("acknowledging", "not connected"));
        };
        let current = self.generation.load(Ordering::SeqCst);
        let mut stale = 0usize;
        // PUBACKs in the order the messages came, as MQTT asks for.
        for a in acks {
            let (generation, p) = match a.0 {
                AckInner::Mqtt(generation, p) => (generation, p),
                #[allow(unreachable_patterns)]
                _ => continue,
            };
            if generation != current {
                // Came on an earlier connection: the broker sent it again on this one (same
                // packet id), and that copy is acknowledged when it is ingested. A PUBACK
                // now could free the packet id for a newer message and acknowledge that one.
                stale += 1;
                continue;
            }
            tokio::time::timeout(ACK_QUEUE_WAIT, conn.client.ack(&p))
                .await
                .map_err(|_| mqtt_error("acknowledging", "the client's queue stayed full"))?
                .map_err(|e| mqtt_error("acknowledging", e))?;
        }
        if stale > 0 {
            info!(source = %self.cfg.name, stale, "messages from before a reconnect were not acknowledged: the broker sent them again");
        }
        Ok(())
    }

    async fn retention(&mut self) -> Result<SourceRetention> {
        // The broker keeps queued messages as long as the session (or its own limits); it
        // says nothing of a message's lifetime.
        Ok(SourceRetention::Unknown)
    }
}

/// This source's entry in [`super::SOURCES`].
pub(super) const KIND: super::SourceKind = super::SourceKind {
    schemes: &["mqtt", "mqtts"],
    listed: "mqtt://",
    open: |url, options| {
        super::boxed(async move {
            Ok(MqttSource::new(
                MqttSourceConfig::from_url(url)?,
                options.batch,
            ))
        })
    },
    check: |url| MqttSourceConfig::from_url(url).map(|_| ()),
};

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn url_options_parse_and_credentials_stay_out() {
        let c = MqttSourceConfig::from_url(
            "mqtt://app:pw@127.0.0.1:1884?topic=orders/%23&client_id=ibx-1&session_expiry=60m\
             &keep_alive=10s",
        )
        .unwrap();
        assert_eq!(c.topic, "orders/#");
        assert_eq!(c.client_id, "ibx-1");
        assert_eq!(c.session_expiry, Duration::from_secs(3600));
        assert_eq!(c.server.keep_alive, Duration::from_secs(10));
        assert_eq!((c.server.host.as_str(), c.server.port), ("127.0.0.1", 1884));
        assert_eq!(c.name, "mqtt:orders/#");
        assert!(!format!("{c:?}").contains("pw@"));
        let d = MqttSourceConfig::from_url("mqtt://h?topic=a/+/b").unwrap();
        assert_eq!(
            (d.topic.as_str(), d.client_id.as_str(), d.session_expiry),
            ("a/+/b", DEFAULT_CLIENT_ID, DEFAULT_SESSION_EXPIRY)
        );
        for (bad, says) in [
            ("mqtt://u:s3cret@h", "name the topic"),
            ("mqtt://u:s3cret@h?topic=t&qos=2", "qos"),
            ("mqtt://u:s3cret@h/x?topic=t", "mqtt://"),
        ] {
            let e = MqttSourceConfig::from_url(bad).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Config);
            assert!(e.to_string().contains(says), "{bad}: {e}");
            assert!(!e.to_string().contains("s3cret"), "{bad}: {e}");
        }
    }
}
