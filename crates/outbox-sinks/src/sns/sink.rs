//! [`SnsSink`]: publishes envelopes with `PublishBatch`, up to 32 calls of ten in flight.

use std::collections::HashMap;
use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_sns::types::{MessageAttributeValue, PublishBatchRequestEntry};
use futures::future::join_all;
use outbox_core::{Envelope, Error, Sink, SinkError};
use tokio::sync::OnceCell;

use super::config::{SnsConfig, TopicRef};
use super::error::{call_error, entry_error, identity_error};
use crate::aws::attributes::STRING;
use crate::aws::batch::{
    answer_results, by_destination, call_slots, finish, send_chunks, target_chunks, Entry, Sent,
};
use crate::aws::config::DEFAULT_MAX_MESSAGE_BYTES;
use crate::aws::error::{call_failure, Class};

/// SNS sink. A message counts as published once `PublishBatch` lists it as successful: SNS has
/// then stored it for delivery to the topic's subscriptions.
///
/// - **Destination**: a topic name (its ARN built from the region and the caller's account,
///   read once with STS `GetCallerIdentity`) or a topic ARN (used as it is).
/// - **Dedupe**: on a FIFO topic (`….fifo`) `MessageDeduplicationId` is the message id (SNS
///   drops a republish within five minutes). Standard topics have none: the id travels in the
///   `outbox-message-id` attribute.
/// - **Order**: on a FIFO topic `MessageGroupId` is the key; standard topics order nothing.
/// - **Headers**: message attributes of type `String` (see [`crate::aws::attributes`]); with
///   raw message delivery an SQS subscriber gets them as SQS message attributes.
/// - **Size**: 256 KiB per message and per call, attributes included.
pub struct SnsSink {
    client: aws_sdk_sns::Client,
    sts: aws_sdk_sts::Client,
    region: String,
    ack_timeout: Duration,
    /// (partition, account) of the credentials, read once, for ARNs of topics named by name.
    identity: OnceCell<(String, String)>,
    /// Batch calls in flight, shared by every publish call (see `call_slots`).
    slots: tokio::sync::Semaphore,
}

impl SnsSink {
    /// A sink with the SDK configured from `cfg` and the standard credentials chain. Makes no
    /// call: a service that is down at start fails the first publishes (retried), not the
    /// relay.
    pub async fn connect(cfg: SnsConfig) -> Result<Self, Error> {
        let sdk = cfg.sdk_config().await?;
        Ok(Self {
            slots: call_slots(),
            client: aws_sdk_sns::Client::new(&sdk),
            sts: aws_sdk_sts::Client::new(&sdk),
            region: sdk.region().map(|r| r.to_string()).unwrap_or_default(),
            ack_timeout: cfg.ack_timeout,
            identity: OnceCell::new(),
        })
    }

    /// The SDK client (for tests, readers and tools beside the sink).
    pub fn client(&self) -> &aws_sdk_sns::Client {
        &self.client
    }

    /// The ARN of the topic `topic` names. Whether the topic exists is learnt from the
    /// publish itself (`NotFound`), so the relay needs no permission beyond `sns:Publish`.
    async fn topic_arn(&self, topic: &TopicRef) -> Result<String, SinkError> {
        let name = match topic {
            TopicRef::Arn(arn) => return Ok(arn.clone()),
            TopicRef::Name(name) => name,
        };
        let (partition, account) = self
            .identity
            .get_or_try_init(|| async {
                let out = self
                    .sts
                    .get_caller_identity()
                    .send()
                    .await
                    .map_err(|e| identity_error(&call_failure(&e)))?;
                let account = out.account().unwrap_or_default().to_string();
                let partition = out
                    .arn()
                    .and_then(|arn| arn.split(':').nth(1))
                    .unwrap_or("aws")
                    .to_string();
                if account.is_empty() {
                    return Err(SinkError::rejected(
                        "sns: STS GetCallerIdentity returned no account",
                    ));
                }
                Ok((partition, account))
            })
            .await?;
        Ok(format!(
            "arn:{partition}:sns:{}:{account}:{name}",
            self.region
        ))
    }

    /// One `PublishBatch` of `entries` to `arn`.
    async fn send(&self, topic: &TopicRef, arn: &str, entries: Vec<&Entry<'_>>) -> Sent {
        let label = topic_label(topic);
        let mut request = Vec::with_capacity(entries.len());
        for e in &entries {
            match request_entry(e) {
                Ok(r) => request.push(r),
                Err(err) => return Sent::Failed(Class::Refused, err),
            }
        }
        match self
            .client
            .publish_batch()
            .topic_arn(arn)
            .set_publish_batch_request_entries(Some(request))
            .send()
            .await
        {
            Ok(out) => Sent::Answered(answer_results(
                &entries,
                out.successful().iter().filter_map(|s| s.id()),
                out.failed().iter().map(|f| {
                    (
                        f.id(),
                        entry_error(label, f.code(), f.message(), f.sender_fault()),
                    )
                }),
                "sns",
            )),
            Err(e) => {
                let f = call_failure(&e);
                Sent::Failed(f.class, call_error(label, &f))
            }
        }
    }
}

/// How errors name a topic: as the destination rendered it.
fn topic_label(topic: &TopicRef) -> &str {
    match topic {
        TopicRef::Name(n) => n,
        TopicRef::Arn(a) => a,
    }
}

/// The SDK entry of `e`: body, `String` attributes, and on FIFO the group and dedupe ids.
fn request_entry(e: &Entry<'_>) -> Result<PublishBatchRequestEntry, SinkError> {
    let mut attributes = HashMap::with_capacity(e.attributes.len());
    for (name, value) in &e.attributes {
        let v = MessageAttributeValue::builder()
            .data_type(STRING)
            .string_value(value.clone())
            .build()
            .map_err(|err| SinkError::rejected(format!("sns: attribute `{name}`: {err}")))?;
        attributes.insert(name.clone(), v);
    }
    let mut b = PublishBatchRequestEntry::builder()
        .id(e.id())
        .message(e.body)
        .set_message_attributes(Some(attributes));
    if let Some(group) = e.group {
        b = b
            .message_group_id(group)
            .message_deduplication_id(e.envelope.id.to_string());
    }
    b.build()
        .map_err(|err| SinkError::rejected(format!("sns: building the batch entry: {err}")))
}

#[async_trait]
impl Sink for SnsSink {
    fn name(&self) -> &str {
        "sns"
    }

    fn ack_timeout(&self) -> Option<Duration> {
        Some(self.ack_timeout)
    }

    async fn publish(&self, batch: &[Envelope]) -> Vec<Result<(), SinkError>> {
        // The whole call, lookups included, ends by the ack timeout: the relay gives it that
        // long and a quarter more.
        let deadline = tokio::time::Instant::now() + self.ack_timeout;
        let mut results: Vec<Option<Result<(), SinkError>>> = vec![None; batch.len()];
        // Per destination: its topic and the entries that pass the checks (which need no
        // call: whether a topic is FIFO is in its name), then the ARNs of the topics that
        // have any.
        let mut prepared = Vec::new();
        for (destination, indices) in by_destination(batch) {
            let topic = match TopicRef::parse(destination) {
                Ok(t) => t,
                Err(err) => {
                    for i in indices {
                        results[i] = Some(Err(err.clone()));
                    }
                    continue;
                }
            };
            let mut entries = Vec::with_capacity(indices.len());
            for i in indices {
                match Entry::prepare(
                    "sns",
                    i,
                    &batch[i],
                    topic.is_fifo(),
                    DEFAULT_MAX_MESSAGE_BYTES,
                ) {
                    Ok(e) => entries.push(e),
                    Err(err) => results[i] = Some(Err(err)),
                }
            }
            if !entries.is_empty() {
                prepared.push((topic, entries));
            }
        }
        let arns = join_all(prepared.iter().map(|(topic, _)| async move {
            tokio::time::timeout_at(deadline, self.topic_arn(topic))
                .await
                .map_err(|_| {
                    SinkError::unavailable(
                        "sns: STS GetCallerIdentity: no answer within the ack timeout",
                    )
                })?
        }))
        .await;
        let mut targets = Vec::new();
        for ((topic, entries), arn) in prepared.into_iter().zip(arns) {
            match arn {
                Ok(arn) => targets.push((topic, arn, entries)),
                Err(err) => {
                    for e in &entries {
                        results[e.index] = Some(Err(err.clone()));
                    }
                }
            }
        }
        let calls = target_chunks(
            targets
                .iter()
                .map(|(topic, arn, entries)| ((topic, arn.as_str()), entries.as_slice())),
            DEFAULT_MAX_MESSAGE_BYTES,
        );
        let sent = send_chunks(
            calls,
            |(topic, arn), chunk| self.send(topic, arn, chunk),
            &self.slots,
            deadline,
        )
        .await;
        finish(results, sent, "sns", self.ack_timeout)
    }
}
