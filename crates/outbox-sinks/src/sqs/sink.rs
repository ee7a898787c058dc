//! [`SqsSink`]: publishes envelopes with `SendMessageBatch`, up to 32 calls of ten in flight.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_sqs::types::{MessageAttributeValue, SendMessageBatchRequestEntry};
use futures::future::join_all;
use outbox_core::{Envelope, Error, Sink, SinkError};

use super::config::{QueueRef, SqsConfig};
use super::error::{call_error, entry_error, lookup_error};
use crate::aws::attributes::STRING;
use crate::aws::batch::{
    answer_results, by_destination, call_slots, finish, send_chunks, target_chunks, Entry, Sent,
};
use crate::aws::error::{call_failure, Class};

/// SQS sink. A message counts as published once `SendMessageBatch` lists it as successful:
/// SQS has then stored it redundantly.
///
/// - **Destination**: the rendered destination is a queue name (resolved to its URL with
///   `GetQueueUrl` once, then cached) or a queue URL (used as it is).
/// - **Dedupe**: on a FIFO queue (`….fifo`) `MessageDeduplicationId` is the message id, so a
///   republish within SQS's five-minute window is dropped. Standard queues have no dedupe of
///   their own: the id travels in the `outbox-message-id` attribute for consumers to dedupe.
/// - **Order**: on a FIFO queue `MessageGroupId` is the key (aggregate id), so a key's
///   messages are delivered in order. Standard queues order nothing.
/// - **Headers**: message attributes of type `String` (see [`crate::aws::attributes`]).
pub struct SqsSink {
    client: aws_sdk_sqs::Client,
    region: String,
    ack_timeout: Duration,
    max_message_bytes: usize,
    /// Queue name → URL, filled by `GetQueueUrl`. An entry is dropped when SQS says its queue
    /// does not exist, so a queue deleted and created again is found again.
    urls: Mutex<HashMap<String, String>>,
    /// Batch calls in flight, shared by every publish call (see `call_slots`).
    slots: tokio::sync::Semaphore,
}

impl SqsSink {
    /// A sink with the SDK configured from `cfg` and the standard credentials chain. Makes no
    /// call: a service that is down at start fails the first publishes (retried), not the
    /// relay.
    pub async fn connect(cfg: SqsConfig) -> Result<Self, Error> {
        let sdk = cfg.sdk_config().await?;
        Ok(Self {
            slots: call_slots(),
            client: aws_sdk_sqs::Client::new(&sdk),
            region: sdk.region().map(|r| r.to_string()).unwrap_or_default(),
            ack_timeout: cfg.ack_timeout,
            max_message_bytes: cfg.max_message_bytes,
            urls: Mutex::new(HashMap::new()),
        })
    }

    /// The SDK client (for tests, readers and tools beside the sink).
    pub fn client(&self) -> &aws_sdk_sqs::Client {
        &self.client
    }

    /// The URL of the queue `queue` names.
    async fn queue_url(&self, queue: &QueueRef) -> Result<String, SinkError> {
        let name = match queue {
            QueueRef::Url(url) => return Ok(url.clone()),
            QueueRef::Name(name) => name,
        };
        if let Some(url) = self.cached(name) {
            return Ok(url);
        }
        let out = self
            .client
            .get_queue_url()
            .queue_name(name)
            .send()
            .await
            .map_err(|e| lookup_error(name, &self.region, &call_failure(&e)))?;
        let url = out.queue_url().ok_or_else(|| {
            SinkError::rejected(format!("sqs: GetQueueUrl for `{name}` returned no URL"))
        })?;
        if let Ok(mut urls) = self.urls.lock() {
            urls.insert(name.clone(), url.to_string());
        }
        Ok(url.to_string())
    }

    fn cached(&self, name: &str) -> Option<String> {
        self.urls.lock().ok()?.get(name).cloned()
    }

    fn forget(&self, queue: &QueueRef) {
        if let (QueueRef::Name(name), Ok(mut urls)) = (queue, self.urls.lock()) {
            urls.remove(name);
        }
    }

    /// One `SendMessageBatch` of `entries` to `url`.
    async fn send(&self, queue: &QueueRef, url: &str, entries: Vec<&Entry<'_>>) -> Sent {
        let label = queue_label(queue);
        let mut request = Vec::with_capacity(entries.len());
        for e in &entries {
            match request_entry(e) {
                Ok(r) => request.push(r),
                Err(err) => return Sent::Failed(Class::Refused, err),
            }
        }
        match self
            .client
            .send_message_batch()
            .queue_url(url)
            .set_entries(Some(request))
            .send()
            .await
        {
            Ok(out) => Sent::Answered(answer_results(
                &entries,
                out.successful().iter().map(|s| s.id()),
                out.failed().iter().map(|f| {
                    (
                        f.id(),
                        entry_error(label, f.code(), f.message(), f.sender_fault()),
                    )
                }),
                "sqs",
            )),
            Err(e) => {
                let f = call_failure(&e);
                if f.class == Class::Missing {
                    self.forget(queue);
                }
                Sent::Failed(f.class, call_error(label, &f))
            }
        }
    }
}

/// How errors name a queue: as the destination rendered it.
fn queue_label(queue: &QueueRef) -> &str {
    match queue {
        QueueRef::Name(n) => n,
        QueueRef::Url(u) => u,
    }
}

/// The SDK entry of `e`: body, `String` attributes, and on FIFO the group and dedupe ids.
fn request_entry(e: &Entry<'_>) -> Result<SendMessageBatchRequestEntry, SinkError> {
    let mut attributes = HashMap::with_capacity(e.attributes.len());
    for (name, value) in &e.attributes {
        let v = MessageAttributeValue::builder()
            .data_type(STRING)
            .string_value(value.clone())
            .build()
            .map_err(|err| SinkError::rejected(format!("sqs: attribute `{name}`: {err}")))?;
        attributes.insert(name.clone(), v);
    }
    let mut b = SendMessageBatchRequestEntry::builder()
        .id(e.id())
        .message_body(e.body)
        .set_message_attributes(Some(attributes));
    if let Some(group) = e.group {
        b = b
            .message_group_id(group)
            .message_deduplication_id(e.envelope.id.to_string());
    }
    b.build()
        .map_err(|err| SinkError::rejected(format!("sqs: building the batch entry: {err}")))
}

#[async_trait]
impl Sink for SqsSink {
    fn name(&self) -> &str {
        "sqs"
    }

    fn ack_timeout(&self) -> Option<Duration> {
        Some(self.ack_timeout)
    }

    async fn publish(&self, batch: &[Envelope]) -> Vec<Result<(), SinkError>> {
        // The whole call, lookups included, ends by the ack timeout: the relay gives it that
        // long and a quarter more.
        let deadline = tokio::time::Instant::now() + self.ack_timeout;
        let mut results: Vec<Option<Result<(), SinkError>>> = vec![None; batch.len()];
        // Per destination: its queue and the entries that pass the checks (which need no
        // call: whether a queue is FIFO is in its name), then the URLs of the queues that
        // have any, names resolved concurrently.
        let mut prepared = Vec::new();
        for (destination, indices) in by_destination(batch) {
            let queue = match QueueRef::parse(destination) {
                Ok(q) => q,
                Err(err) => {
                    for i in indices {
                        results[i] = Some(Err(err.clone()));
                    }
                    continue;
                }
            };
            let mut entries = Vec::with_capacity(indices.len());
            for i in indices {
                match Entry::prepare("sqs", i, &batch[i], queue.is_fifo(), self.max_message_bytes) {
                    Ok(e) => entries.push(e),
                    Err(err) => results[i] = Some(Err(err)),
                }
            }
            if !entries.is_empty() {
                prepared.push((queue, entries));
            }
        }
        let urls = join_all(prepared.iter().map(|(queue, _)| async move {
            tokio::time::timeout_at(deadline, self.queue_url(queue))
                .await
                .map_err(|_| {
                    SinkError::unavailable(format!(
                        "sqs: GetQueueUrl for `{}`: no answer within the ack timeout",
                        queue.name()
                    ))
                })?
        }))
        .await;
        let mut targets = Vec::new();
        for ((queue, entries), url) in prepared.into_iter().zip(urls) {
            match url {
                Ok(url) => targets.push((queue, url, entries)),
                Err(err) => {
                    for e in &entries {
                        results[e.index] = Some(Err(err.clone()));
                    }
                }
            }
        }
        // Every chunk of every queue, all sent with up to 32 calls in flight.
        let calls = target_chunks(
            targets
                .iter()
                .map(|(queue, url, entries)| ((queue, url.as_str()), entries.as_slice())),
            self.max_message_bytes,
        );
        let sent = send_chunks(
            calls,
            |(queue, url), chunk| self.send(queue, url, chunk),
            &self.slots,
            deadline,
        )
        .await;
        finish(results, sent, "sqs", self.ack_timeout)
    }
}
