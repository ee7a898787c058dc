//! MQTT sink (v5): QoS 1 publishes whose PUBACK is the acknowledgement, headers as user
//! properties.

mod config;
mod error;
mod reader;
mod sink;

pub use config::{MqttConfig, DEFAULT_ACK_TIMEOUT, DEFAULT_MAX_MESSAGE_SIZE, OPTIONS};
pub use reader::MqttReader;
pub use sink::MqttSink;

/// This sink's entry in [`crate::SINKS`].
pub(crate) const KIND: crate::registry::SinkKind = crate::registry::SinkKind {
    schemes: &["mqtt", "mqtts"],
    listed: &["mqtt://"],
    options: crate::registry::OptionsIn::Query,
    connect: connect_url,
    check: |url| Ok(Some(MqttConfig::from_url(url)?.ack_timeout)),
    scratch: Some(make_scratch),
};

fn connect_url(url: &str) -> crate::registry::Connecting<'_> {
    crate::registry::boxed(async move {
        let cfg = MqttConfig::from_url(url)?;
        // A first connection in the background; a short wait lets the first batch find it up.
        let wait = cfg.ack_timeout.min(std::time::Duration::from_secs(2));
        let sink = MqttSink::connect(cfg)?;
        sink.wait_connected(wait).await;
        Ok(sink)
    })
}

fn make_scratch<'a>(
    url: &'a str,
    options: &'a crate::read::ScratchOptions,
) -> crate::registry::Making<'a> {
    Box::pin(async move { reader::scratch(url, options).await })
}
