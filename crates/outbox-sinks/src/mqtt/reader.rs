//! [`MqttReader`]: a QoS 1 subscriber with a persistent session, subscribed before anything is
//! published.

use std::time::Duration;

use async_trait::async_trait;
use outbox_core::{Error, ErrorKind};
use rumqttc::v5::mqttbytes::v5::{Filter, Packet};
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::{AsyncClient, Event};
use tokio::sync::mpsc;

use super::config::MqttConfig;
use crate::read::{Delivered, Polled, Reader, Scratch, ScratchOptions};

/// How long the broker keeps the reader's session (its subscription and the QoS 1 messages
/// queued for it) while the reader is disconnected.
const SESSION_EXPIRY: u32 = 3_600;
/// Largest packet the reader accepts.
const MAX_PACKET: u32 = 268_435_455;

/// A subscriber of `filter` under a fixed client id with `clean_start = false` and a session
/// that outlives disconnections: when the connection drops or the broker restarts with its
/// sessions persisted, the broker delivers what was queued meanwhile. A broker that loses its
/// sessions (no persistence) loses what was queued for the reader, and the reader subscribes
/// again.
pub struct MqttReader {
    cfg: MqttConfig,
    client_id: String,
    filter: String,
    rx: mpsc::UnboundedReceiver<Option<Delivered>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for MqttReader {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn delivered(p: &rumqttc::v5::mqttbytes::v5::Publish) -> Option<Delivered> {
    let topic = String::from_utf8(p.topic.to_vec()).ok()?;
    let mut headers = p
        .properties
        .as_ref()
        .map(|pr| pr.user_properties.clone())
        .unwrap_or_default();
    // The Content Type property, as the `content-type` a CloudEvents reader looks for.
    if let Some(ct) = p.properties.as_ref().and_then(|pr| pr.content_type.clone()) {
        if !headers
            .iter()
            .any(|(k, _)| k.eq_ignore_ascii_case("content-type"))
        {
            headers.push(("content-type".to_string(), ct));
        }
    }
    Delivered::from_headers(topic, headers, p.payload.clone())
}

impl MqttReader {
    /// Subscribes to `filter` (QoS 1) as `client_id`, and returns once the broker confirmed the
    /// subscription (SUBACK), so nothing published after this returns is missed.
    pub async fn open(cfg: MqttConfig, client_id: &str, filter: &str) -> Result<Self, Error> {
        let mut opts = cfg.options(client_id.to_string(), MAX_PACKET);
        opts.set_clean_start(false)
            .set_session_expiry_interval(Some(SESSION_EXPIRY));
        let (client, mut eventloop) = AsyncClient::new(opts, 100);
        let (tx, rx) = mpsc::unbounded_channel();
        let (subscribed_tx, subscribed) = tokio::sync::oneshot::channel::<Result<(), String>>();
        let sub = filter.to_string();
        let task = tokio::spawn(async move {
            let mut subscribed_tx = Some(subscribed_tx);
            let subscribe = |client: &AsyncClient| {
                client
                    .try_subscribe_many([Filter::new(sub.clone(), QoS::AtLeastOnce)])
                    .is_ok()
            };
            loop {
                match eventloop.poll().await {
                    Ok(Event::Incoming(Packet::ConnAck(ack))) => {
                        // A new session (the first, or one the broker lost) has no subscription.
                        if !ack.session_present && !subscribe(&client) {
                            return;
                        }
                        if ack.session_present {
                            if let Some(s) = subscribed_tx.take() {
                                let _ = s.send(Ok(()));
                            }
                        }
                    }
                    Ok(Event::Incoming(Packet::SubAck(ack))) => {
                        if let Some(s) = subscribed_tx.take() {
                            let ok = ack.return_codes.iter().all(|c| {
                                matches!(
                                    c,
                                    rumqttc::v5::mqttbytes::v5::SubscribeReasonCode::Success(_)
                                )
                            });
                            let _ = s.send(if ok {
                                Ok(())
                            } else {
                                Err(format!("{:?}", ack.return_codes))
                            });
                        }
                    }
                    Ok(Event::Incoming(Packet::Publish(p))) => {
                        if tx.send(delivered(&p)).is_err() {
                            return;
                        }
                    }
                    Ok(_) => {}
                    Err(e) => {
                        if let Some(s) = subscribed_tx.take() {
                            let _ = s.send(Err(e.to_string()));
                        }
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
            }
        });
        let display = cfg.display.clone();
        let fail = |why: String| {
            Error::new(
                ErrorKind::Connection,
                format!("mqtt: subscribing to `{filter}` on {display}: {why}"),
            )
        };
        match tokio::time::timeout(Duration::from_secs(10), subscribed).await {
            Ok(Ok(Ok(()))) => Ok(Self {
                cfg,
                client_id: client_id.to_string(),
                filter: filter.to_string(),
                rx,
                task,
            }),
            Ok(Ok(Err(why))) => {
                task.abort();
                Err(fail(why))
            }
            _ => {
                task.abort();
                Err(fail("no SUBACK in time".into()))
            }
        }
    }
}

#[async_trait]
impl Reader for MqttReader {
    async fn poll(&mut self, wait: Duration) -> Polled {
        let mut out = Polled::default();
        let until = tokio::time::Instant::now() + wait.max(Duration::from_millis(20));
        loop {
            while let Ok(item) = self.rx.try_recv() {
                match item {
                    Some(d) => out.delivered.push(d),
                    None => out.unreadable += 1,
                }
            }
            if !out.delivered.is_empty() || out.unreadable > 0 {
                break;
            }
            match tokio::time::timeout_at(until, self.rx.recv()).await {
                Ok(Some(Some(d))) => out.delivered.push(d),
                Ok(Some(None)) => out.unreadable += 1,
                Ok(None) | Err(_) => break,
            }
        }
        out
    }

    fn describe(&self) -> String {
        format!(
            "MQTT subscription `{}` ({}) on {}",
            self.filter, self.client_id, self.cfg.display
        )
    }

    /// Ends the reader's session on the broker: connects once more under its id with a clean
    /// start and no session expiry, then disconnects.
    async fn cleanup(&mut self) {
        self.task.abort();
        let mut opts = self.cfg.options(self.client_id.clone(), MAX_PACKET);
        opts.set_clean_start(true);
        let (client, mut eventloop) = AsyncClient::new(opts, 10);
        let ended = async {
            loop {
                match eventloop.poll().await {
                    Ok(Event::Incoming(Packet::ConnAck(_))) => {
                        let _ = client.try_disconnect();
                    }
                    Ok(Event::Outgoing(rumqttc::Outgoing::Disconnect)) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        };
        if tokio::time::timeout(Duration::from_secs(5), ended)
            .await
            .is_err()
        {
            tracing::warn!(client_id = %self.client_id, "could not end a scratch MQTT session");
        }
    }
}

/// A QoS 1 subscription to `outbox_<tag>_<suffix>/#` with a persistent session, and a reader of
/// it; the relay publishes to `outbox_<tag>_<suffix>/{event_type}`.
pub(crate) async fn scratch(url: &str, options: &ScratchOptions) -> Result<Scratch, Error> {
    let cfg = MqttConfig::from_url(url)?;
    let prefix = options.unique_name();
    let reader = MqttReader::open(cfg, &format!("{prefix}_reader"), &format!("{prefix}/#")).await?;
    Ok(Scratch {
        sink_url: url.to_string(),
        destination: format!("{prefix}/{{event_type}}"),
        reader: Box::new(reader),
    })
}
