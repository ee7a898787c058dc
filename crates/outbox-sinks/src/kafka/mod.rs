//! Kafka sink: an idempotent librdkafka producer with `acks=all` that keeps each key's order itself.

mod config;
mod error;
mod reader;
mod sink;

pub use config::KafkaConfig;
pub(crate) use reader::scratch;
pub use reader::{create_topic, delete_topic, KafkaReader};
pub use sink::KafkaSink;
