//! [`AmqpReader`]: consumes a scratch queue bound to a scratch exchange, with a connection of
//! its own.

use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicQosOptions, ExchangeDeclareOptions,
    ExchangeDeleteOptions, QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{Channel, Connection, ConnectionProperties, Consumer, ExchangeKind};
use outbox_core::{Error, ErrorKind};

use super::config::AmqpConfig;
use crate::read::{Delivered, Polled, Reader, Scratch, ScratchOptions};

/// Deliveries the broker sends ahead of the reader's acknowledgements.
const PREFETCH: u16 = 2_000;

/// A consumer of one queue. It acknowledges what each poll returns, so a message is returned
/// once unless the connection drops between delivery and acknowledgement (then the broker
/// delivers it again, and the checker sees the duplicate).
pub struct AmqpReader {
    cfg: AmqpConfig,
    queue: String,
    exchange: String,
    open: Option<(Connection, Channel, Consumer)>,
}

fn connection_error(what: &str, cfg: &AmqpConfig, e: lapin::Error) -> Error {
    Error::with_source(
        ErrorKind::Connection,
        format!("rabbitmq: {what} on {}: {e}", cfg.display),
        e,
    )
}

impl AmqpReader {
    /// A reader of `queue` (which must exist) on the broker `cfg` names. `exchange` is deleted
    /// with the queue by [`Reader::cleanup`] when not empty.
    pub async fn open(cfg: AmqpConfig, queue: &str, exchange: &str) -> Result<Self, Error> {
        let mut me = Self {
            cfg,
            queue: queue.to_string(),
            exchange: exchange.to_string(),
            open: None,
        };
        me.reopen().await?;
        Ok(me)
    }

    async fn connect(cfg: &AmqpConfig) -> Result<Connection, Error> {
        connect(
            cfg,
            &format!("{} reader", cfg.connection_name),
            Duration::from_secs(5),
        )
        .await
    }

    async fn reopen(&mut self) -> Result<(), Error> {
        self.open = None;
        let conn = Self::connect(&self.cfg).await?;
        let ch = conn
            .create_channel()
            .await
            .map_err(|e| connection_error("opening a channel", &self.cfg, e))?;
        ch.basic_qos(PREFETCH, BasicQosOptions::default())
            .await
            .map_err(|e| connection_error("basic.qos", &self.cfg, e))?;
        let consumer = ch
            .basic_consume(
                short(&self.queue)?,
                "".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(|e| connection_error(&format!("consuming {}", self.queue), &self.cfg, e))?;
        self.open = Some((conn, ch, consumer));
        Ok(())
    }
}

/// A connection of its own to the broker `cfg` names, shown as `name`, within `limit` (a
/// broker that never answers is an error): the readers' and the inbox source's way in, with the
/// sink's URL, TLS and credentials handling.
pub async fn connect(cfg: &AmqpConfig, name: &str, limit: Duration) -> Result<Connection, Error> {
    let props = ConnectionProperties::default().with_connection_name(name.to_string().into());
    tokio::time::timeout(limit, cfg.open(props))
        .await
        .map_err(|_| {
            Error::new(
                ErrorKind::Connection,
                format!("rabbitmq: connecting to {} timed out", cfg.display),
            )
        })?
        .map_err(|e| connection_error("connecting", cfg, e))
}

/// The headers of a delivery as (name, value) strings: what the sink wrote, read back.
pub fn delivery_headers(d: &lapin::message::Delivery) -> Vec<(String, String)> {
    d.properties
        .headers()
        .as_ref()
        .map(|h| {
            h.inner()
                .iter()
                .map(|(k, v)| (k.as_str().to_string(), header_text(v)))
                .collect()
        })
        .unwrap_or_default()
}

fn short(name: &str) -> Result<ShortString, Error> {
    ShortString::try_new(name).map_err(|e| Error::config(format!("rabbitmq: `{name}`: {e}")))
}

/// A header value as text: strings as they are (lossy UTF-8), anything else in its debug form.
fn header_text(v: &AMQPValue) -> String {
    match v {
        AMQPValue::LongString(s) => String::from_utf8_lossy(s.as_bytes()).into_owned(),
        AMQPValue::ShortString(s) => s.as_str().to_string(),
        other => format!("{other:?}"),
    }
}

/// A delivery as the checker sees it: the id from `message_id` (the broker's dedupe field),
/// else the `outbox-message-id` header; the destination as the sink's template names it.
fn delivered(d: &lapin::message::Delivery) -> Option<Delivered> {
    let mut headers = delivery_headers(d);
    // The `content_type` property, as the `content-type` a CloudEvents reader looks for.
    if let Some(ct) = d.properties.content_type().as_ref() {
        if !headers
            .iter()
            .any(|(k, _)| k.eq_ignore_ascii_case("content-type"))
        {
            headers.push(("content-type".to_string(), ct.as_str().to_string()));
        }
    }
    let destination = if d.exchange.as_str().is_empty() {
        d.routing_key.as_str().to_string()
    } else {
        format!("{}/{}", d.exchange, d.routing_key)
    };
    let mut out = Delivered::from_headers(destination, headers, Bytes::from(d.data.clone()))?;
    if let Some(id) = d
        .properties
        .message_id()
        .as_ref()
        .and_then(|m| m.as_str().parse().ok())
    {
        out.id = id;
    }
    Some(out)
}

#[async_trait]
impl Reader for AmqpReader {
    async fn poll(&mut self, wait: Duration) -> Polled {
        let mut out = Polled::default();
        if self.open.is_none() && self.reopen().await.is_err() {
            // The broker is away: nothing this time, try again on the next poll.
            tokio::time::sleep(wait.min(Duration::from_millis(200))).await;
            return out;
        }
        let Some((_, ch, consumer)) = self.open.as_mut() else {
            return out;
        };
        let until = tokio::time::Instant::now() + wait.max(Duration::from_millis(20));
        let mut last_tag = None;
        let mut broken = false;
        while tokio::time::Instant::now() < until {
            match tokio::time::timeout(Duration::from_millis(20), consumer.next()).await {
                Err(_) if out.delivered.is_empty() && out.unreadable == 0 => continue,
                Err(_) => break,
                Ok(Some(Ok(d))) => {
                    last_tag = Some(d.delivery_tag);
                    match delivered(&d) {
                        Some(m) => out.delivered.push(m),
                        None => out.unreadable += 1,
                    }
                }
                Ok(Some(Err(_))) | Ok(None) => {
                    broken = true;
                    break;
                }
            }
        }
        if let Some(tag) = last_tag {
            // Everything up to `tag` in one acknowledgement. If it fails, the broker delivers
            // these again after the reconnect: duplicates the checker counts, nothing lost.
            if ch
                .basic_ack(tag, BasicAckOptions { multiple: true })
                .await
                .is_err()
            {
                broken = true;
            }
        }
        if broken {
            self.open = None;
        }
        out
    }

    fn describe(&self) -> String {
        format!("RabbitMQ queue {} on {}", self.queue, self.cfg.display)
    }

    async fn cleanup(&mut self) {
        self.open = None;
        let result = async {
            let conn = Self::connect(&self.cfg).await?;
            let ch = conn
                .create_channel()
                .await
                .map_err(|e| connection_error("opening a channel", &self.cfg, e))?;
            ch.queue_delete(short(&self.queue)?, QueueDeleteOptions::default())
                .await
                .map_err(|e| connection_error("deleting the queue", &self.cfg, e))?;
            if !self.exchange.is_empty() {
                ch.exchange_delete(short(&self.exchange)?, ExchangeDeleteOptions::default())
                    .await
                    .map_err(|e| connection_error("deleting the exchange", &self.cfg, e))?;
            }
            let _ = conn.close(200, "OK".into()).await;
            Ok::<(), Error>(())
        }
        .await;
        if let Err(error) = result {
            tracing::warn!(queue = %self.queue, %error, "could not delete a scratch queue");
        }
    }
}

/// Declares a topic exchange and a queue, both named `name` (durable when `durable`), and binds
/// the queue to every routing key of the exchange (`#`).
pub async fn declare_scratch(cfg: &AmqpConfig, name: &str, durable: bool) -> Result<(), Error> {
    let conn = AmqpReader::connect(cfg).await?;
    let ch = conn
        .create_channel()
        .await
        .map_err(|e| connection_error("opening a channel", cfg, e))?;
    ch.exchange_declare(
        short(name)?,
        ExchangeKind::Topic,
        ExchangeDeclareOptions {
            durable,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await
    .map_err(|e| connection_error(&format!("declaring exchange {name}"), cfg, e))?;
    ch.queue_declare(
        short(name)?,
        QueueDeclareOptions {
            durable,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await
    .map_err(|e| connection_error(&format!("declaring queue {name}"), cfg, e))?;
    ch.queue_bind(
        short(name)?,
        short(name)?,
        "#".into(),
        QueueBindOptions::default(),
        FieldTable::default(),
    )
    .await
    .map_err(|e| connection_error(&format!("binding queue {name}"), cfg, e))?;
    let _ = conn.close(200, "OK".into()).await;
    Ok(())
}

/// A topic exchange and a queue `outbox_<tag>_<suffix>` bound to all of it, and a reader of the
/// queue; the relay publishes to `outbox_<tag>_<suffix>/{event_type}`.
pub(crate) async fn scratch(url: &str, options: &ScratchOptions) -> Result<Scratch, Error> {
    let cfg = AmqpConfig::from_url(url)?;
    let name = options.unique_name();
    declare_scratch(&cfg, &name, options.durable).await?;
    let mut reader = AmqpReader {
        cfg,
        queue: name.clone(),
        exchange: name.clone(),
        open: None,
    };
    if let Err(e) = reader.reopen().await {
        reader.cleanup().await;
        return Err(e);
    }
    let destination = format!("{name}/{{event_type}}");
    Ok(Scratch {
        sink_url: url.to_string(),
        destination,
        reader: Box::new(reader),
    })
}
