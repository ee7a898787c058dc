//! Configuration of the Kafka sink: `kafka://host:9092[,host2:9092]?option=…`.

use std::time::Duration;

use outbox_core::options::{self, Bounds, QueryOptions, Role};
use outbox_core::Error;

/// Default wait for the acknowledgements of one `publish` call.
pub const DEFAULT_ACK_TIMEOUT: Duration = Duration::from_secs(5);
/// Default time librdkafka waits to fill a batch before sending it. Shorter than librdkafka's
/// own 5 ms: the relay hands over a whole call at once, so the wait fills nothing more and
/// only delays the call's acknowledgements (1 ms drained one hot key 35 % faster, measured).
pub const DEFAULT_LINGER: Duration = Duration::from_millis(1);

/// The options `kafka://` accepts.
const KNOWN: &[&str] = &[
    "acks",
    "ack_timeout",
    "create_topics",
    "partitions",
    "replication_factor",
    "linger",
    "max_in_flight",
];

/// Default produce requests in flight per broker connection: one (see
/// [`KafkaConfig::max_in_flight`]).
pub const DEFAULT_MAX_IN_FLIGHT: u32 = 1;

/// Where and how to publish to Kafka.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KafkaConfig {
    /// Bootstrap servers, `host:port` separated by commas (librdkafka's `bootstrap.servers`).
    pub brokers: String,
    /// Longest wait for the acknowledgements of one `publish` call. A message still without one
    /// then counts as unavailable (retried); it stays queued in the producer, and a retry of it
    /// waits for that copy instead of sending a second one (see the sink).
    pub ack_timeout: Duration,
    /// Create a destination topic that does not exist (`?create_topics=true`) instead of
    /// rejecting its messages.
    pub create_topics: bool,
    /// Partitions of a topic the sink creates; `-1` (the default) asks for the broker's
    /// `num.partitions`.
    pub partitions: i32,
    /// Replication factor of a topic the sink creates; `-1` (the default) asks for the broker's
    /// `default.replication.factor`.
    pub replication_factor: i32,
    /// How long librdkafka waits to fill a batch (`linger.ms`).
    pub linger: Duration,
    /// Produce requests in flight per broker connection (`max.in.flight`, 1 to 5 with the
    /// idempotent producer). One by default: with several, a request that failed in transit
    /// (the broker died) while a later one succeeded makes librdkafka infer that the first was
    /// written too (its "implicit ack"), which holds only on a broker that checks idempotent
    /// sequence numbers strictly, as Apache Kafka does; tansu 0.6 does not after a restart, and
    /// the first request's messages were lost while the relay recorded them published. The
    /// relay sends a whole batch per call, which librdkafka packs into one request per broker,
    /// so one in flight costs little; raise it only against Apache Kafka.
    pub max_in_flight: u32,
}

impl KafkaConfig {
    /// Parses `kafka://host:port[,host:port…][?acks=all&ack_timeout=5s&create_topics=true&…]`.
    ///
    /// `acks` accepts only `all` (or `-1`): the idempotent producer, which keeps a key's order
    /// across retries and drops its own retried duplicates, requires it. Credentials in the URL
    /// are refused rather than ignored: this build speaks plaintext only.
    pub fn from_url(url: &str) -> Result<Self, Error> {
        let brokers = parse_brokers(url)?;
        let (_, o) = QueryOptions::from_url(Role::Sink, url, KNOWN)?;
        if !matches!(o.str("acks"), None | Some("all" | "-1")) {
            return Err(Error::config(format!(
                "sink option acks=`{}`: only acks=all is supported; the idempotent producer, \
                 which keeps each key's order across retries, requires it",
                o.str("acks").unwrap_or_default()
            )));
        }
        // -1: the broker's default; 0 is no count of partitions or replicas.
        let broker_default = |key: &str, what: &str| -> Result<i32, Error> {
            match o.int(key, Bounds::new(-1, i32::MAX))? {
                None => Ok(-1),
                Some(0) => Err(options::invalid(
                    Role::Sink,
                    key,
                    "0",
                    &format!("{what} (1 or more, -1: the broker's default)"),
                )),
                Some(n) => Ok(n),
            }
        };
        Ok(Self {
            brokers,
            ack_timeout: o
                .duration("ack_timeout", Bounds::TIMEOUT)?
                .unwrap_or(DEFAULT_ACK_TIMEOUT),
            create_topics: o.bool("create_topics")?.unwrap_or(false),
            partitions: broker_default("partitions", "a number of partitions")?,
            replication_factor: broker_default("replication_factor", "a replication factor")?,
            // The idempotent producer allows at most 5 requests in flight.
            max_in_flight: o
                .int("max_in_flight", Bounds::new(1, 5))?
                .unwrap_or(DEFAULT_MAX_IN_FLIGHT),
            linger: o
                .duration(
                    "linger",
                    Bounds::new(Duration::ZERO, Duration::from_secs(60)),
                )?
                .unwrap_or(DEFAULT_LINGER),
        })
    }
}

/// The bootstrap servers of a `kafka://host:port[,host:port…][?…]` URL (its options are left to
/// the caller): the one parser of Kafka addresses, shared by the sink and the inbox's source.
///
/// Credentials in the URL are refused rather than ignored (this build speaks PLAINTEXT only),
/// and the error never echoes them.
pub fn parse_brokers(url: &str) -> Result<String, Error> {
    let shown = outbox_core::redact::url(url);
    let base = url.split_once('?').map_or(url, |(b, _)| b);
    let Some(hosts) = base.strip_prefix("kafka://") else {
        return Err(Error::config(format!(
            "`{shown}`: expected kafka://host:port[,host:port]"
        )));
    };
    if hosts.contains('@') {
        return Err(Error::config(format!(
            "`{shown}`: credentials in a kafka:// URL are not supported (this build speaks \
             PLAINTEXT only); remove them"
        )));
    }
    let hosts = hosts.trim_end_matches('/');
    let mut brokers = Vec::new();
    for host in hosts.split(',') {
        let ok = !host.is_empty()
            && host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || ".-_:[]".contains(c));
        if !ok {
            return Err(Error::config(format!(
                "`{shown}`: `{host}` is not a host:port; expected kafka://host:port[,host:port]"
            )));
        }
        brokers.push(host);
    }
    Ok(brokers.join(","))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn parses_hosts_and_options() {
        let c = KafkaConfig::from_url(
            "kafka://127.0.0.1:9092,kafka2:9093?acks=all&ack_timeout=250ms&create_topics=true&partitions=6&replication_factor=3&linger=2ms&max_in_flight=5",
        )
        .unwrap();
        assert_eq!(c.brokers, "127.0.0.1:9092,kafka2:9093");
        assert_eq!(c.ack_timeout, Duration::from_millis(250));
        assert!(c.create_topics);
        assert_eq!((c.partitions, c.replication_factor), (6, 3));
        assert_eq!(c.linger, Duration::from_millis(2));
        assert_eq!(c.max_in_flight, 5);
        let d = KafkaConfig::from_url("kafka://h:9092").unwrap();
        assert_eq!(d.ack_timeout, DEFAULT_ACK_TIMEOUT);
        assert!(!d.create_topics);
        assert_eq!((d.partitions, d.replication_factor), (-1, -1));
        assert_eq!(d.max_in_flight, 1);
    }

    #[test]
    fn unknown_and_bad_options_are_config_errors_that_name_them() {
        for (url, says) in [
            ("kafka://h:9092?bogus=1", "`bogus` is not known"),
            ("kafka://h:9092?acks=1", "only acks=all"),
            ("kafka://h:9092?ack_timeout=soon", "ack_timeout=`soon`"),
            ("kafka://h:9092?ack_timeout=0s", "ack_timeout=`0s`"),
            (
                "kafka://h:9092?create_topics=maybe",
                "create_topics=`maybe`",
            ),
            ("kafka://h:9092?partitions=0", "partitions=`0`"),
            (
                "kafka://h:9092?replication_factor=x",
                "replication_factor=`x`",
            ),
            ("kafka://h:9092?linger=2h", "linger=`2h`"),
            ("kafka://h:9092?max_in_flight=6", "max_in_flight=`6`"),
            ("kafka://", "is not a host:port"),
            ("kafka://a,,b", "is not a host:port"),
            ("http://h:9092", "expected kafka://"),
        ] {
            let e = KafkaConfig::from_url(url).unwrap_err().to_string();
            assert!(e.contains(says), "{url}: {e}");
        }
    }

    #[test]
    fn credentials_are_refused_without_being_echoed() {
        let e = KafkaConfig::from_url("kafka://app:hunter2@h:9092")
            .unwrap_err()
            .to_string();
        assert!(e.contains("credentials"), "{e}");
        assert!(!e.contains("hunter2"), "{e}");
    }
}
