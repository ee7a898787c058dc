//! HTTP webhook sink: a POST per message or per batch, signed per Standard Webhooks
//! (`webhook-id`, `webhook-timestamp`, `webhook-signature`); a 2xx acknowledges.

mod config;
mod error;
mod reader;
pub mod sign;
mod sink;

pub use config::{
    HttpConfig, Mode, SigningKey, DEFAULT_ACK_TIMEOUT, DEFAULT_MAX_BATCH, DEFAULT_MAX_IN_FLIGHT,
    DESTINATION_PLACEHOLDER,
};
pub use reader::{
    Behaviour, HttpReader, HttpReceiver, IncomingRequest, ReceiverStats, DOWN_FILE_ENV,
};
pub use sink::{HttpSink, HEADER_DESTINATION};

/// This sink's entry in [`crate::SINKS`].
pub(crate) const KIND: crate::registry::SinkKind = crate::registry::SinkKind {
    schemes: &["http", "https"],
    listed: &["http://", "https://"],
    options: crate::registry::OptionsIn::Fragment,
    connect: connect_url,
    check: |url| Ok(Some(HttpConfig::from_url(url)?.ack_timeout)),
    scratch: Some(make_scratch),
};

fn connect_url(url: &str) -> crate::registry::Connecting<'_> {
    crate::registry::boxed(async move { HttpSink::connect(HttpConfig::from_url(url)?) })
}

fn make_scratch<'a>(
    url: &'a str,
    options: &'a crate::read::ScratchOptions,
) -> crate::registry::Making<'a> {
    Box::pin(async move { reader::scratch(url, options).await })
}
