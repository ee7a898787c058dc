//! [`AmqpSource`]: one RabbitMQ queue, each delivery acknowledged after the ingest committed.
//!
//! Messages written by the RabbitMQ sink of `outbox relay` carry the outbox message id in
//! `message_id` and the `outbox-*` headers; other messages are read as well: type = the `type`
//! property, else the queue; key = `outbox-aggregate-id`, else the id; and a stable id from
//! `message_id`, else from the queue and the delivery (which is not stable across redeliveries:
//! give such messages a `message_id`).
//!
//! **Order across crashes.** The consumer takes at most one batch of unacknowledged deliveries
//! (`basic.qos` prefetch = the daemon's batch). When a channel closes (the daemon killed, its
//! connection lost, or [`Source::recover`] closing it on purpose), RabbitMQ requeues its
//! unacknowledged messages. RabbitMQ's documentation (negative acknowledgements and requeuing) promises: "When a message is requeued, it
//! will be placed to its original position in its queue, if possible. If not (due to concurrent
//! deliveries and acknowledgements from other consumers when multiple consumers share a queue),
//! the message will be requeued to a position closer to queue head." With one daemon per queue
//! (the daemon's source lock) they therefore come back before anything newer. The limit: a
//! predecessor whose process hangs with its TCP connection open keeps its messages until the
//! broker notices (the heartbeat timeout, 60 s by default); a standby that took over meanwhile
//! would ingest newer messages first.

use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions, QueueDeclareOptions};
use lapin::types::{FieldTable, ShortString};
use lapin::{Channel, Connection, Consumer};
use outbox_core::options::{QueryOptions, Role};
use outbox_core::{Error, ErrorKind, Result};
use outbox_sinks::amqp::{connect, delivery_headers, AmqpConfig};
use tracing::{info, warn};

use super::{AckInner, AckToken, Delivery, Source, SourceRetention};
use crate::message::{position_id, InboxMessage};

/// How long a fetch waits for the first delivery before it answers "nothing now".
const FIRST_DELIVERY_WAIT: Duration = Duration::from_millis(100);
/// How long a fetch that has deliveries waits for one more (prefetched ones arrive at once).
const NEXT_DELIVERY_WAIT: Duration = Duration::from_millis(5);

/// Where and how to consume.
#[derive(Debug, Clone)]
pub struct AmqpSourceConfig {
    /// Broker, credentials and connection options, parsed by the sink's parser (its
    /// `ack_timeout` bounds every wait on the broker here).
    pub server: AmqpConfig,
    /// The queue (it must exist; the source declares nothing).
    pub queue: String,
    /// The `source` column: `amqp:<queue>` unless given.
    pub name: String,
}

impl AmqpSourceConfig {
    /// Parses `amqp[s]://[user:pass@]host[:port][/vhost]?queue=Q[&name=N]` plus the sink's
    /// connection options (`ack_timeout`, `connection_name`, `heartbeat`,
    /// `connection_timeout`, `frame_max`, `channel_max`).
    pub fn from_url(url: &str) -> Result<Self> {
        // The sink's connection options, read for the source (errors say "source option").
        let known: Vec<&str> = [
            "queue",
            "name",
            "ack_timeout",
            "connection_name",
            // TLS and credentials, as the sink reads them.
            "tls_ca",
            "tls_cert",
            "tls_key",
            "password_file",
            "password_env",
            "auth_mechanism",
        ]
        .into_iter()
        .chain(outbox_sinks::amqp::URI_OPTIONS.iter().copied())
        .collect();
        let (base, o) = QueryOptions::from_url(Role::Source, url, &known)?;
        let queue = o.str("queue").map(str::to_string);
        let name = o.non_empty("name")?;
        let queue = queue.filter(|q| !q.is_empty()).ok_or_else(|| {
            Error::config(format!(
                "source `{}`: name the queue, e.g. amqp://127.0.0.1:5672/%2f?queue=orders",
                outbox_core::redact::url(url)
            ))
        })?;
        if ShortString::try_new(queue.as_str()).is_err() {
            return Err(Error::config(
                "source option queue: a queue name is at most 255 bytes",
            ));
        }
        let mut server = AmqpConfig::from_options(base, &o)?;
        if !o.has("connection_name") {
            server.connection_name = "outbox inbox".to_string();
        }
        Ok(Self {
            name: name.map_or_else(|| format!("amqp:{queue}"), str::to_string),
            queue,
            server,
        })
    }
}

/// The connection, channel and consumer deliveries come from; replaced when they break.
struct Open {
    conn: Connection,
    channel: Channel,
    consumer: Consumer,
    /// Counts channels opened: delivery tags are per channel, so a token of an older one is
    /// never acknowledged on a newer one (its message was requeued when its channel closed).
    generation: u64,
}

/// One RabbitMQ queue as an inbox source.
pub struct AmqpSource {
    cfg: AmqpSourceConfig,
    prefetch: u16,
    open: Option<Open>,
    generation: u64,
}

fn amqp_error(what: &str, e: impl std::fmt::Display) -> Error {
    Error::new(
        ErrorKind::Connection,
        outbox_core::redact::sanitize(&format!("rabbitmq source: {what}: {e}")),
    )
}

impl AmqpSource {
    /// Connects and checks that the queue exists (a missing queue is a config error: the
    /// source declares nothing). Consuming starts with [`Source::recover`].
    pub async fn connect(cfg: AmqpSourceConfig, batch: usize) -> Result<Self> {
        let conn = connect(
            &cfg.server,
            &cfg.server.connection_name,
            cfg.server.ack_timeout,
        )
        .await?;
        let check = async {
            let ch = conn.create_channel().await?;
            ch.queue_declare(
                cfg.queue.as_str().into(),
                QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
        };
        let checked = tokio::time::timeout(cfg.server.ack_timeout, check).await;
        let _ = tokio::time::timeout(cfg.server.ack_timeout, conn.close(200, "OK".into())).await;
        match checked {
            Err(_) => return Err(amqp_error("checking the queue", "no answer")),
            Ok(Err(e)) if e.to_string().contains("NOT_FOUND") => {
                return Err(Error::config(format!(
                    "rabbitmq source: no queue `{}` on {} (declare it first; the source only \
                     consumes)",
                    cfg.queue, cfg.server.display
                )))
            }
            Ok(Err(e)) => return Err(amqp_error("checking the queue", e)),
            Ok(Ok(_)) => {}
        }
        Ok(Self {
            cfg,
            prefetch: u16::try_from(batch.max(1)).unwrap_or(u16::MAX),
            open: None,
            generation: 0,
        })
    }

    async fn reopen(&mut self) -> Result<()> {
        self.close().await;
        let limit = self.cfg.server.ack_timeout;
        let conn = connect(&self.cfg.server, &self.cfg.server.connection_name, limit).await?;
        let start = async {
            let channel = conn.create_channel().await?;
            channel
                .basic_qos(self.prefetch, BasicQosOptions::default())
                .await?;
            let consumer = channel
                .basic_consume(
                    self.cfg.queue.as_str().into(),
                    "outbox-inbox".into(),
                    BasicConsumeOptions::default(),
                    FieldTable::default(),
                )
                .await?;
            Ok::<_, lapin::Error>((channel, consumer))
        };
        let (channel, consumer) = tokio::time::timeout(limit, start)
            .await
            .map_err(|_| amqp_error("consuming", "no answer"))?
            .map_err(|e| amqp_error(&format!("consuming queue {}", self.cfg.queue), e))?;
        self.generation += 1;
        self.open = Some(Open {
            conn,
            channel,
            consumer,
            generation: self.generation,
        });
        Ok(())
    }

    /// Closes the connection: RabbitMQ requeues every delivery not acknowledged on it.
    async fn close(&mut self) {
        if let Some(open) = self.open.take() {
            let _ = tokio::time::timeout(
                self.cfg.server.ack_timeout,
                open.conn.close(200, "OK".into()),
            )
            .await;
        }
    }

    fn delivery(&self, d: &lapin::message::Delivery, generation: u64) -> Delivery {
        let id = d
            .properties
            .message_id()
            .as_ref()
            .map(|m| m.as_str().to_string());
        let mut headers = delivery_headers(d);
        // The sink's `message_id` is the outbox message id: as a header, it wins like one.
        if let Some(id) = &id {
            if !headers
                .iter()
                .any(|(k, _)| k.eq_ignore_ascii_case(outbox_core::sink::HEADER_MESSAGE_ID))
            {
                headers.push((outbox_core::sink::HEADER_MESSAGE_ID.to_string(), id.clone()));
            }
        }
        let fallback_type = d
            .properties
            .kind()
            .as_ref()
            .map(|t| t.as_str().to_string())
            .unwrap_or_else(|| self.cfg.queue.clone());
        let position = format!("{generation}:{}", d.delivery_tag);
        let mut message = InboxMessage::from_broker(
            &self.cfg.name,
            &d.data,
            headers,
            position_id(
                &format!("amqp:{}", self.cfg.queue),
                id.as_deref().unwrap_or(&position),
            ),
            &fallback_type,
            None,
        );
        message.source_position = Some(position);
        Delivery {
            message,
            ack: AckToken(AckInner::Amqp {
                generation,
                tag: d.delivery_tag,
            }),
        }
    }
}

#[async_trait]
impl Source for AmqpSource {
    fn name(&self) -> &str {
        &self.cfg.name
    }

    fn describe(&self) -> String {
        format!(
            "RabbitMQ queue {} at {} (prefetch {})",
            self.cfg.queue, self.cfg.server.display, self.prefetch
        )
    }

    /// Closes any channel this source had (its unacknowledged deliveries go back to their
    /// places in the queue) and starts consuming on a new one.
    async fn recover(&mut self) -> Result<()> {
        self.reopen().await
    }

    async fn fetch(&mut self, max: usize) -> Result<Vec<Delivery>> {
        if self.open.is_none() {
            self.reopen().await?;
        }
        let mut out = Vec::new();
        let mut broken = None;
        if let Some(open) = self.open.as_mut() {
            let mut got = Vec::new();
            while got.len() < max.max(1) {
                let wait = if got.is_empty() {
                    FIRST_DELIVERY_WAIT
                } else {
                    NEXT_DELIVERY_WAIT
                };
                match tokio::time::timeout(wait, open.consumer.next()).await {
                    Err(_) => break,
                    Ok(Some(Ok(d))) => got.push(d),
                    Ok(Some(Err(e))) => {
                        broken = Some(e.to_string());
                        break;
                    }
                    Ok(None) => {
                        broken = Some("the consumer was cancelled".to_string());
                        break;
                    }
                }
            }
            let generation = open.generation;
            out = got.iter().map(|d| self.delivery(d, generation)).collect();
        }
        if let Some(why) = broken {
            // The channel is gone and the broker requeues what it had not acknowledged; what
            // came before the break is still handed out (its acknowledgements will fail, and
            // the inbox absorbs the redelivery).
            warn!(source = %self.cfg.name, error = %why, "the channel broke; reconnecting");
            self.open = None;
            if out.is_empty() {
                return Err(amqp_error("consuming", why));
            }
        }
        Ok(out)
    }

    /// Acknowledges each delivery of `acks` on the channel it came on (never several at once:
    /// only what committed is acknowledged). Tokens of a channel since closed are skipped: their
    /// messages were requeued and come again.
    async fn ack(&mut self, acks: Vec<AckToken>) -> Result<()> {
        let Some(open) = self.open.as_ref() else {
            return Err(amqp_error(
                "acknowledging",
                "the channel closed; the broker delivers those messages again",
            ));
        };
        let current = open.generation;
        let mut stale = 0usize;
        let sends = acks.iter().filter_map(|a| match a.0 {
            AckInner::Amqp { generation, tag } if generation == current => {
                Some(open.channel.basic_ack(tag, BasicAckOptions::default()))
            }
            AckInner::Amqp { .. } => {
                stale += 1;
                None
            }
            #[allow(unreachable_patterns)]
            _ => None,
        });
        let sends: Vec<_> = sends.collect();
        let results = tokio::time::timeout(
            self.cfg.server.ack_timeout,
            futures::future::join_all(sends),
        )
        .await
        .map_err(|_| amqp_error("acknowledging", "no answer"))?;
        let failed = results.iter().filter(|r| r.is_err()).count();
        if failed + stale > 0 {
            info!(source = %self.cfg.name, failed, stale, "some acknowledgements did not reach the broker");
            return Err(amqp_error(
                "acknowledging",
                format!(
                    "{} acknowledgements failed; the broker delivers them again",
                    failed + stale
                ),
            ));
        }
        Ok(())
    }

    /// RabbitMQ keeps a message until it is acknowledged (or a queue TTL or length limit
    /// drops it), and the source cannot read a queue's arguments: unknown.
    async fn retention(&mut self) -> Result<SourceRetention> {
        Ok(SourceRetention::Unknown)
    }
}

/// This source's entry in [`super::SOURCES`].
pub(super) const KIND: super::SourceKind = super::SourceKind {
    schemes: &["amqp", "amqps"],
    listed: "amqp://",
    open: |url, options| {
        super::boxed(async move {
            AmqpSource::connect(AmqpSourceConfig::from_url(url)?, options.batch).await
        })
    },
    check: |url| AmqpSourceConfig::from_url(url).map(|_| ()),
};

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn url_options_parse_and_credentials_stay_out() {
        let c = AmqpSourceConfig::from_url(
            "amqp://app:hunter2@127.0.0.1:5672/%2f?queue=orders&heartbeat=10&ack_timeout=2s",
        )
        .unwrap();
        assert_eq!(
            (c.queue.as_str(), c.name.as_str()),
            ("orders", "amqp:orders")
        );
        assert_eq!(c.server.ack_timeout, Duration::from_secs(2));
        assert_eq!(c.server.connection_name, "outbox inbox");
        assert!(!format!("{c:?}").contains("hunter2"));
        for (url, says) in [
            ("amqp://h/%2f", "name the queue"),
            ("amqp://h/%2f?queue=q&exchange=x", "`exchange` is not known"),
            ("amqp://h/%2f?queue=q&heartbeat=soon", "heartbeat=`soon`"),
        ] {
            let e = AmqpSourceConfig::from_url(url).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Config);
            assert!(e.to_string().contains(says), "{url}: {e}");
        }
        let e = AmqpSourceConfig::from_url("amqp://app:hunter2@h/%2f?queue=q&bogus=1")
            .unwrap_err()
            .to_string();
        assert!(!e.contains("hunter2"), "{e}");
    }
}
