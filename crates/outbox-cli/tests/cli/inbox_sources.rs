//! The source conformance suite (`outbox_testkit::source_suite`) against every source of
//! `outbox inbox` and its real broker on this machine (`scripts/services.sh` starts them), one
//! module per source, the fixtures in `common/inbox.rs`. Each case gets a channel of its own
//! (a stream, topic, queue or session with a random suffix) and, at the daemon level, an inbox
//! of its own, and spawns the real `outbox` binary.
//!
//! What is particular to one broker stays in its own file: `inbox.rs` (a standby daemon, a
//! lost source lock, a lost NATS pull request, the command-line redrive), `inbox_kafka.rs`
//! (the topic's retention), `inbox_mqtt.rs` (Mosquitto's resend order), `inbox_sqs.rs` (the
//! retention warning).

#![allow(clippy::unwrap_used)]

use crate::inboxkit;
use inboxkit::{outbox, Amqp, Kafka, Mqtt, Nats, Redis, Sqs};
use outbox_testkit::source_conformance_suite;

// The daemon case also into a MariaDB inbox from NATS, and into a SQLite inbox from Redis (any
// source would do: the daemon's writes are the database's part, the source's order is the
// broker's).
source_conformance_suite!(nats, Nats::new, outbox; also [
    the_daemon_killed_mid_stream_and_restarted_loses_nothing_and_records_nothing_twice_in_mysql,
]);
source_conformance_suite!(redis, Redis::new, outbox; also [
    the_daemon_killed_mid_stream_and_restarted_loses_nothing_and_records_nothing_twice_in_sqlite,
]);
source_conformance_suite!(kafka, Kafka::new, outbox);
source_conformance_suite!(amqp, Amqp::new, outbox);
source_conformance_suite!(mqtt, Mqtt::new, outbox);
source_conformance_suite!(sqs_fifo, Sqs::fifo, outbox);
// A standard queue keeps no order: every message once, in any order.
source_conformance_suite!(sqs_standard, Sqs::standard, outbox);
