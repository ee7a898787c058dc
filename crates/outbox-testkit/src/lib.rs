//! Test support shared by every backend and sink: unique per-test names, the store conformance
//! suite every `Store` must pass, the sink conformance suite every sink must pass (feature
//! `sinks`), the inbox backend suite both inbox databases must pass, the source conformance
//! suite every `outbox inbox` source must pass, private brokers and the process harness behind
//! them, a TCP proxy for network faults, relay helpers, and sink wrappers that inject faults or
//! record deliveries around a real sink.

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
pub mod source_suite;
#[cfg(feature = "sinks")]
pub mod stdout_process;

/// A lower-case name `prefix_<16 hex>`, unique per call: per-test schemas, streams, subjects.
pub fn unique_name(prefix: &str) -> String {
    format!("{prefix}_{:016x}", fastrand::u64(..))
}
