//! Amazon SNS sink: `PublishBatch` of ten, many calls in flight; FIFO topics get the key as
//! `MessageGroupId` and the message id as `MessageDeduplicationId`.

mod config;
mod error;
mod reader;
mod sink;

pub use config::{SnsConfig, TopicRef};
pub use reader::{create_topic, subscribe_queue, SnsReader};
pub use sink::SnsSink;

/// This sink's entry in [`crate::SINKS`].
pub(crate) const KIND: crate::registry::SinkKind = crate::registry::SinkKind {
    schemes: &["sns"],
    listed: &["sns://"],
    options: crate::registry::OptionsIn::Query,
    connect: connect_url,
    check: |url| Ok(Some(SnsConfig::sns_from_url(url)?.ack_timeout)),
    scratch: Some(make_scratch),
};

fn connect_url(url: &str) -> crate::registry::Connecting<'_> {
    crate::registry::boxed(async move { SnsSink::connect(SnsConfig::sns_from_url(url)?).await })
}

fn make_scratch<'a>(
    url: &'a str,
    options: &'a crate::read::ScratchOptions,
) -> crate::registry::Making<'a> {
    Box::pin(async move { reader::scratch(url, options).await })
}
