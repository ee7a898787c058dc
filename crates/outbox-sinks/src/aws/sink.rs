//! [`AwsSink`]: the SQS and SNS sink, batch calls of ten, up to 32 in flight, over a
//! [`Service`] that knows its destinations and its batch call.

use std::time::Duration;

use async_trait::async_trait;
use futures::future::join_all;
use outbox_core::{Envelope, Error, Sink, SinkError};

use super::batch::{
    answer_results, by_destination, call_slots, finish, send_chunks, target_chunks, Entry, Sent,
};
use super::config::AwsConfig;
use super::error::{call_error, entry_error, Class};
use super::service::{CallError, Service, Target};
use crate::registry::{Connecting, MakeScratch, OptionsIn, SinkKind};

/// The SQS or SNS sink (`S`: [`crate::sqs::SqsSink`], [`crate::sns::SnsSink`]). A message
/// counts as published once the batch call lists it as successful: the service has then
/// stored it (SQS redundantly; SNS for delivery to the topic's subscriptions).
///
/// - **Destination**: a queue or topic by name (resolved once to its URL or ARN) or by
///   address (used as it is); see the service's sink type.
/// - **Dedupe**: on a FIFO queue or topic (`….fifo`) `MessageDeduplicationId` is the message
///   id, so a republish within the service's five-minute window is dropped. Standard ones have
///   no dedupe of their own: the id travels in the `outbox-message-id` attribute.
/// - **Order**: on FIFO `MessageGroupId` is the key (aggregate id), so a key's messages are
///   delivered in order. Standard queues and topics order nothing.
/// - **Headers**: message attributes of type `String` (see [`crate::aws::attributes`]).
/// - **Size**: 256 KiB per message and per call, attributes included (SQS: up to 1 MiB with
///   `?max_message_bytes=`).
pub struct AwsSink<S: Service> {
    service: S,
    ack_timeout: Duration,
    max_message_bytes: usize,
    /// Batch calls in flight, shared by every publish call (see `call_slots`).
    slots: tokio::sync::Semaphore,
}

impl<S: Service> AwsSink<S> {
    /// A sink with the SDK configured from `cfg` and the standard credentials chain. Makes no
    /// call: a service that is down at start fails the first publishes (retried), not the
    /// relay.
    pub async fn connect(cfg: AwsConfig) -> Result<Self, Error> {
        let sdk = cfg.sdk_config().await?;
        Ok(Self {
            slots: call_slots(),
            service: S::new(&sdk),
            ack_timeout: cfg.ack_timeout,
            max_message_bytes: cfg.max_message_bytes,
        })
    }

    /// The service's clients (for the service's own accessors).
    pub(crate) fn service(&self) -> &S {
        &self.service
    }

    /// One batch call of `entries` to `address`, the address of `target`.
    async fn send(&self, target: &S::Target, address: &str, entries: Vec<&Entry<'_>>) -> Sent {
        let label = target.rendered();
        match self.service.send(address, &entries).await {
            Ok(answer) => Sent::Answered(answer_results(
                &entries,
                answer.ok.iter().map(String::as_str),
                answer
                    .failed
                    .iter()
                    .map(|r| (r.id.as_str(), entry_error::<S>(label, r))),
                S::NAME,
            )),
            Err(CallError::Entry(err)) => Sent::Failed(Class::Refused, err),
            Err(CallError::Call(f)) => {
                self.service.call_failed(target, &f);
                Sent::Failed(f.class, call_error::<S>(label, &f))
            }
        }
    }
}

#[async_trait]
impl<S: Service> Sink for AwsSink<S> {
    fn name(&self) -> &str {
        S::NAME
    }

    fn ack_timeout(&self) -> Option<Duration> {
        Some(self.ack_timeout)
    }

    async fn publish(&self, batch: &[Envelope]) -> Vec<Result<(), SinkError>> {
        // The whole call, lookups included, ends by the ack timeout: the relay gives it that
        // long and a quarter more.
        let deadline = tokio::time::Instant::now() + self.ack_timeout;
        let mut results: Vec<Option<Result<(), SinkError>>> = vec![None; batch.len()];
        // Per destination: its target and the entries that pass the checks (which need no
        // call: whether a queue or topic is FIFO is in its name), then the addresses of the
        // targets that have any, names resolved concurrently.
        let mut prepared = Vec::new();
        for (destination, indices) in by_destination(batch) {
            let target = match S::Target::parse(destination) {
                Ok(t) => t,
                Err(err) => {
                    for i in indices {
                        results[i] = Some(Err(err.clone()));
                    }
                    continue;
                }
            };
            let fifo = target.is_fifo();
            let mut entries = Vec::with_capacity(indices.len());
            for i in indices {
                match Entry::prepare(S::NAME, i, &batch[i], fifo, self.max_message_bytes) {
                    Ok(e) => entries.push(e),
                    Err(err) => results[i] = Some(Err(err)),
                }
            }
            if !entries.is_empty() {
                prepared.push((target, entries));
            }
        }
        let addresses = join_all(prepared.iter().map(|(target, _)| async move {
            tokio::time::timeout_at(deadline, self.service.resolve(target))
                .await
                .map_err(|_| S::resolve_timed_out(target))?
        }))
        .await;
        let mut targets = Vec::new();
        for ((target, entries), address) in prepared.into_iter().zip(addresses) {
            match address {
                Ok(address) => targets.push((target, address, entries)),
                Err(err) => {
                    for e in &entries {
                        results[e.index] = Some(Err(err.clone()));
                    }
                }
            }
        }
        // Every chunk of every target, all sent with up to 32 calls in flight.
        let calls = target_chunks(
            targets
                .iter()
                .map(|(target, address, entries)| ((target, address.as_str()), entries.as_slice())),
            self.max_message_bytes,
        );
        let sent = send_chunks(
            calls,
            |(target, address), chunk| self.send(target, address, chunk),
            &self.slots,
            deadline,
        )
        .await;
        finish(results, sent, S::NAME, self.ack_timeout)
    }
}

/// The registry entry of the sink over `S`: its scheme in the query form `S::NAME://?…`, and
/// `scratch`, the service's own reader.
pub(crate) const fn kind<S: Service>(
    schemes: &'static [&'static str],
    listed: &'static [&'static str],
    scratch: MakeScratch,
) -> SinkKind {
    SinkKind {
        schemes,
        listed,
        options: OptionsIn::Query,
        connect: connect::<S>,
        check: |url| Ok(Some(AwsConfig::from_url(S::NAME, url)?.ack_timeout)),
        scratch: Some(scratch),
    }
}

/// Parses an `sqs://` or `sns://` URL and connects; see [`SinkKind::connect`].
fn connect<S: Service>(url: &str) -> Connecting<'_> {
    crate::registry::boxed(async move {
        AwsSink::<S>::connect(AwsConfig::from_url(S::NAME, url)?).await
    })
}
