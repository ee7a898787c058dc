//! RabbitMQ (AMQP 0-9-1) sink: persistent, mandatory publishes with publisher confirms, the
//! message id in `message_id`.

mod config;
mod error;
mod reader;
mod sink;

pub use config::{AmqpConfig, DEFAULT_ACK_TIMEOUT, DEFAULT_MAX_MESSAGE_SIZE, OPTIONS, URI_OPTIONS};
pub use reader::{connect, declare_scratch, delivery_headers, AmqpReader};
pub use sink::AmqpSink;

/// This sink's entry in [`crate::SINKS`].
pub(crate) const KIND: crate::registry::SinkKind = crate::registry::SinkKind {
    schemes: &["amqp", "amqps"],
    listed: &["amqp://"],
    options: crate::registry::OptionsIn::Query,
    connect: connect_url,
    check: |url| Ok(Some(AmqpConfig::from_url(url)?.ack_timeout)),
    scratch: Some(make_scratch),
};

fn connect_url(url: &str) -> crate::registry::Connecting<'_> {
    crate::registry::boxed(async move { AmqpSink::connect(AmqpConfig::from_url(url)?).await })
}

fn make_scratch<'a>(
    url: &'a str,
    options: &'a crate::read::ScratchOptions,
) -> crate::registry::Making<'a> {
    Box::pin(async move { reader::scratch(url, options).await })
}
