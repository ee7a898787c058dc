//! Helpers of the SQS and SNS tests (included with `#[path]` by `sink_sqs.rs`, `sink_sns.rs`
//! and `inbox_sqs.rs`): moto's endpoint, and a runtime with moto's keys in the standard AWS
//! chain. Private moto servers, proxies and the relay helpers are the testkit's.

#![allow(clippy::unwrap_used)]

use std::future::Future;

pub use outbox_testkit::brokers::moto_endpoint;

/// Runs `test` on a two-thread runtime, after giving the standard AWS chain moto's keys when
/// the environment has none (set before the runtime starts, so no other thread reads the
/// environment while it changes; sink URLs never carry credentials).
pub fn run<F: Future<Output = ()>>(test: F) {
    outbox_testkit::brokers::moto_credentials();
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(test)
}

/// The sink URL for `scheme` (`sqs`, `sns`) at `endpoint`: region and endpoint only;
/// credentials come from the chain.
pub fn url(scheme: &str, endpoint: &str) -> String {
    format!("{scheme}://?region=us-east-1&endpoint={endpoint}")
}

/// Publishes ten messages twice with the same ids (a relay that crashed after the service
/// accepted them) through `sink` to `destination`, and checks that `reader` gets each once:
/// the `MessageDeduplicationId` the sink sets (the message id) drops the copies.
pub async fn assert_republished_ids_are_dropped(
    sink: &dyn outbox_core::Sink,
    destination: &str,
    reader: &mut dyn outbox_sinks::read::Reader,
) {
    let again: Vec<outbox_core::Envelope> = (0..10)
        .map(|i| outbox_testkit::relay::envelope(destination, &format!("dup-{i}"), 0))
        .collect();
    for _ in 0..2 {
        for r in sink.publish(&again).await {
            r.unwrap();
        }
    }
    let got = outbox_testkit::relay::read_distinct(
        reader,
        again.len(),
        std::time::Duration::from_secs(60),
    )
    .await;
    assert_eq!(got.len(), again.len(), "a republished id must be dropped");
}
