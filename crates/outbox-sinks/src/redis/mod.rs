//! Redis Streams sink: pipelined `XADD` (optionally trimmed with `MAXLEN ~`), the message id as
//! a field, and an optional dedupe window.

mod config;
mod error;
mod reader;
mod sink;

pub use config::{
    RedisConfig, RedisConnection, CONNECTION_OPTIONS, DEFAULT_ACK_TIMEOUT, DEFAULT_MAX_MESSAGE_SIZE,
};
pub use reader::RedisReader;
pub use sink::RedisSink;

/// This sink's entry in [`crate::SINKS`].
pub(crate) const KIND: crate::registry::SinkKind = crate::registry::SinkKind {
    schemes: &["redis", "rediss"],
    listed: &["redis://"],
    options: crate::registry::OptionsIn::Query,
    connect: connect_url,
    check: |url| Ok(Some(RedisConfig::from_url(url)?.ack_timeout)),
    scratch: Some(make_scratch),
};

fn connect_url(url: &str) -> crate::registry::Connecting<'_> {
    crate::registry::boxed(async move { RedisSink::connect(RedisConfig::from_url(url)?) })
}

fn make_scratch<'a>(
    url: &'a str,
    options: &'a crate::read::ScratchOptions,
) -> crate::registry::Making<'a> {
    Box::pin(async move { reader::scratch(url, options).await })
}
