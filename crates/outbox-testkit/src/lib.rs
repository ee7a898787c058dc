//! Test support shared by every backend and sink: unique per-test names, the store conformance
//! suite every `Store` must pass, the writer and migration suite every database must pass, the
//! sink conformance suite every sink must pass (feature `sinks`), the inbox backend suite all three
//! inbox databases must pass, the source conformance suite every `outbox inbox` source must
//! pass (its fixtures beside the sinks', feature `sources`), private brokers and the process harness behind them, a TCP proxy for network faults,
//! relay helpers, and sink wrappers that inject faults or record deliveries around a real sink.

pub mod brokers;
pub mod conformance;
pub mod inbox_backends;
pub mod inbox_suite;
pub mod process;
pub mod proxy;
pub mod relay;
#[cfg(feature = "sinks")]
pub mod sink_fixtures;
#[cfg(feature = "sinks")]
pub mod sink_suite;
pub mod sinks;
#[cfg(feature = "sources")]
pub mod source_fixtures;
pub mod source_suite;
#[cfg(feature = "sinks")]
pub mod stdout_process;
pub mod writer_suite;

/// Sends the test's logs to its output when `OUTBOX_TEST_LOG` names a filter (`debug`,
/// `outbox_relay=debug`, …): a case that hangs in CI can then be rerun with what its relay did.
/// Once per process; a no-op otherwise.
pub fn init_test_log() {
    if let Ok(filter) = std::env::var("OUTBOX_TEST_LOG") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_test_writer()
            .try_init();
    }
}

/// A lower-case name `prefix_<16 hex>`, unique per call: per-test schemas, streams, subjects.
///
/// The process id is mixed in because fastrand seeds each thread from the clock and the
/// thread's id only: two test processes started by nextest in the same instant drew the same
/// names, and two SQS tests once shared one store (CI, 2026-12-05). Processes alive at the same
/// time have different ids, so their names differ even when their seeds do not.
pub fn unique_name(prefix: &str) -> String {
    let pid = u64::from(std::process::id());
    format!("{prefix}_{:016x}", fastrand::u64(..) ^ pid.rotate_left(40))
}
