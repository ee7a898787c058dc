//! [`AmqpSink`]: publishes persistent, mandatory messages with publisher confirms, every confirm
//! of a call in flight at once.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::stream::{FuturesUnordered, StreamExt};
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions};
use lapin::protocol::{AMQPErrorKind, AMQPSoftError};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionProperties};
use outbox_core::sink::HEADER_EVENT_TYPE;
use outbox_core::{Envelope, Error, ErrorKind, Sink, SinkError};
use tracing::{info, warn};

use super::config::{valid_exchange, AmqpConfig, MAX_SHORT_STRING};
use super::error::{classify, target};

/// How long an exchange found to exist is trusted before it is checked again.
const EXCHANGE_TTL: Duration = Duration::from_secs(60);
/// AMQP `delivery_mode` of a persistent message: a durable queue writes it to disk before the
/// broker confirms it.
const PERSISTENT: u8 = 2;
/// Idle confirm channels kept for the next calls (one per concurrent relay worker is enough).
const MAX_IDLE_CHANNELS: usize = 64;

/// Header names RabbitMQ acts on when a message carries them: `CC` and `BCC` are
/// sender-selected distribution, routing copies to further routing keys. A row may not set
/// them: they would route past the destination and `--allow-destinations`.
const ROUTING_HEADERS: &[&str] = &["CC", "BCC"];

/// One message ready to go out: where, and its AMQP properties.
struct Route {
    exchange: ShortString,
    routing_key: ShortString,
    properties: BasicProperties,
}

impl Route {
    fn target(&self) -> String {
        target(self.exchange.as_str(), self.routing_key.as_str())
    }
}

/// RabbitMQ sink (AMQP 0-9-1).
///
/// Every message is published **persistent** (`delivery_mode` 2) and **mandatory** on a channel
/// in confirm mode, with `message_id` set to the message id and the row's headers in the AMQP
/// headers table. A message counts as published only on the broker's `basic.ack`; a message no
/// queue was bound for comes back (`basic.return`, `NO_ROUTE`) and is a rejection naming the
/// exchange and routing key, never a silent drop. Destinations are `exchange/routing.key`, or a
/// bare routing key on the URL's `?exchange=` (the default exchange unless set, which routes to
/// the queue of that name).
pub struct AmqpSink {
    cfg: AmqpConfig,
    /// The current connection; replaced when it is lost.
    conn: tokio::sync::Mutex<Option<Arc<Connection>>>,
    /// Confirm channels of the current connection that no call is using.
    idle: Mutex<Vec<Channel>>,
    /// Exchanges seen to exist, and when.
    exchanges: Mutex<HashMap<String, Instant>>,
}

impl AmqpSink {
    /// A sink for `cfg`. Connects at once, but a broker that is down is not an error: calls
    /// report it as unavailable and reconnect. Refused credentials are an error now, since no
    /// retry can fix them.
    pub async fn connect(cfg: AmqpConfig) -> Result<Self, Error> {
        let sink = Self {
            cfg,
            conn: tokio::sync::Mutex::new(None),
            idle: Mutex::new(Vec::new()),
            exchanges: Mutex::new(HashMap::new()),
        };
        match sink.connection().await {
            Ok(_) => {}
            Err(e) if e.is_unavailable() => warn!(
                sink = "amqp",
                error = %e,
                "RabbitMQ is not reachable yet; publishes retry until it is"
            ),
            // The message already names the broker (without its credentials).
            Err(e) => return Err(Error::new(ErrorKind::Connection, e.message)),
        }
        Ok(sink)
    }

    /// The live connection, made anew when there is none or it was lost.
    async fn connection(&self) -> Result<Arc<Connection>, SinkError> {
        let mut guard = self.conn.lock().await;
        if let Some(c) = guard.as_ref() {
            if c.status().connected() {
                return Ok(c.clone());
            }
        }
        // The old connection's channels and what was learned through it go with it.
        guard.take();
        self.idle_channels().clear();
        let props = ConnectionProperties::default()
            .with_connection_name(LongString::from(self.cfg.connection_name.as_str()));
        let conn = tokio::time::timeout(self.cfg.ack_timeout, self.cfg.open(props))
            .await
            .map_err(|_| {
                SinkError::unavailable(format!(
                    "rabbitmq: connecting to {} took longer than {:?}",
                    self.cfg.display, self.cfg.ack_timeout
                ))
            })?
            .map_err(|e| {
                let mut err = classify(&self.cfg.display, &e, false);
                err.message = format!("rabbitmq: cannot connect to {}: {e}", self.cfg.display);
                err
            })?;
        info!(sink = "amqp", broker = %self.cfg.display, "connected to RabbitMQ");
        let conn = Arc::new(conn);
        *guard = Some(conn.clone());
        Ok(conn)
    }

    fn idle_channels(&self) -> std::sync::MutexGuard<'_, Vec<Channel>> {
        self.idle.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn known_exchanges(&self) -> std::sync::MutexGuard<'_, HashMap<String, Instant>> {
        self.exchanges.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// An idle confirm channel of `conn`, or a new one.
    async fn channel(&self, conn: &Connection) -> Result<Channel, SinkError> {
        loop {
            let Some(ch) = self.idle_channels().pop() else {
                break;
            };
            if ch.status().connected() {
                return Ok(ch);
            }
        }
        let open = async {
            let ch = conn.create_channel().await?;
            ch.confirm_select(ConfirmSelectOptions::default()).await?;
            Ok::<_, lapin::Error>(ch)
        };
        tokio::time::timeout(self.cfg.ack_timeout, open)
            .await
            .map_err(|_| {
                SinkError::unavailable(format!(
                    "rabbitmq: opening a channel on {} took longer than {:?}",
                    self.cfg.display, self.cfg.ack_timeout
                ))
            })?
            .map_err(|e| classify(&self.cfg.display, &e, conn.status().connected()))
    }

    /// Whether `exchange` exists, asked with a passive declare on a channel of its own (a
    /// missing exchange closes the channel that asked). Publishing to a missing exchange would
    /// close the publishing channel instead, failing every other message in flight on it.
    async fn check_exchange(&self, conn: &Connection, exchange: &str) -> Result<(), SinkError> {
        if exchange.is_empty()
            || self
                .known_exchanges()
                .get(exchange)
                .is_some_and(|seen| seen.elapsed() < EXCHANGE_TTL)
        {
            return Ok(());
        }
        let name = ShortString::try_new(exchange)
            .map_err(|e| SinkError::invalid(format!("rabbitmq: exchange name: {e}")))?;
        let ask = async {
            let ch = conn.create_channel().await?;
            let found = ch
                .exchange_declare(
                    name,
                    lapin::ExchangeKind::Direct,
                    ExchangeDeclareOptions {
                        passive: true,
                        ..Default::default()
                    },
                    FieldTable::default(),
                )
                .await;
            if found.is_ok() {
                let _ = ch.close(200, "OK".into()).await;
            }
            found
        };
        let what = format!("exchange `{exchange}`");
        match tokio::time::timeout(self.cfg.ack_timeout, ask).await {
            Err(_) => Err(SinkError::unavailable(format!(
                "rabbitmq: checking {what} took longer than {:?}",
                self.cfg.ack_timeout
            ))),
            Ok(Ok(())) => {
                self.known_exchanges()
                    .insert(exchange.to_string(), Instant::now());
                Ok(())
            }
            Ok(Err(e)) => match e.kind() {
                lapin::ErrorKind::ProtocolError(p)
                    if p.kind() == &AMQPErrorKind::Soft(AMQPSoftError::NOTFOUND) =>
                {
                    Err(SinkError::rejected(format!(
                        "rabbitmq: {what} does not exist on {}; declare it, then redrive if \
                         the message ended failed",
                        self.cfg.display
                    )))
                }
                _ => Err(classify(&what, &e, conn.status().connected())),
            },
        }
    }

    /// Where `e` goes and with which properties; an invalid message when it can never go.
    fn route(&self, e: &Envelope) -> Result<Route, SinkError> {
        let (exchange, routing_key) = match e.destination.split_once('/') {
            Some((x, rk)) => (x, rk),
            None => (self.cfg.exchange.as_str(), e.destination.as_str()),
        };
        valid_exchange(exchange).map_err(|why| {
            SinkError::invalid(format!("rabbitmq: destination `{}`: {why}", e.destination))
        })?;
        let routing_key = ShortString::try_new(routing_key).map_err(|_| {
            SinkError::invalid(format!(
                "rabbitmq: destination `{}`: the routing key is over {MAX_SHORT_STRING} bytes",
                e.destination
            ))
        })?;
        if e.payload.len() as u64 > self.cfg.max_message_size {
            return Err(SinkError::invalid(format!(
                "rabbitmq: the message for {} is {} bytes; max_message_size is {} bytes",
                target(exchange, routing_key.as_str()),
                e.payload.len(),
                self.cfg.max_message_size
            )));
        }
        let mut headers = FieldTable::default();
        for (k, v) in &e.headers {
            // A CloudEvents envelope's content type is the `content_type` property below.
            if k.eq_ignore_ascii_case(outbox_core::cloudevents::HEADER_CONTENT_TYPE) {
                continue;
            }
            if ROUTING_HEADERS.iter().any(|r| r.eq_ignore_ascii_case(k)) {
                return Err(SinkError::invalid(format!(
                    "rabbitmq: header `{k}` is RabbitMQ's sender-selected distribution (it \
                     routes copies to other queues); rename it"
                )));
            }
            let name = ShortString::try_new(k.as_str()).map_err(|_| {
                SinkError::invalid(format!(
                    "rabbitmq: a header name is over {MAX_SHORT_STRING} bytes"
                ))
            })?;
            headers.insert(name, AMQPValue::LongString(LongString::from(v.as_bytes())));
        }
        let mut properties = BasicProperties::default()
            .with_delivery_mode(PERSISTENT)
            .with_content_type(
                outbox_core::cloudevents::content_type(&e.headers)
                    .unwrap_or("application/json")
                    .into(),
            )
            .with_app_id("outbox".into())
            // A UUID: 36 bytes, always a valid short string.
            .with_message_id(ShortString::from(e.id.to_string()))
            .with_timestamp(e.created_at.timestamp().max(0) as u64)
            .with_headers(headers);
        if let Some(t) = e
            .headers
            .iter()
            .find(|(k, _)| k == HEADER_EVENT_TYPE)
            .and_then(|(_, v)| ShortString::try_new(v.as_str()).ok())
        {
            properties = properties.with_type(t);
        }
        Ok(Route {
            // Checked above: at most 255 bytes.
            exchange: ShortString::try_new(exchange).unwrap_or_default(),
            routing_key,
            properties,
        })
    }

    /// The result of one confirm.
    fn confirmed(
        route: &Route,
        confirm: Result<Confirmation, lapin::Error>,
        connected: bool,
    ) -> Result<(), SinkError> {
        match confirm {
            Ok(Confirmation::Ack(None)) => Ok(()),
            Ok(Confirmation::Ack(Some(returned))) | Ok(Confirmation::Nack(Some(returned))) => {
                Err(SinkError::rejected(format!(
                    "rabbitmq: unroutable: no queue is bound to {} (the broker returned the \
                     mandatory message: {} {}); bind a queue, then redrive if the message ended \
                     failed",
                    route.target(),
                    returned.reply_code,
                    returned.reply_text
                )))
            }
            Ok(Confirmation::Nack(None)) => Err(SinkError::rejected(format!(
                "rabbitmq: the broker nacked the message for {} (a queue refused it, e.g. \
                 x-overflow=reject-publish at its length limit)",
                route.target()
            ))),
            Ok(Confirmation::NotRequested) => Err(SinkError::rejected(format!(
                "rabbitmq: the channel publishing to {} was not in confirm mode",
                route.target()
            ))),
            Err(e) => Err(classify(&route.target(), &e, connected)),
        }
    }
}

#[async_trait]
impl Sink for AmqpSink {
    fn name(&self) -> &str {
        "amqp"
    }

    fn ack_timeout(&self) -> Option<Duration> {
        Some(self.cfg.ack_timeout)
    }

    async fn publish(&self, batch: &[Envelope]) -> Vec<Result<(), SinkError>> {
        let mut results: Vec<Option<Result<(), SinkError>>> = vec![None; batch.len()];
        let mut routes: Vec<(usize, Route)> = Vec::with_capacity(batch.len());
        for (i, e) in batch.iter().enumerate() {
            match self.route(e) {
                Ok(r) => routes.push((i, r)),
                Err(err) => results[i] = Some(Err(err)),
            }
        }
        let finish = |mut results: Vec<Option<Result<(), SinkError>>>, err: &SinkError| {
            results
                .iter_mut()
                .filter(|r| r.is_none())
                .for_each(|r| *r = Some(Err(err.clone())));
            results
                .into_iter()
                .map(|r| r.unwrap_or_else(|| Err(err.clone())))
                .collect::<Vec<_>>()
        };
        if routes.is_empty() {
            return finish(results, &SinkError::rejected("rabbitmq: nothing published"));
        }
        let conn = match self.connection().await {
            Ok(c) => c,
            Err(e) => return finish(results, &e),
        };
        // Messages to an exchange that does not exist are refused here, so they cannot close
        // the channel the others are published on.
        let exchanges: HashSet<&str> = routes.iter().map(|(_, r)| r.exchange.as_str()).collect();
        let mut missing: HashMap<String, SinkError> = HashMap::new();
        for x in exchanges {
            if let Err(e) = self.check_exchange(&conn, x).await {
                missing.insert(x.to_string(), e);
            }
        }
        routes.retain(|(i, r)| match missing.get(r.exchange.as_str()) {
            Some(e) => {
                results[*i] = Some(Err(e.clone()));
                false
            }
            None => true,
        });
        let channel = match self.channel(&conn).await {
            Ok(c) => c,
            Err(e) => return finish(results, &e),
        };
        // Publish everything, then wait for the confirms together: one round trip per call.
        let mut pending = FuturesUnordered::new();
        for (i, route) in &routes {
            let sent = channel
                .basic_publish(
                    route.exchange.clone(),
                    route.routing_key.clone(),
                    BasicPublishOptions {
                        mandatory: true,
                        ..Default::default()
                    },
                    // Borrowed: the client frames it without a copy of its own.
                    &batch[*i].payload,
                    route.properties.clone(),
                )
                .await;
            match sent {
                Ok(confirm) => pending.push(async move { (*i, route, confirm.await) }),
                Err(e) => {
                    results[*i] = Some(Err(classify(
                        &route.target(),
                        &e,
                        conn.status().connected(),
                    )))
                }
            }
        }
        let deadline = tokio::time::Instant::now() + self.cfg.ack_timeout;
        let mut timed_out = false;
        while !pending.is_empty() {
            match tokio::time::timeout_at(deadline, pending.next()).await {
                Ok(Some((i, route, confirm))) => {
                    results[i] = Some(Self::confirmed(route, confirm, conn.status().connected()))
                }
                Ok(None) => break,
                Err(_) => {
                    timed_out = true;
                    break;
                }
            }
        }
        drop(pending);
        if !timed_out && channel.status().connected() {
            let mut idle = self.idle_channels();
            if idle.len() < MAX_IDLE_CHANNELS {
                idle.push(channel);
            }
        } else if !conn.status().connected() {
            // Reconnect on the next call rather than waiting for the next failure to show it.
            self.idle_channels().clear();
        }
        if results.iter().any(|r| {
            r.as_ref()
                .is_some_and(|r| r.as_ref().is_err_and(|e| !e.is_unavailable()))
        }) {
            // A refusal may mean an exchange went away: check again next time.
            self.known_exchanges().clear();
        }
        finish(
            results,
            &SinkError::unavailable(format!(
                "rabbitmq: no publisher confirm from {} within {:?}",
                self.cfg.display, self.cfg.ack_timeout
            )),
        )
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use outbox_core::SinkErrorKind;

    fn sink(url: &str) -> AmqpSink {
        AmqpSink {
            cfg: AmqpConfig::from_url(url).unwrap(),
            conn: tokio::sync::Mutex::new(None),
            idle: Mutex::new(Vec::new()),
            exchanges: Mutex::new(HashMap::new()),
        }
    }

    fn envelope(destination: &str) -> Envelope {
        Envelope {
            id: uuid::Uuid::now_v7(),
            destination: destination.into(),
            key: "k".into(),
            headers: vec![
                (HEADER_EVENT_TYPE.into(), "placed".into()),
                ("traceparent".into(), "00-1-2-01".into()),
            ],
            payload: bytes::Bytes::from_static(b"{}"),
            created_at: chrono::Utc::now(),
        }
    }

    #[test]
    fn destinations_name_an_exchange_and_a_routing_key() {
        let s = sink("amqp://h?exchange=orders");
        let r = s.route(&envelope("billing/invoice.sent")).unwrap();
        assert_eq!(
            (r.exchange.as_str(), r.routing_key.as_str()),
            ("billing", "invoice.sent")
        );
        let r = s.route(&envelope("order.placed")).unwrap();
        assert_eq!(
            (r.exchange.as_str(), r.routing_key.as_str()),
            ("orders", "order.placed")
        );
        // A leading `/` is the default exchange whatever the URL says.
        let r = s.route(&envelope("/jobs")).unwrap();
        assert_eq!((r.exchange.as_str(), r.routing_key.as_str()), ("", "jobs"));
        // Only the first `/` splits: the routing key may hold more.
        let r = sink("amqp://h").route(&envelope("x/a/b")).unwrap();
        assert_eq!((r.exchange.as_str(), r.routing_key.as_str()), ("x", "a/b"));
    }

    #[test]
    fn messages_carry_id_persistence_and_headers() {
        let e = envelope("q");
        let r = sink("amqp://h").route(&e).unwrap();
        let p = &r.properties;
        assert_eq!(p.message_id().as_ref().unwrap().as_str(), e.id.to_string());
        assert_eq!(*p.delivery_mode(), Some(PERSISTENT));
        assert_eq!(p.kind().as_ref().unwrap().as_str(), "placed");
        let h = p.headers().as_ref().unwrap().inner();
        assert_eq!(
            h.get("traceparent"),
            Some(&AMQPValue::LongString("00-1-2-01".into()))
        );
    }

    #[test]
    fn unsendable_messages_are_invalid() {
        let s = sink("amqp://h?max_message_size=1");
        let kind = |e: &Envelope| s.route(e).err().map(|e| e.kind);
        assert_eq!(kind(&envelope("q")), Some(SinkErrorKind::Invalid));
        let s = sink("amqp://h");
        let kind = |e: &Envelope| s.route(e).err().map(|e| e.kind);
        assert_eq!(
            kind(&envelope("bad exchange/q")),
            Some(SinkErrorKind::Invalid)
        );
        assert_eq!(
            kind(&envelope(&"k".repeat(256))),
            Some(SinkErrorKind::Invalid)
        );
        let mut bcc = envelope("q");
        bcc.headers.push(("BCC".into(), "other.queue".into()));
        let e = s.route(&bcc).err().unwrap();
        assert_eq!(e.kind, SinkErrorKind::Invalid);
        assert!(e.message.contains("`BCC`"), "{}", e.message);
        let mut long = envelope("q");
        long.headers.push(("h".repeat(256), "v".into()));
        assert_eq!(kind(&long), Some(SinkErrorKind::Invalid));
    }
}
