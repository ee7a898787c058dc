//! Amazon SNS sink: the AWS batch sink ([`crate::aws::AwsSink`]) over [`SnsService`]
//! (`PublishBatch` of ten, many calls in flight; FIFO topics get the key as `MessageGroupId`
//! and the message id as `MessageDeduplicationId`), and its reader.

mod reader;
mod service;

pub use reader::{create_topic, subscribe_queue, SnsReader};
pub use service::{SnsService, TopicRef};

/// Options of an `sns://` URL; see [`crate::aws::AwsConfig`].
pub type SnsConfig = crate::aws::AwsConfig;

/// The SNS sink; see [`crate::aws::AwsSink`]. A destination is a topic name (its ARN built
/// from the region and the caller's account, read once with STS `GetCallerIdentity`) or a
/// topic ARN (used as it is).
pub type SnsSink = crate::aws::AwsSink<SnsService>;

/// This sink's entry in [`crate::SINKS`].
pub(crate) const KIND: crate::registry::SinkKind =
    crate::aws::kind::<SnsService>(&["sns"], &["sns://"], make_scratch);

fn make_scratch<'a>(
    url: &'a str,
    options: &'a crate::read::ScratchOptions,
) -> crate::registry::Making<'a> {
    Box::pin(async move { reader::scratch(url, options).await })
}
