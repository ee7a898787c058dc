//! [`NatsSink`]: publishes envelopes to JetStream with every acknowledgement in flight at once.

use std::str::FromStr;

use async_nats::jetstream::{self, message::PublishMessage};
use async_nats::{HeaderMap, HeaderName, HeaderValue};
use async_trait::async_trait;
use futures::future::join_all;
use outbox_core::{Envelope, Error, ErrorKind, Sink, SinkError};
use tracing::info;

use super::config::NatsConfig;
use super::error::classify;

/// JetStream sink. Sets `Nats-Msg-Id` to the message id, so a republish after a relay crash
/// inside the stream's duplicate window is dropped by the server.
pub struct NatsSink {
    js: jetstream::Context,
    client: async_nats::Client,
}

impl NatsSink {
    /// Connects to the server. If it is down, the client keeps reconnecting in the background
    /// and publishes fail (and are retried) until it is back, rather than failing the relay.
    pub async fn connect(cfg: NatsConfig) -> Result<Self, Error> {
        let client = async_nats::ConnectOptions::new()
            .retry_on_initial_connect()
            .connection_timeout(std::time::Duration::from_secs(5))
            .event_callback(|event| async move {
                info!(sink = "nats", %event, "nats connection event");
            })
            .connect(&cfg.url)
            .await
            .map_err(|e| {
                Error::with_source(
                    ErrorKind::Connection,
                    format!(
                        "nats: cannot connect to {}",
                        outbox_core::redact::url(&cfg.url)
                    ),
                    e,
                )
            })?;
        let js = jetstream::context::ContextBuilder::new()
            .timeout(cfg.ack_timeout)
            .build(client.clone());
        Ok(Self { js, client })
    }

    /// The underlying client (for tests and the benchmark's consumer).
    pub fn client(&self) -> &async_nats::Client {
        &self.client
    }

    fn headers(e: &Envelope) -> Result<HeaderMap, SinkError> {
        let mut h = HeaderMap::new();
        for (k, v) in &e.headers {
            let name = HeaderName::from_str(k).map_err(|_| {
                SinkError::permanent(format!("nats: header name `{k}` is not valid in NATS"))
            })?;
            if v.contains(['\r', '\n']) {
                return Err(SinkError::permanent(format!(
                    "nats: header `{k}` contains a line break"
                )));
            }
            h.insert(name, HeaderValue::from(v.as_str()));
        }
        Ok(h)
    }
}

#[async_trait]
impl Sink for NatsSink {
    fn name(&self) -> &str {
        "nats"
    }

    async fn publish(&self, batch: &[Envelope]) -> Vec<Result<(), SinkError>> {
        // Send everything first, then wait for all acknowledgements together: one round trip
        // for the whole call instead of one per message.
        let mut pending = Vec::with_capacity(batch.len());
        for e in batch {
            let sent = match Self::headers(e) {
                Ok(headers) => {
                    let msg = PublishMessage::build()
                        .payload(bytes::Bytes::copy_from_slice(e.payload.as_bytes()))
                        .headers(headers)
                        .message_id(e.id.to_string());
                    self.js
                        .send_publish(e.destination.clone(), msg)
                        .await
                        .map_err(|err| {
                            if matches!(
                                err.kind(),
                                async_nats::jetstream::context::PublishErrorKind::Other
                            ) {
                                SinkError::permanent(format!(
                                    "nats: subject `{}` is not valid: {err}",
                                    e.destination
                                ))
                            } else {
                                classify(&e.destination, &err)
                            }
                        })
                }
                Err(err) => Err(err),
            };
            pending.push(sent);
        }
        let acks = join_all(pending.into_iter().enumerate().map(|(i, sent)| async move {
            match sent {
                Ok(ack) => ack
                    .await
                    .map(|_| ())
                    .map_err(|err| classify(&batch[i].destination, &err)),
                Err(e) => Err(e),
            }
        }))
        .await;
        acks
    }
}
