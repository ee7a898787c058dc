//! RabbitMQ (AMQP 0-9-1) sink: persistent, mandatory publishes with publisher confirms, the
//! message id in `message_id`.

mod config;
mod error;
mod reader;
mod sink;

pub use config::{AmqpConfig, DEFAULT_ACK_TIMEOUT, DEFAULT_MAX_MESSAGE_SIZE, OPTIONS, URI_OPTIONS};
pub(crate) use reader::scratch;
pub use reader::{connect, declare_scratch, delivery_headers, AmqpReader};
pub use sink::AmqpSink;
