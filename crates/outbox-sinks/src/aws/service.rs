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

    /// A destination as read by [`Service::target`] (a queue or topic, by name or address).
    type Target: Send + Sync;

    /// The service's clients over `sdk`. Makes no call.
    fn new(sdk: &SdkConfig) -> Self;

    /// Reads a rendered destination; one no queue or topic can have is invalid.
    fn target(destination: &str) -> Result<Self::Target, SinkError>;

    /// How errors name `target`: as the destination rendered it.
    fn label(target: &Self::Target) -> &str;

    /// Whether `target` is FIFO (its name ends with `.fifo`, as both services require).
    fn is_fifo(target: &Self::Target) -> bool;

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

/// Why a batch call gave no answer.
#[derive(Debug)]
pub enum CallError {
    /// An entry could not be built (the SDK refused a value): the whole call is refused.
    Entry(SinkError),
    /// The call failed.
    Call(Failure),
}
