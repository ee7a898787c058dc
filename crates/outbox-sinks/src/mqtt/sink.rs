//! [`MqttSink`]: QoS 1 publishes over MQTT v5; each call waits for the PUBACK of every message
//! it sent.
//!
//! rumqttc's event loop does the I/O and must be polled: a task of the sink's own polls it and
//! hands each PUBACK to the call waiting for it. The client assigns packet ids itself, when its
//! event loop takes a publish from its queue, and reports each as `Outgoing::Publish(pkid)` in
//! queue order. So the sink queues a publish and its waiter under one lock, and the task gives
//! the next reported packet id to the oldest waiter. Packet ids already waiting for their PUBACK
//! are never handed out again by the client, so the pairing holds.
//!
//! A lost connection fails everything in flight as unavailable and starts a fresh client and
//! event loop: the old one's queue dies with it, so no stale publish can be reported against a
//! new waiter. The relay republishes what failed (same ids), which is MQTT's at-least-once too.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use outbox_core::{Envelope, Error, Sink, SinkError};
use rumqttc::v5::mqttbytes::v5::{Packet, PublishProperties};
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::{AsyncClient, Event, EventLoop};
use rumqttc::Outgoing;
use tokio::sync::oneshot;
use tracing::{info, warn};

use super::config::MqttConfig;
use super::error;

/// Publishes the client may hold queued (the relay's largest calls across its workers).
const QUEUE: usize = 100_000;
/// Fixed part of a PUBLISH packet besides topic, properties and payload, generously counted.
const PACKET_OVERHEAD: usize = 64;
/// Wait before reconnecting after a failed connection (the relay's breaker paces the calls).
const RECONNECT_DELAY: Duration = Duration::from_millis(200);

type Waiter = oneshot::Sender<Result<(), SinkError>>;

/// The client of the current event loop and the waiters of publishes it has not reported yet.
struct Conn {
    client: AsyncClient,
    queued: VecDeque<(String, Waiter)>,
}

struct Shared {
    cfg: MqttConfig,
    client_id: String,
    conn: Mutex<Conn>,
    /// Set on CONNACK, cleared when the connection fails: publishes fail at once while clear.
    connected: AtomicBool,
    /// The largest packet the broker accepts (its CONNACK's maximum packet size, if any).
    broker_max_packet: AtomicU32,
    /// Why the last connection attempt failed (a refused TLS handshake, a refused login),
    /// until one succeeds: the publishes refused meanwhile say it.
    last_failure: Mutex<Option<String>>,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Conn> {
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn new_client(&self) -> (AsyncClient, EventLoop) {
        new_client(&self.cfg, &self.client_id)
    }
}

/// A client and its event loop, not connected yet.
fn new_client(cfg: &MqttConfig, client_id: &str) -> (AsyncClient, EventLoop) {
    let max = u32::try_from(cfg.max_message_size + PACKET_OVERHEAD as u64 + 65_536)
        .unwrap_or(u32::MAX)
        .min(268_435_455);
    let mut opts = cfg.options(client_id.to_string(), max);
    // A fresh session each time: nothing of an old connection is resent behind the sink's
    // back (the relay republishes what failed).
    opts.set_clean_start(true)
        .set_request_channel_capacity(QUEUE);
    AsyncClient::new(opts, QUEUE)
}

/// MQTT v5 sink.
///
/// Every message is published with QoS 1 to the topic the template renders, not retained, with
/// the headers (the relay's `outbox-*`, the message id among them, and the row's) as user
/// properties and `content_type` `application/json`. `Ok` means the broker's PUBACK came with
/// a success code. MQTT brokers have no dedupe: a republished message is delivered again.
pub struct MqttSink {
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for MqttSink {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl MqttSink {
    /// A sink for `cfg`; connects in the background (a broker that is down is an outage of the
    /// publishes, retried, not an error here).
    pub fn connect(cfg: MqttConfig) -> Result<Self, Error> {
        let client_id = cfg.client_id_or("outbox-relay");
        let (client, eventloop) = new_client(&cfg, &client_id);
        let shared = Arc::new(Shared {
            cfg,
            client_id,
            conn: Mutex::new(Conn {
                client,
                queued: VecDeque::new(),
            }),
            connected: AtomicBool::new(false),
            broker_max_packet: AtomicU32::new(u32::MAX),
            last_failure: Mutex::new(None),
        });
        let task = tokio::spawn(run(shared.clone(), eventloop));
        Ok(Self { shared, task })
    }

    /// Waits up to `limit` for the first connection (a TLS handshake takes a few round trips
    /// more than a plain connect), so that the relay's first publishes do not find the sink
    /// still connecting and count an outage that is none. Returns either way: a broker that is
    /// down stays an outage of the publishes, not an error here.
    pub async fn wait_connected(&self, limit: Duration) {
        let until = tokio::time::Instant::now() + limit;
        while !self.shared.connected.load(Ordering::Acquire) && tokio::time::Instant::now() < until
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// A topic MQTT accepts for a publish: not empty, no wildcard (`+`, `#`), no NUL, at most
    /// 65,535 bytes.
    fn check(&self, e: &Envelope) -> Result<(), SinkError> {
        let t = &e.destination;
        if t.is_empty() || t.len() > 65_535 || t.contains(['+', '#', '\0']) {
            return Err(SinkError::invalid(format!(
                "mqtt: `{t}` is not a topic one can publish to (empty, a wildcard `+`/`#`, a NUL \
                 or over 65,535 bytes)"
            )));
        }
        let props: usize = e.headers.iter().map(|(k, v)| k.len() + v.len() + 5).sum();
        let size = e.payload.len() + t.len() + props + PACKET_OVERHEAD;
        let limit = (self.shared.cfg.max_message_size as usize)
            .min(self.shared.broker_max_packet.load(Ordering::Relaxed) as usize);
        if e.payload.len() as u64 > self.shared.cfg.max_message_size || size > limit {
            return Err(SinkError::invalid(format!(
                "mqtt: the message for topic `{t}` is {size} bytes with its headers; the limit is \
                 {limit} bytes (max_message_size, or the broker's maximum packet size)"
            )));
        }
        Ok(())
    }
}

/// Polls the event loop for ever: pairs packet ids with waiters, resolves waiters on PUBACK,
/// and starts over with a fresh client when the connection fails.
async fn run(shared: Arc<Shared>, mut eventloop: EventLoop) {
    let mut inflight: HashMap<u16, (String, Waiter)> = HashMap::new();
    loop {
        match eventloop.poll().await {
            Ok(Event::Incoming(Packet::ConnAck(ack))) => {
                let max = ack
                    .properties
                    .as_ref()
                    .and_then(|p| p.max_packet_size)
                    .unwrap_or(u32::MAX);
                shared.broker_max_packet.store(max, Ordering::Relaxed);
                shared.connected.store(true, Ordering::Release);
                *shared
                    .last_failure
                    .lock()
                    .unwrap_or_else(|p| p.into_inner()) = None;
                info!(sink = "mqtt", broker = %shared.cfg.display, "connected to the MQTT broker");
            }
            Ok(Event::Outgoing(Outgoing::Publish(pkid))) => {
                let next = shared.lock().queued.pop_front();
                match next {
                    Some(w) => {
                        inflight.insert(pkid, w);
                    }
                    None => warn!(sink = "mqtt", pkid, "a publish no call is waiting for"),
                }
            }
            Ok(Event::Incoming(Packet::PubAck(ack))) => {
                if let Some((topic, w)) = inflight.remove(&ack.pkid) {
                    let _ = w.send(error::puback(&topic, &ack.reason));
                }
            }
            Ok(Event::Incoming(Packet::Disconnect(d))) => {
                warn!(sink = "mqtt", reason = ?d.reason_code, "the broker disconnected the relay");
            }
            Ok(_) => {}
            Err(e) => {
                let err = error::connection(&shared.cfg.display, &e);
                warn!(sink = "mqtt", error = %err, "MQTT connection failed; reconnecting");
                *shared
                    .last_failure
                    .lock()
                    .unwrap_or_else(|p| p.into_inner()) = Some(err.message.clone());
                let (client, fresh) = shared.new_client();
                let queued = {
                    let mut conn = shared.lock();
                    shared.connected.store(false, Ordering::Release);
                    conn.client = client;
                    std::mem::take(&mut conn.queued)
                };
                for (_, w) in queued.into_iter().chain(inflight.drain().map(|(_, w)| w)) {
                    let _ = w.send(Err(err.clone()));
                }
                eventloop = fresh;
                tokio::time::sleep(RECONNECT_DELAY).await;
            }
        }
    }
}

#[async_trait]
impl Sink for MqttSink {
    fn name(&self) -> &str {
        "mqtt"
    }

    fn ack_timeout(&self) -> Option<Duration> {
        Some(self.shared.cfg.ack_timeout)
    }

    async fn publish(&self, batch: &[Envelope]) -> Vec<Result<(), SinkError>> {
        let mut results: Vec<Option<Result<(), SinkError>>> = vec![None; batch.len()];
        let mut waiting = Vec::with_capacity(batch.len());
        {
            let mut conn = self.shared.lock();
            let connected = self.shared.connected.load(Ordering::Acquire);
            for (i, e) in batch.iter().enumerate() {
                if let Err(err) = self.check(e) {
                    results[i] = Some(Err(err));
                    continue;
                }
                if !connected {
                    let why = self
                        .shared
                        .last_failure
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .clone();
                    results[i] = Some(Err(SinkError::unavailable(match why {
                        Some(why) => format!(
                            "mqtt: not connected to {}; the last attempt: {why}",
                            self.shared.cfg.display
                        ),
                        None => format!("mqtt: not connected to {}", self.shared.cfg.display),
                    })));
                    continue;
                }
                // A CloudEvents envelope's content type goes to the Content Type property (the
                // MQTT 5 binding), not to a user property.
                let content_type = outbox_core::cloudevents::content_type(&e.headers)
                    .unwrap_or("application/json");
                let props = PublishProperties {
                    user_properties: e
                        .headers
                        .iter()
                        .filter(|(k, _)| {
                            !k.eq_ignore_ascii_case(outbox_core::cloudevents::HEADER_CONTENT_TYPE)
                        })
                        .cloned()
                        .collect(),
                    content_type: Some(content_type.into()),
                    ..Default::default()
                };
                // Queued and paired under one lock: the event loop reports packet ids in the
                // order of this queue.
                let sent = conn.client.try_publish_with_properties(
                    e.destination.clone(),
                    QoS::AtLeastOnce,
                    false,
                    // Shared with the claimed row, not copied.
                    e.payload.clone(),
                    props,
                );
                match sent {
                    Ok(()) => {
                        let (tx, rx) = oneshot::channel();
                        conn.queued.push_back((e.destination.clone(), tx));
                        waiting.push((i, rx));
                    }
                    Err(_) => {
                        results[i] = Some(Err(SinkError::unavailable(format!(
                            "mqtt: the client's queue to {} is full or closed",
                            self.shared.cfg.display
                        ))))
                    }
                }
            }
        }
        let deadline = tokio::time::Instant::now() + self.shared.cfg.ack_timeout;
        for (i, rx) in waiting {
            results[i] = Some(match tokio::time::timeout_at(deadline, rx).await {
                Ok(Ok(r)) => r,
                Ok(Err(_)) => Err(SinkError::unavailable("mqtt: the connection was reset")),
                Err(_) => Err(SinkError::unavailable(format!(
                    "mqtt: no PUBACK from {} within {:?}",
                    self.shared.cfg.display, self.shared.cfg.ack_timeout
                ))),
            });
        }
        results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(SinkError::rejected("mqtt: not published"))))
            .collect()
    }
}
