//! [`NatsSource`]: a durable JetStream pull consumer, acknowledged message by message after the
//! ingest committed.
//!
//! **Order across crashes.** JetStream redelivers an unacknowledged message only when its ack
//! wait runs out, and meanwhile hands newer messages to whoever pulls: a daemon restarted after
//! `kill -9` would ingest them before the messages its predecessor had fetched, and the handlers
//! of a key would see them out of order. So when the daemon starts (or a fetch broke off
//! half-way) with messages still unacknowledged, it lowers the consumer's `max_ack_pending` to
//! exactly that number: the server can then deliver nothing but those messages. Nothing is
//! fetched until that count was read and the limit set. Normally `max_ack_pending` is two
//! batches: the daemon has at most one batch out, and acknowledgements still in flight when it
//! fetches the next do not hold it up. It waits for their redelivery (at most the ack
//! wait), ingests them in stream order, acknowledges them, and only then restores the limit.

use std::time::Duration;

use async_nats::jetstream::{self, consumer};
use async_trait::async_trait;
use futures::StreamExt;
use outbox_core::options::{Bounds, QueryOptions, Role};
use outbox_core::{Error, ErrorKind, Result};
use outbox_sinks::nats::NatsConfig;
use tracing::{info, warn};

use super::{AckInner, AckToken, Delivery, Source, SourceRetention};
use crate::message::{position_id, InboxMessage};

/// Default durable consumer name.
pub const DEFAULT_DURABLE: &str = "outbox-inbox";

/// How long past its own expiry (none for a no-wait fetch) a pull request may stay unanswered
/// before it counts as lost: the server answers a healthy one within milliseconds.
const PULL_MARGIN: Duration = Duration::from_secs(10);
/// Default ack wait of a consumer the source creates.
pub const DEFAULT_ACK_WAIT: Duration = Duration::from_secs(30);

/// Where and how to consume.
#[derive(Debug, Clone)]
pub struct NatsSourceConfig {
    /// Server and credentials (from the URL without its source options).
    pub server: NatsConfig,
    /// The stream to consume.
    pub stream: String,
    /// The durable pull consumer (created when missing, explicit acks).
    pub durable: String,
    /// Only subjects matching this filter (a consumer created by the source only).
    pub subject: Option<String>,
    /// Ack wait of a consumer the source creates: how long a message fetched by a daemon that
    /// died waits before it is delivered again.
    pub ack_wait: Duration,
    /// The `source` column: `nats:<stream>` unless given.
    pub name: String,
}

impl NatsSourceConfig {
    /// Parses `nats://[user:pass@]host:port?stream=S[&durable=D][&subject=F][&ack_wait=30s]
    /// [&name=N]`.
    pub fn from_url(url: &str) -> Result<Self> {
        // The sink's options (TLS, credentials) mean the same here.
        let known: Vec<&str> = ["stream", "durable", "subject", "ack_wait", "name"]
            .into_iter()
            .chain(outbox_sinks::nats::OPTIONS.iter().copied())
            .collect();
        let (base, o) = QueryOptions::from_url(Role::Source, url, &known)?;
        let server = NatsConfig::from_options(base, &o)?;
        let stream = o.str("stream");
        let durable = o
            .non_empty("durable")?
            .unwrap_or(DEFAULT_DURABLE)
            .to_string();
        let subject = o.non_empty("subject")?.map(str::to_string);
        let ack_wait = o
            .duration("ack_wait", Bounds::TIMEOUT)?
            .unwrap_or(DEFAULT_ACK_WAIT);
        let name = o.non_empty("name")?;
        let stream = stream.filter(|s| !s.is_empty()).ok_or_else(|| {
            Error::config(format!(
                "source `{}`: name the stream, e.g. nats://127.0.0.1:4222?stream=ORDERS",
                outbox_core::redact::url(url)
            ))
        })?;
        Ok(Self {
            server,
            name: name.map_or_else(|| format!("nats:{stream}"), str::to_string),
            stream: stream.to_string(),
            durable,
            subject,
            ack_wait,
        })
    }
}

/// A durable JetStream pull consumer as an inbox source.
pub struct NatsSource {
    cfg: NatsSourceConfig,
    client: async_nats::Client,
    js: jetstream::Context,
    consumer: consumer::PullConsumer,
    batch: usize,
    /// Messages a predecessor (or a broken fetch) left unacknowledged that must come back
    /// before anything newer; `None` outside recovery.
    recovering: Option<usize>,
    /// In recovery: the last stream sequence the consumer had delivered when the pending count
    /// was read. Anything above it is new, not a redelivery, and must wait.
    recovery_ceiling: u64,
    /// The pending count must be read (and the limit set) before the next fetch: a check
    /// that failed is not a licence to fetch.
    must_check: bool,
}

fn nats_error(what: &str, e: impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::Connection, format!("nats source: {what}: {e}"))
}

impl NatsSource {
    /// Connects, and creates the durable consumer when it does not exist (explicit acks,
    /// unlimited deliveries, `max_ack_pending` = two batches). The server may be down: the client
    /// keeps reconnecting, and fails after a few seconds only when it never answered.
    pub async fn connect(cfg: NatsSourceConfig, batch: usize) -> Result<Self> {
        let client = cfg
            .server
            .connect_options()
            .retry_on_initial_connect()
            .connection_timeout(Duration::from_secs(5))
            .connect(&cfg.server.url)
            .await
            .map_err(|e| nats_error("connecting", e))?;
        let js = jetstream::new(client.clone());
        let stream = tokio::time::timeout(Duration::from_secs(30), js.get_stream(&cfg.stream))
            .await
            .map_err(|_| nats_error("no answer from the server", "30 s"))?
            .map_err(|e| {
                Error::config(format!(
                    "nats source: stream `{}`: {e} (create it first; the source only makes its \
                     consumer)",
                    cfg.stream
                ))
            })?;
        let batch = batch.max(1);
        let consumer: consumer::PullConsumer = stream
            .get_or_create_consumer(
                &cfg.durable,
                consumer::pull::Config {
                    durable_name: Some(cfg.durable.clone()),
                    ack_policy: consumer::AckPolicy::Explicit,
                    ack_wait: cfg.ack_wait,
                    max_deliver: -1,
                    max_ack_pending: i64::try_from(batch * 2).unwrap_or(i64::MAX),
                    filter_subject: cfg.subject.clone().unwrap_or_default(),
                    ..Default::default()
                },
            )
            .await
            .map_err(|e| nats_error(&format!("consumer `{}`", cfg.durable), e))?;
        Ok(Self {
            cfg,
            client,
            js,
            consumer,
            batch,
            recovering: None,
            recovery_ceiling: 0,
            must_check: true,
        })
    }

    /// The consumer's configuration with `max_ack_pending` set to `n`, applied (JetStream
    /// updates a durable consumer created again with an editable field changed).
    async fn set_max_ack_pending(&mut self, n: usize) -> Result<()> {
        let mut info = self
            .consumer
            .info()
            .await
            .map_err(|e| nats_error("consumer info", e))?
            .clone();
        let want = i64::try_from(n.max(1)).unwrap_or(i64::MAX);
        if info.config.max_ack_pending == want {
            return Ok(());
        }
        info.config.max_ack_pending = want;
        let config = <consumer::pull::Config as consumer::FromConsumer>::try_from_consumer_config(
            info.config,
        )
        .map_err(|e| nats_error("consumer config", e))?;
        let stream = self
            .js
            .get_stream(&self.cfg.stream)
            .await
            .map_err(|e| nats_error("stream", e))?;
        self.consumer = stream
            .create_consumer(config)
            .await
            .map_err(|e| nats_error("updating max_ack_pending", e))?;
        Ok(())
    }

    /// Enters recovery when the consumer has unacknowledged messages (none of them ours: the
    /// daemon acknowledges every batch before it fetches the next).
    async fn check_pending(&mut self) -> Result<()> {
        self.must_check = true;
        let info = self
            .consumer
            .info()
            .await
            .map_err(|e| nats_error("consumer info", e))?;
        let (pending, delivered) = (info.num_ack_pending, info.delivered.stream_sequence);
        if pending == 0 {
            self.recovering = None;
            self.set_max_ack_pending(self.batch * 2).await?;
            self.must_check = false;
            return Ok(());
        }
        warn!(
            source = %self.cfg.name, pending,
            ack_wait = ?self.cfg.ack_wait,
            "messages fetched earlier were never acknowledged: nothing newer is taken until \
             they are delivered again (at most the ack wait) and ingested, in stream order"
        );
        self.set_max_ack_pending(pending).await?;
        self.recovering = Some(pending);
        self.recovery_ceiling = delivered;
        self.must_check = false;
        Ok(())
    }

    fn delivery(&self, m: async_nats::jetstream::Message) -> Result<(u64, Delivery)> {
        let seq = m
            .info()
            .map_err(|e| Error::new(ErrorKind::Malformed, format!("nats source: {e}")))?
            .stream_sequence;
        let headers = m
            .headers
            .as_ref()
            .map(|h| {
                h.iter()
                    .flat_map(|(k, vs)| {
                        vs.iter()
                            .map(move |v| (k.to_string(), v.as_str().to_string()))
                    })
                    .collect()
            })
            .unwrap_or_default();
        let position = seq.to_string();
        let mut message = InboxMessage::from_broker(
            &self.cfg.name,
            &m.payload,
            headers,
            position_id(&format!("nats:{}", self.cfg.stream), &position),
            m.subject.as_str(),
            None,
        );
        message.source_position = Some(position);
        Ok((
            seq,
            Delivery {
                message,
                ack: AckToken(AckInner::Nats(Box::new(m))),
            },
        ))
    }

    /// Reads one pull request to its end (a request left half-read would keep receiving
    /// messages nobody ingests: they would come back late, out of order).
    ///
    /// Bounded in time: a pull request sent just before the server restarts is never answered
    /// (the client keeps no timer for a no-wait fetch), and a daemon waiting on it forever would
    /// hold the source lock, so no standby could take over. Past the bound the request counts
    /// as broken off: an error, after which the next fetch first checks what is unacknowledged.
    async fn pull(&self, max: usize, expires: Option<Duration>) -> Result<Vec<(u64, Delivery)>> {
        let limit = expires.unwrap_or(Duration::ZERO) + PULL_MARGIN;
        match tokio::time::timeout(limit, self.pull_unbounded(max, expires)).await {
            Ok(r) => r,
            Err(_) => Err(nats_error(
                "fetch",
                format!("no answer to the pull request within {limit:?}"),
            )),
        }
    }

    async fn pull_unbounded(
        &self,
        max: usize,
        expires: Option<Duration>,
    ) -> Result<Vec<(u64, Delivery)>> {
        let mut out = Vec::new();
        let mut messages = match expires {
            None => self
                .consumer
                .fetch()
                .max_messages(max)
                .messages()
                .await
                .map_err(|e| nats_error("fetch", e))?,
            Some(d) => self
                .consumer
                .batch()
                .max_messages(max)
                .expires(d)
                .messages()
                .await
                .map_err(|e| nats_error("fetch", e))?,
        };
        while let Some(m) = messages.next().await {
            let m = m.map_err(|e| nats_error("fetch", e))?;
            out.push(self.delivery(m)?);
        }
        Ok(out)
    }
}

#[async_trait]
impl Source for NatsSource {
    fn name(&self) -> &str {
        &self.cfg.name
    }

    fn describe(&self) -> String {
        format!(
            "NATS JetStream stream {} (durable consumer {}) at {}",
            self.cfg.stream,
            self.cfg.durable,
            outbox_core::redact::url(&self.cfg.server.url)
        )
    }

    async fn recover(&mut self) -> Result<()> {
        self.check_pending().await
    }

    async fn fetch(&mut self, max: usize) -> Result<Vec<Delivery>> {
        if self.must_check {
            // Nothing is fetched until the consumer's unacknowledged messages are known and
            // only they can be delivered.
            self.check_pending().await?;
        }
        let result = match self.recovering {
            // Only the unacknowledged messages can be delivered now; they come once their ack
            // wait runs out, all within one ack wait of when the daemon started.
            Some(pending) => {
                self.pull(pending, Some(self.cfg.ack_wait + Duration::from_secs(5)))
                    .await
            }
            None => self.pull(max.min(self.batch), None).await,
        };
        match result {
            Ok(mut got) => {
                got.sort_by_key(|(seq, _)| *seq);
                if let Some(pending) = self.recovering {
                    // The pending count may include acknowledgements still on their way to the
                    // server (the previous batch's); once they land, the limit leaves room for
                    // new messages, which would then be ingested before the lost ones come
                    // back. Only redeliveries (at or below the delivered sequence read with the
                    // count) are taken; newer ones are left unacknowledged, so they come again
                    // after the ack wait, and the count is read again first.
                    let ceiling = self.recovery_ceiling;
                    let newer = got.iter().filter(|(seq, _)| *seq > ceiling).count();
                    if newer > 0 {
                        got.retain(|(seq, _)| *seq <= ceiling);
                        info!(source = %self.cfg.name, newer, ceiling,
                              "new messages came during recovery; left for redelivery, in order");
                        self.must_check = true;
                    }
                    info!(source = %self.cfg.name, pending, redelivered = got.len(),
                          "unacknowledged messages delivered again");
                    if got.is_empty() {
                        // Some may have left the stream (limits) and will never come back.
                        self.check_pending().await?;
                    }
                }
                Ok(got.into_iter().map(|(_, d)| d).collect())
            }
            Err(e) => {
                // Part of the request may have been delivered to us and lost: make sure it
                // comes back before anything newer (the next fetch checks first).
                self.must_check = true;
                Err(e)
            }
        }
    }

    async fn ack(&mut self, acks: Vec<AckToken>) -> Result<()> {
        // In recovery the server must have taken every acknowledgement before the pending
        // count is read again: acknowledgements it confirms. Otherwise plain ones, flushed.
        let confirm = self.recovering.is_some();
        let acks = acks.iter().filter_map(|a| match &a.0 {
            AckInner::Nats(m) if confirm => Some(futures::future::Either::Left(m.double_ack())),
            AckInner::Nats(m) => Some(futures::future::Either::Right(m.ack())),
            #[allow(unreachable_patterns)]
            _ => None,
        });
        let results = futures::future::join_all(acks).await;
        self.client
            .flush()
            .await
            .map_err(|e| nats_error("flushing acknowledgements", e))?;
        let failed = results.iter().filter(|r| r.is_err()).count();
        if self.recovering.is_some() {
            // The recovered messages are acknowledged: back to one batch at a time, unless
            // some are still out (checked before the next fetch).
            self.must_check = true;
        }
        if failed > 0 {
            return Err(nats_error(
                "acknowledging",
                format!("{failed} acknowledgements failed; the broker delivers them again"),
            ));
        }
        Ok(())
    }

    async fn retention(&mut self) -> Result<SourceRetention> {
        let mut stream = self
            .js
            .get_stream(&self.cfg.stream)
            .await
            .map_err(|e| nats_error("stream", e))?;
        let info = stream
            .info()
            .await
            .map_err(|e| nats_error("stream info", e))?;
        Ok(if info.config.max_age.is_zero() {
            SourceRetention::Unlimited
        } else {
            SourceRetention::For(info.config.max_age)
        })
    }
}

/// This source's entry in [`super::SOURCES`].
pub(super) const KIND: super::SourceKind = super::SourceKind {
    schemes: &["nats", "tls"],
    listed: "nats://",
    open: |url, options| {
        super::boxed(async move {
            NatsSource::connect(NatsSourceConfig::from_url(url)?, options.batch).await
        })
    },
    check: |url| NatsSourceConfig::from_url(url).map(|_| ()),
};

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn url_options_parse_and_credentials_stay_out() {
        let c = NatsSourceConfig::from_url(
            "nats://app:pw@127.0.0.1:4222?stream=ORDERS&durable=d&subject=orders.>&ack_wait=5s",
        )
        .unwrap();
        assert_eq!(c.stream, "ORDERS");
        assert_eq!(c.durable, "d");
        assert_eq!(c.subject.as_deref(), Some("orders.>"));
        assert_eq!(c.ack_wait, Duration::from_secs(5));
        assert_eq!(c.name, "nats:ORDERS");
        assert_eq!(c.server.url, "nats://127.0.0.1:4222");
        assert!(!format!("{c:?}").contains("pw"));
        assert!(
            NatsSourceConfig::from_url("nats://h:4222").is_err(),
            "no stream"
        );
        assert!(NatsSourceConfig::from_url("nats://h:4222?stream=S&bogus=1").is_err());
    }
}
