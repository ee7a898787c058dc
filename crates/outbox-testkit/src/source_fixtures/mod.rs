//! The brokers `outbox inbox` reads, as fixtures of the source conformance suite
//! ([`crate::source_suite`]), beside the sinks' ([`crate::sink_fixtures`]): per broker, a channel
//! of the test's own with a random suffix, a consumer that takes messages and dies without
//! acknowledging, and the broker's own view of what is left unacknowledged, read with its own
//! client (`async-nats`, `redis`, `rdkafka`, `lapin`, `rumqttc`, the SQS SDK: behind this
//! crate's `sources` feature, so a store crate's tests build none of them).

#![allow(clippy::unwrap_used)]
// A fixture reads its broker's address from the environment in `new()`; a `Default` that did
// the same would hide that.
#![allow(clippy::new_without_default)]

mod amqp;
mod kafka;
mod mqtt;
mod nats;
mod redis;
mod sqs;

use std::time::{Duration, Instant};

pub use amqp::{Amqp, AmqpChannel};
pub use kafka::{Kafka, KafkaChannel};
pub use mqtt::{mqtt_client, Mqtt, MqttChannel};
pub use nats::{Nats, NatsChannel};
pub use redis::{Redis, RedisChannel};
pub use sqs::{Sqs, SqsChannel};

use crate::source_suite::SECRET;

/// How long a drained check waits for the broker to settle.
const SETTLE: Duration = Duration::from_secs(60);

fn env_or(var: &str, default: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| default.to_string())
}

/// `url` with `user` and [`SECRET`] as its credentials.
fn with_password(url: &str, user: &str) -> String {
    url.replacen("://", &format!("://{user}:{SECRET}@"), 1)
}

/// Polls `check` until it returns `None`; panics with its last `Some(why)` after [`SETTLE`].
async fn settle<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<String>>,
{
    let deadline = Instant::now() + SETTLE;
    loop {
        let Some(why) = check().await else { return };
        assert!(
            Instant::now() < deadline,
            "{what} not drained after {SETTLE:?}: {why}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
