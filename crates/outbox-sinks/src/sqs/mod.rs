//! Amazon SQS sink: the AWS batch sink ([`crate::aws::AwsSink`]) over [`SqsService`]
//! (`SendMessageBatch` of ten, many calls in flight; FIFO queues get the key as
//! `MessageGroupId` and the message id as `MessageDeduplicationId`), its reader, and what
//! other consumers of a queue share with it.

mod consumer;
mod reader;
mod service;

pub use crate::aws::attributes::PACKED_HEADERS;
pub use consumer::{call_error, message_headers, queue_url};
pub use reader::{create_queue, reader_client, SqsReader};
pub use service::{QueueRef, SqsService};

/// Options of an `sqs://` URL; see [`crate::aws::AwsConfig`].
pub type SqsConfig = crate::aws::AwsConfig;

/// The SQS sink; see [`crate::aws::AwsSink`]. A destination is a queue name (resolved to its
/// URL with `GetQueueUrl` once, then cached) or a queue URL (used as it is).
pub type SqsSink = crate::aws::AwsSink<SqsService>;

/// This sink's entry in [`crate::SINKS`].
pub(crate) const KIND: crate::registry::SinkKind =
    crate::aws::kind::<SqsService>(&["sqs"], &["sqs://"], make_scratch);

fn make_scratch<'a>(
    url: &'a str,
    options: &'a crate::read::ScratchOptions,
) -> crate::registry::Making<'a> {
    Box::pin(async move { reader::scratch(url, options).await })
}
