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
pub(crate) use reader::scratch;
pub use reader::{create_queue, reader_client, SqsReader};
pub use sink::SqsSink;
