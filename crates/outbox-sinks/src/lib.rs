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

/// Connects the sink a URL names: `nats://host:4222`, `kafka://host:9092`, `amqp://host:5672/%2f`, `redis://host:6379`,
/// `mqtt://host:1883`, `sqs://?region=…`, `sns://?region=…`, `https://host/hook#secret=…`,
/// `file:path.jsonl`, `stdout:`.
/// Unknown schemes and sinks left out of this build are config errors that list what is
/// available.
pub async fn connect(url: &str) -> Result<Arc<dyn Sink>, Error> {
    let scheme = url.split_once(':').map(|(s, _)| s).unwrap_or("");
    match scheme {
        #[cfg(feature = "nats")]
        "nats" | "tls" => Ok(Arc::new(
            nats::NatsSink::connect(nats::NatsConfig::from_url(url)?).await?,
        )),
        #[cfg(feature = "amqp")]
        "amqp" | "amqps" => Ok(Arc::new(
            amqp::AmqpSink::connect(amqp::AmqpConfig::from_url(url)?).await?,
        )),
        #[cfg(feature = "mqtt")]
        "mqtt" | "mqtts" => {
            let cfg = mqtt::MqttConfig::from_url(url)?;
            let wait = cfg.ack_timeout.min(Duration::from_secs(2));
            let sink = mqtt::MqttSink::connect(cfg)?;
            sink.wait_connected(wait).await;
            Ok(Arc::new(sink))
        }
        #[cfg(feature = "redis")]
        "redis" | "rediss" => Ok(Arc::new(redis::RedisSink::connect(
            redis::RedisConfig::from_url(url)?,
        )?)),
        #[cfg(feature = "sqs")]
        "sqs" => Ok(Arc::new(
            sqs::SqsSink::connect(sqs::SqsConfig::sqs_from_url(url)?).await?,
        )),
        #[cfg(feature = "sns")]
        "sns" => Ok(Arc::new(
            sns::SnsSink::connect(sns::SnsConfig::sns_from_url(url)?).await?,
        )),
        #[cfg(feature = "kafka")]
        "kafka" => Ok(Arc::new(kafka::KafkaSink::connect(
            kafka::KafkaConfig::from_url(url)?,
        )?)),
        #[cfg(feature = "http")]
        "http" | "https" => Ok(Arc::new(http::HttpSink::connect(
            http::HttpConfig::from_url(url)?,
        )?)),
        #[cfg(feature = "file")]
        "file" => Ok(Arc::new(file::FileSink::from_url(url)?)),
        #[cfg(feature = "stdout")]
        "stdout" => Ok(Arc::new(stdout::StdoutSink::new()?)),
        _ => Err(unknown_scheme(url, scheme)),
    }
}

/// Checks the sink URL `url` without contacting anything or creating a file: its scheme is one
/// this build supports and its options parse. Commands run this before they connect to the
/// database, so a misspelt sink is reported first.
pub fn check(url: &str) -> Result<(), Error> {
    let scheme = url.split_once(':').map(|(s, _)| s).unwrap_or("");
    match scheme {
        #[cfg(feature = "file")]
        "file" => file::FileSink::path_of(url).map(|_| ()),
        #[cfg(feature = "stdout")]
        "stdout" => Ok(()),
        // Every other sink this build has reads its whole URL for its ack timeout.
        _ => match ack_timeout(url)? {
            Some(_) => Ok(()),
            None => Err(unknown_scheme(url, scheme)),
        },
    }
}

fn unknown_scheme(url: &str, scheme: &str) -> Error {
    Error::config(format!(
        "sink `{}`: unknown or disabled sink scheme `{scheme}`; this build supports: {}",
        outbox_core::redact::url(url),
        available().join(", ")
    ))
}

/// The ack timeout the sink `url` names will use (see `Sink::ack_timeout`), read from the URL
/// without connecting, so settings can be checked before anything starts: `Some` for sinks that
/// wait for a broker's acknowledgement (NATS, Kafka, RabbitMQ, Redis, MQTT, SQS and SNS: `?ack_timeout=`,
/// 5 s by default), `None` for the
/// local sinks and for schemes this build does not know (`connect` reports those).
pub fn ack_timeout(url: &str) -> Result<Option<Duration>, Error> {
    let scheme = url.split_once(':').map(|(s, _)| s).unwrap_or("");
    match scheme {
        #[cfg(feature = "nats")]
        "nats" | "tls" => Ok(Some(nats::NatsConfig::from_url(url)?.ack_timeout)),
        #[cfg(feature = "amqp")]
        "amqp" | "amqps" => Ok(Some(amqp::AmqpConfig::from_url(url)?.ack_timeout)),
        #[cfg(feature = "redis")]
        "redis" | "rediss" => Ok(Some(redis::RedisConfig::from_url(url)?.ack_timeout)),
        #[cfg(feature = "mqtt")]
        "mqtt" | "mqtts" => Ok(Some(mqtt::MqttConfig::from_url(url)?.ack_timeout)),
        #[cfg(feature = "sqs")]
        "sqs" => Ok(Some(sqs::SqsConfig::sqs_from_url(url)?.ack_timeout)),
        #[cfg(feature = "sns")]
        "sns" => Ok(Some(sns::SnsConfig::sns_from_url(url)?.ack_timeout)),
        #[cfg(feature = "kafka")]
        "kafka" => Ok(Some(kafka::KafkaConfig::from_url(url)?.ack_timeout)),
        #[cfg(feature = "http")]
        "http" | "https" => Ok(Some(http::HttpConfig::from_url(url)?.ack_timeout)),
        _ => Ok(None),
    }
}

/// `url` with its ack timeout set to `ack_timeout` when the sink has that setting and the URL
/// leaves it unset; otherwise `url` unchanged. For commands that choose a short lease (`demo`,
/// `verify`) and must keep the sink's wait inside it.
pub fn with_default_ack_timeout(url: &str, ack_timeout: Duration) -> String {
    let scheme = url.split_once(':').map(|(s, _)| s).unwrap_or("");
    let has_setting = matches!(
        scheme,
        "nats"
            | "tls"
            | "kafka"
            | "amqp"
            | "amqps"
            | "redis"
            | "rediss"
            | "mqtt"
            | "mqtts"
            | "sqs"
            | "sns"
    );
    // A webhook's options are in the fragment: its query belongs to the endpoint.
    let webhook = matches!(scheme, "http" | "https");
    let mark = if webhook { '#' } else { '?' };
    if !(has_setting || webhook) {
        return url.to_string();
    }
    outbox_core::options::with_default(
        url,
        mark,
        "ack_timeout",
        &format!("{}ms", ack_timeout.as_millis().max(1)),
    )
}

/// URL schemes this build can publish to.
pub fn available() -> Vec<&'static str> {
    let all: &[&str] = &[
        #[cfg(feature = "nats")]
        "nats://",
        #[cfg(feature = "amqp")]
        "amqp://",
        #[cfg(feature = "redis")]
        "redis://",
        #[cfg(feature = "mqtt")]
        "mqtt://",
        #[cfg(feature = "sqs")]
        "sqs://",
        #[cfg(feature = "sns")]
        "sns://",
        #[cfg(feature = "kafka")]
        "kafka://",
        #[cfg(feature = "http")]
        "http://",
        #[cfg(feature = "http")]
        "https://",
        #[cfg(feature = "file")]
        "file:",
        #[cfg(feature = "stdout")]
        "stdout:",
    ];
    all.to_vec()
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
