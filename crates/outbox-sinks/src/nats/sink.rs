//! [`NatsSink`]: publishes envelopes to JetStream with every acknowledgement in flight at once.

use std::str::FromStr;

use async_nats::jetstream::{self, message::PublishMessage};
use async_nats::{HeaderMap, HeaderName, HeaderValue};
use async_trait::async_trait;
use futures::future::join_all;
use outbox_core::{Envelope, Error, ErrorKind, Sink, SinkError};
use tracing::info;

use super::config::NatsConfig;
use super::denied::Denied;
use super::error::classify;

/// Acknowledgements the client may await at once (64 workers × a 10,000-row batch).
const MAX_ACKS_IN_FLIGHT: usize = 640_000;

/// A subject NATS accepts: dot-separated non-empty tokens, no whitespace or control
/// characters. Anything else can never be published: an invalid message.
fn valid_subject(subject: &str) -> Result<(), SinkError> {
    let ok = !subject.is_empty()
        && !subject.chars().any(|c| c.is_whitespace() || c.is_control())
        && subject.split('.').all(|t| !t.is_empty());
    if ok {
        Ok(())
    } else {
        Err(SinkError::invalid(format!(
            "nats: subject `{subject}` is not valid (empty token or whitespace)"
        )))
    }
}

/// JetStream sink. Sets `Nats-Msg-Id` to the message id, so a republish after a relay crash
/// inside the stream's duplicate window is dropped by the server.
pub struct NatsSink {
    js: jetstream::Context,
    client: async_nats::Client,
    ack_timeout: std::time::Duration,
    denied: Denied,
}

impl NatsSink {
    /// Connects to the server. If it is down, the client keeps reconnecting in the background
    /// and publishes fail (and are retried) until it is back, rather than failing the relay.
    ///
    /// A refused TLS handshake (a wrong CA, an expired certificate or one for another host) or
    /// refused credentials is not a server that is down: the first attempt reports it at once,
    /// as a configuration error naming the server and the cause, and the relay does not start
    /// (its messages stay pending).
    pub async fn connect(cfg: NatsConfig) -> Result<Self, Error> {
        if let Err(e) = cfg
            .connect_options()
            .connection_timeout(std::time::Duration::from_secs(5))
            .connect(&cfg.url)
            .await
        {
            use async_nats::ConnectErrorKind as K;
            // The client reports a certificate it refused as an I/O error of kind InvalidData
            // (rustls's own error inside); a refused connection or a reset stays an outage.
            let bad_certificate = matches!(e.kind(), K::Io)
                && std::error::Error::source(&e)
                    .and_then(|s| s.downcast_ref::<std::io::Error>())
                    .is_some_and(|io| io.kind() == std::io::ErrorKind::InvalidData);
            if bad_certificate
                || matches!(
                    e.kind(),
                    K::Tls | K::Authentication | K::AuthorizationViolation
                )
            {
                return Err(Error::with_source(
                    ErrorKind::Config,
                    format!(
                        "nats: cannot connect to {}: {}",
                        outbox_core::redact::url(&cfg.url),
                        outbox_core::redact::sanitize(&crate::error_chain(&e))
                    ),
                    e,
                ));
            }
        }
        let denied = Denied::default();
        let noted = denied.clone();
        let client = cfg
            .connect_options()
            .retry_on_initial_connect()
            .connection_timeout(std::time::Duration::from_secs(5))
            .event_callback(move |event| {
                // A denied publish is answered only here, never on its acknowledgement.
                if let async_nats::Event::ServerError(async_nats::ServerError::Other(text)) = &event
                {
                    noted.note(text);
                }
                async move {
                    info!(sink = "nats", %event, "nats connection event");
                }
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
        // Every worker of the relay shares this context; each keeps up to a batch (at most
        // 10,000) of acknowledgements in flight, so the client's default bound of 5,000 could
        // make a send wait for a slot its own unawaited acks hold.
        let js = jetstream::context::ContextBuilder::new()
            .timeout(cfg.ack_timeout)
            .max_ack_inflight(MAX_ACKS_IN_FLIGHT)
            .build(client.clone());
        Ok(Self {
            js,
            client,
            ack_timeout: cfg.ack_timeout,
            denied,
        })
    }

    /// The underlying client (for tests and the benchmark's consumer).
    pub fn client(&self) -> &async_nats::Client {
        &self.client
    }

    fn headers(e: &Envelope) -> Result<HeaderMap, SinkError> {
        let mut h = HeaderMap::new();
        for (k, v) in &e.headers {
            let name = HeaderName::from_str(k).map_err(|_| {
                SinkError::invalid(format!("nats: header name `{k}` is not valid in NATS"))
            })?;
            if v.contains(['\r', '\n']) {
                return Err(SinkError::invalid(format!(
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

    fn ack_timeout(&self) -> Option<std::time::Duration> {
        Some(self.ack_timeout)
    }

    async fn publish(&self, batch: &[Envelope]) -> Vec<Result<(), SinkError>> {
        // Send everything first, then wait for all acknowledgements together: one round trip
        // for the whole call instead of one per message.
        let mut pending = Vec::with_capacity(batch.len());
        for e in batch {
            let sent = match valid_subject(&e.destination).and_then(|()| Self::headers(e)) {
                Ok(headers) => {
                    let msg = PublishMessage::build()
                        // Shared with the claimed row, not copied.
                        .payload(e.payload.clone())
                        .headers(headers)
                        .message_id(e.id.to_string());
                    self.js
                        .send_publish(e.destination.clone(), msg)
                        .await
                        .map_err(|err| classify(&e.destination, &err, &self.denied))
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
                    .map_err(|err| classify(&batch[i].destination, &err, &self.denied)),
                Err(e) => Err(e),
            }
        }))
        .await;
        acks
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_subjects_are_invalid_messages() {
        assert!(valid_subject("orders.placed").is_ok());
        for bad in [
            "",
            "orders..placed",
            ".orders",
            "orders.",
            "order placed",
            "a\tb",
        ] {
            let e = valid_subject(bad).unwrap_err();
            assert_eq!(e.kind, outbox_core::SinkErrorKind::Invalid, "{bad:?}");
        }
    }
}
