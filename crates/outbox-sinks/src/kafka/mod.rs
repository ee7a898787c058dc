//! Kafka sink: an idempotent librdkafka producer with `acks=all` that keeps each key's order itself.

mod config;
mod error;
mod reader;
mod sink;

pub use config::{parse_brokers, KafkaConfig};
pub(crate) use reader::scratch;
pub use reader::{create_topic, delete_topic, record_headers, topic_partitions, KafkaReader};
pub use sink::{client_config, KafkaSink};
