//! The `outbox` binary's integration tests, in one test binary (one link for all of them): a
//! module per topic, sharing `common` (PostgreSQL, NATS, the testkit's harness), `inboxkit`
//! (the inbox sources' fixtures) and `aws` (the SQS and SNS emulator).
//!
//! Each test still runs alone in its own process under cargo-nextest, so no test sees another's
//! environment or global state.

#![allow(clippy::unwrap_used)]

#[path = "common/aws.rs"]
mod aws;
mod common;
#[path = "common/inbox.rs"]
mod inboxkit;

mod cloudevents;
mod console;
mod deadlines;
mod debezium;
mod errors;
mod faults;
mod inbox;
mod inbox_kafka;
mod inbox_mqtt;
mod inbox_sources;
mod inbox_sqs;
mod memory;
mod mysql_operator;
mod observability;
mod one_grammar;
mod pipeline;
mod process;
mod rejections;
mod relay_nats;
mod routing;
mod secrets;
mod sink_amqp;
mod sink_http;
mod sink_kafka;
mod sink_mqtt;
mod sink_redis;
mod sink_sns;
mod sink_sqs;
mod sqlite;
mod status;
mod terminal;
mod tracing;
mod verify;
