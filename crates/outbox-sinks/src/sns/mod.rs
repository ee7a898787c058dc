//! Amazon SNS sink: `PublishBatch` of ten, many calls in flight; FIFO topics get the key as
//! `MessageGroupId` and the message id as `MessageDeduplicationId`.

mod config;
mod error;
mod reader;
mod sink;

pub use config::{SnsConfig, TopicRef};
pub(crate) use reader::scratch;
pub use reader::{create_topic, subscribe_queue, SnsReader};
pub use sink::SnsSink;
