//! Kafka sink: an idempotent librdkafka producer with `acks=all` that keeps each key's order itself.

mod config;
mod error;
mod reader;
mod sink;

pub use config::{parse_brokers, KafkaConfig};
pub use reader::{create_topic, delete_topic, record_headers, topic_partitions, KafkaReader};
pub use sink::{client_config, KafkaSink};

/// This sink's entry in [`crate::SINKS`].
pub(crate) const KIND: crate::registry::SinkKind = crate::registry::SinkKind {
    schemes: &["kafka"],
    listed: &["kafka://"],
    options: crate::registry::OptionsIn::Query,
    connect: connect_url,
    check: |url| Ok(Some(KafkaConfig::from_url(url)?.ack_timeout)),
    scratch: Some(make_scratch),
};

fn connect_url(url: &str) -> crate::registry::Connecting<'_> {
    crate::registry::boxed(async move { KafkaSink::connect(KafkaConfig::from_url(url)?) })
}

fn make_scratch<'a>(
    url: &'a str,
    options: &'a crate::read::ScratchOptions,
) -> crate::registry::Making<'a> {
    Box::pin(async move { reader::scratch(url, options).await })
}
