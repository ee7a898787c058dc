//! Sinks for the outbox relay: one folder and one cargo feature per broker.
//!
//! Every sink implements [`outbox_core::Sink`]: it returns `Ok` for a message only after the
//! broker acknowledged it, publishes a whole call's messages concurrently, and passes the
//! message id to the broker's own dedupe where one exists.

#[cfg(feature = "amqp")]
pub mod amqp;
#[cfg(feature = "sqs")]
pub mod aws;
#[cfg(feature = "file")]
pub mod file;
#[cfg(feature = "http")]
pub mod http;
#[cfg(any(feature = "file", feature = "stdout"))]
mod jsonl;
#[cfg(feature = "kafka")]
pub mod kafka;
#[cfg(feature = "mqtt")]
pub mod mqtt;
#[cfg(feature = "nats")]
pub mod nats;
pub mod read;
#[cfg(feature = "redis")]
pub mod redis;
pub mod registry;
#[cfg(feature = "sns")]
pub mod sns;
#[cfg(feature = "sqs")]
pub mod sqs;
#[cfg(feature = "stdout")]
pub mod stdout;
#[cfg(any(feature = "file", feature = "stdout"))]
mod writer;

use std::sync::Arc;
use std::time::Duration;

use outbox_core::{Error, Sink};

use crate::registry::{OptionsIn, SinkKind};

/// Every sink this build has, one line per broker, in the order they are listed to users. The
/// only place a sink is named: `connect`, `check`, `ack_timeout`, `read::scratch` and the lists
/// of schemes all read it.
pub static SINKS: &[SinkKind] = &[
    #[cfg(feature = "nats")]
    nats::KIND,
    #[cfg(feature = "amqp")]
    amqp::KIND,
    #[cfg(feature = "redis")]
    redis::KIND,
    #[cfg(feature = "mqtt")]
    mqtt::KIND,
    #[cfg(feature = "sqs")]
    sqs::KIND,
    #[cfg(feature = "sns")]
    sns::KIND,
    #[cfg(feature = "kafka")]
    kafka::KIND,
    #[cfg(feature = "http")]
    http::KIND,
    #[cfg(feature = "file")]
    file::KIND,
    #[cfg(feature = "stdout")]
    stdout::KIND,
];

/// Connects the sink a URL names: `nats://host:4222`, `kafka://host:9092`, `amqp://host:5672/%2f`, `redis://host:6379`,
/// `mqtt://host:1883`, `sqs://?region=…`, `sns://?region=…`, `https://host/hook#secret=…`,
/// `file:path.jsonl`, `stdout:`.
/// Unknown schemes and sinks left out of this build are config errors that list what is
/// available.
pub async fn connect(url: &str) -> Result<Arc<dyn Sink>, Error> {
    match registry::find(SINKS, url) {
        Some(kind) => (kind.connect)(url).await,
        None => Err(unknown_scheme(url)),
    }
}

/// Checks the sink URL `url` without contacting anything or creating a file: its scheme is one
/// this build supports and its options parse. Commands run this before they connect to the
/// database, so a misspelt sink is reported first.
pub fn check(url: &str) -> Result<(), Error> {
    match registry::find(SINKS, url) {
        Some(kind) => (kind.check)(url).map(|_| ()),
        None => Err(unknown_scheme(url)),
    }
}

fn unknown_scheme(url: &str) -> Error {
    Error::config(format!(
        "sink `{}`: unknown or disabled sink scheme `{}`; this build supports: {}",
        outbox_core::redact::url(url),
        registry::scheme(url),
        available().join(", ")
    ))
}

/// The ack timeout the sink `url` names will use (see `Sink::ack_timeout`), read from the URL
/// without connecting, so settings can be checked before anything starts: `Some` for sinks that
/// wait for a broker's acknowledgement (NATS, Kafka, RabbitMQ, Redis, MQTT, SQS, SNS and
/// webhooks: `ack_timeout=`, 5 s by default), `None` for the local sinks and for schemes this
/// build does not know (`connect` reports those).
pub fn ack_timeout(url: &str) -> Result<Option<Duration>, Error> {
    match registry::find(SINKS, url) {
        Some(kind) if kind.options != OptionsIn::Nowhere => (kind.check)(url),
        _ => Ok(None),
    }
}

/// `url` with its ack timeout set to `ack_timeout` when the sink has that setting and the URL
/// leaves it unset; otherwise `url` unchanged. For commands that choose a short lease (`demo`,
/// `verify`) and must keep the sink's wait inside it.
pub fn with_default_ack_timeout(url: &str, ack_timeout: Duration) -> String {
    let mark = match registry::find(SINKS, url).map(|k| k.options) {
        Some(OptionsIn::Query) => '?',
        Some(OptionsIn::Fragment) => '#',
        Some(OptionsIn::Nowhere) | None => return url.to_string(),
    };
    outbox_core::options::with_default(
        url,
        mark,
        "ack_timeout",
        &format!("{}ms", ack_timeout.as_millis().max(1)),
    )
}

/// URL schemes this build can publish to.
pub fn available() -> Vec<&'static str> {
    SINKS
        .iter()
        .flat_map(|k| k.listed.iter().copied())
        .collect()
}

/// An error and its causes, `outer: inner: …`: a TLS failure's reason (`invalid peer
/// certificate: Expired`) sits in the chain, not in the outer text.
#[cfg(feature = "nats")]
pub(crate) fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let more = s.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = s.source();
    }
    text
}

/// Installs ring as the process's rustls crypto provider, once, before a client builds a TLS
/// config from the process default (the NATS, Redis and MQTT clients do): with both ring and
/// aws-lc-rs in the build, rustls will not choose, and such a client would panic instead.
#[cfg(any(feature = "redis", feature = "mqtt", feature = "nats"))]
pub fn install_tls_provider() {
    // An error only says a provider is already installed, which is all this wants.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn ack_timeouts_are_read_from_the_url_and_defaulted_only_when_unset() {
        assert_eq!(
            ack_timeout("nats://h:4222").unwrap(),
            Some(Duration::from_secs(5))
        );
        assert_eq!(
            ack_timeout("nats://h:4222?ack_timeout=250ms").unwrap(),
            Some(Duration::from_millis(250))
        );
        assert_eq!(ack_timeout("file:x.jsonl").unwrap(), None);
        #[cfg(feature = "kafka")]
        {
            assert_eq!(
                ack_timeout("kafka://h:9092?ack_timeout=2s").unwrap(),
                Some(Duration::from_secs(2))
            );
            assert_eq!(
                with_default_ack_timeout("kafka://h:9092?acks=all", Duration::from_secs(1)),
                "kafka://h:9092?acks=all&ack_timeout=1000ms"
            );
        }
        assert!(ack_timeout("nats://h?ack_timeout=soon").is_err());
        let d = Duration::from_secs(1);
        assert_eq!(
            with_default_ack_timeout("nats://h:4222", d),
            "nats://h:4222?ack_timeout=1000ms"
        );
        assert_eq!(
            with_default_ack_timeout("nats://h:4222?ack_timeout=2s", d),
            "nats://h:4222?ack_timeout=2s"
        );
        assert_eq!(with_default_ack_timeout("stdout:", d), "stdout:");
        #[cfg(feature = "http")]
        {
            assert_eq!(
                with_default_ack_timeout("http://h/in?tenant=7", d),
                "http://h/in?tenant=7#ack_timeout=1000ms"
            );
            assert_eq!(
                with_default_ack_timeout("http://h/in#mode=batch", d),
                "http://h/in#mode=batch&ack_timeout=1000ms"
            );
            assert_eq!(
                ack_timeout("https://h/in?ack_timeout=9s#ack_timeout=2s").unwrap(),
                Some(Duration::from_secs(2))
            );
        }
        #[cfg(feature = "sqs")]
        {
            assert_eq!(
                ack_timeout("sqs://?region=us-east-1&ack_timeout=2s").unwrap(),
                Some(Duration::from_secs(2))
            );
            assert_eq!(
                with_default_ack_timeout("sqs://?region=us-east-1", d),
                "sqs://?region=us-east-1&ack_timeout=1000ms"
            );
        }
        #[cfg(feature = "sns")]
        assert_eq!(
            with_default_ack_timeout("sns://", d),
            "sns://?ack_timeout=1000ms"
        );
    }
}
