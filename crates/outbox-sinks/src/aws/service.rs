//! What the one AWS batch sink ([`super::AwsSink`]) needs of a service: how a destination
//! reads, how it resolves to the address a batch call takes, and the batch call itself. SQS
//! and SNS each implement [`Service`]; everything else (chunking, concurrency, deadlines,
//! error classes) is the sink's and the same for both.

use async_trait::async_trait;
use aws_config::SdkConfig;
use outbox_core::SinkError;

use super::batch::Entry;
use super::error::Failure;

/// One AWS service the batch sink publishes to. Public only so that `SqsSink` and `SnsSink`
/// can name it; it lives in a private module, so no other crate implements it.
#[async_trait]
pub trait Service: Send + Sync + Sized + 'static {
    /// The URL scheme, the sink's name and the prefix of its errors: `sqs`, `sns`.
    const NAME: &'static str;
    /// What a destination names, in errors: `queue`, `topic`.
    const NOUN: &'static str;
    /// The batch call, in errors: `SendMessageBatch`, `PublishBatch`.
    const CALL: &'static str;

    /// A destination as read (a queue or topic, by name or address).
    type Target: Target;

    /// The service's clients over `sdk`. Makes no call.
    fn new(sdk: &SdkConfig) -> Self;

    /// The address a batch call to `target` takes (a queue URL, a topic ARN), looked up when
    /// the destination names it by name.
    async fn resolve(&self, target: &Self::Target) -> Result<String, SinkError>;

    /// The error of a [`Service::resolve`] of `target` that did not end within the ack timeout.
    fn resolve_timed_out(target: &Self::Target) -> SinkError;

    /// One batch call of `entries` (at most ten) to `address`.
    async fn send(&self, address: &str, entries: &[&Entry<'_>]) -> Result<Answer, CallError>;

    /// Told of every failed batch call to `target`, before its messages get the error (SQS
    /// forgets the URL of a queue that no longer exists).
    fn call_failed(&self, _target: &Self::Target, _failure: &Failure) {}
}

/// A rendered destination read as a queue or topic: by name or by its address (URL, ARN).
pub trait Target: Send + Sync + Sized {
    /// Reads a rendered destination; one no queue or topic can have is an invalid message.
    fn parse(destination: &str) -> Result<Self, SinkError>;

    /// The destination as rendered: how errors name it.
    fn rendered(&self) -> &str;

    /// Whether the queue or topic is FIFO (its name ends with `.fifo`, as both services
    /// require): the destination type's own answer, which the inbox reads too.
    fn is_fifo(&self) -> bool;
}

/// What a batch call's answer says of its entries, by entry id.
#[derive(Debug, Default)]
pub struct Answer {
    /// Entries the service took.
    pub ok: Vec<String>,
    /// Entries it refused.
    pub failed: Vec<Refusal>,
}

/// One refused entry of a batch answer.
#[derive(Debug)]
pub struct Refusal {
    /// The entry id.
    pub id: String,
    /// The AWS error code.
    pub code: String,
    /// The service's reason, if it gave one.
    pub message: Option<String>,
    /// Whether the sender is at fault (`SenderFault`).
    pub sender_fault: bool,
}

#[cfg(test)]
impl Refusal {
    /// A refusal of entry `0` (for tests of the error texts).
    pub(crate) fn of(code: &str, message: Option<&str>, sender_fault: bool) -> Self {
        Self {
            id: "0".into(),
            code: code.into(),
            message: message.map(str::to_string),
            sender_fault,
        }
    }
}

/// Why a batch call gave no answer.
#[derive(Debug)]
pub enum CallError {
    /// An entry could not be built (the SDK refused a value): the whole call is refused.
    Entry(SinkError),
    /// The call failed.
    Call(Failure),
}

/// Defines, for one SDK (`$sdk`: `aws_sdk_sqs`, `aws_sdk_sns`), `request_entry` (the SDK's
/// batch entry `$entry` of an [`Entry`]: the body through the builder method `$body`,
/// `String` attributes, and on FIFO the key as group id and the message id as dedupe id) and
/// `refusal` (a failed entry of the answer as a [`Refusal`]). A macro because the two SDKs'
/// types have the same methods but are distinct types with no trait in common.
macro_rules! sdk_entries {
    ($service:literal, $sdk:ident, $entry:ident, $body:ident) => {
        /// The SDK entry of `e`: body, `String` attributes, and on FIFO the group and dedupe
        /// ids.
        fn request_entry(
            e: &$crate::aws::batch::Entry<'_>,
        ) -> Result<$sdk::types::$entry, outbox_core::SinkError> {
            let mut attributes = std::collections::HashMap::with_capacity(e.attributes.len());
            for (name, value) in &e.attributes {
                let v = $sdk::types::MessageAttributeValue::builder()
                    .data_type($crate::aws::attributes::STRING)
                    .string_value(value.clone())
                    .build()
                    .map_err(|err| {
                        outbox_core::SinkError::rejected(format!(
                            "{}: attribute `{name}`: {err}",
                            $service
                        ))
                    })?;
                attributes.insert(name.clone(), v);
            }
            let mut b = $sdk::types::$entry::builder()
                .id(e.id())
                .$body(e.body)
                .set_message_attributes(Some(attributes));
            if let Some(group) = e.group {
                b = b
                    .message_group_id(group)
                    .message_deduplication_id(e.envelope.id.to_string());
            }
            b.build().map_err(|err| {
                outbox_core::SinkError::rejected(format!(
                    "{}: building the batch entry: {err}",
                    $service
                ))
            })
        }

        /// A failed entry of a batch answer.
        fn refusal(f: &$sdk::types::BatchResultErrorEntry) -> $crate::aws::service::Refusal {
            $crate::aws::service::Refusal {
                id: f.id().to_string(),
                code: f.code().to_string(),
                message: f.message().map(str::to_string),
                sender_fault: f.sender_fault(),
            }
        }
    };
}
pub(crate) use sdk_entries;
