//! Amazon SQS sink: `SendMessageBatch` of ten, many calls in flight; FIFO queues get the key as
//! `MessageGroupId` and the message id as `MessageDeduplicationId`.

mod config;
mod consumer;
mod error;
mod reader;
mod sink;

pub use crate::aws::attributes::PACKED_HEADERS;
pub use config::{QueueRef, SqsConfig};
pub use consumer::{call_error, message_headers, queue_url};
pub use reader::{create_queue, reader_client, SqsReader};
pub use sink::SqsSink;

/// This sink's entry in [`crate::SINKS`].
pub(crate) const KIND: crate::registry::SinkKind = crate::registry::SinkKind {
    schemes: &["sqs"],
    listed: &["sqs://"],
    options: crate::registry::OptionsIn::Query,
    connect: connect_url,
    check: |url| Ok(Some(SqsConfig::sqs_from_url(url)?.ack_timeout)),
    scratch: Some(make_scratch),
};

fn connect_url(url: &str) -> crate::registry::Connecting<'_> {
    crate::registry::boxed(async move { SqsSink::connect(SqsConfig::sqs_from_url(url)?).await })
}

fn make_scratch<'a>(
    url: &'a str,
    options: &'a crate::read::ScratchOptions,
) -> crate::registry::Making<'a> {
    Box::pin(async move { reader::scratch(url, options).await })
}
