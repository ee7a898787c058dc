//! NATS JetStream sink: async publish with acknowledgements, `Nats-Msg-Id` dedupe.

mod config;
mod denied;
mod error;
mod reader;
mod sink;

pub use config::{NatsAuth, NatsConfig, OPTIONS};
pub use reader::{create_stream, NatsReader};
pub use sink::NatsSink;

/// This sink's entry in [`crate::SINKS`].
pub(crate) const KIND: crate::registry::SinkKind = crate::registry::SinkKind {
    schemes: &["nats", "tls"],
    listed: &["nats://"],
    options: crate::registry::OptionsIn::Query,
    connect: connect_url,
    check: |url| Ok(Some(NatsConfig::from_url(url)?.ack_timeout)),
    scratch: Some(make_scratch),
};

fn connect_url(url: &str) -> crate::registry::Connecting<'_> {
    crate::registry::boxed(async move { NatsSink::connect(NatsConfig::from_url(url)?).await })
}

fn make_scratch<'a>(
    url: &'a str,
    options: &'a crate::read::ScratchOptions,
) -> crate::registry::Making<'a> {
    Box::pin(async move { reader::scratch(url, options).await })
}
