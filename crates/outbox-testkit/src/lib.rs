//! Test support shared by every backend and sink: unique per-test names, the store conformance
//! suite every `Store` must pass, and sink wrappers that inject faults or record deliveries
//! around a real sink.

pub mod conformance;
pub mod sinks;

/// A lower-case name `prefix_<16 hex>`, unique per call: per-test schemas, streams, subjects.
pub fn unique_name(prefix: &str) -> String {
    format!("{prefix}_{:016x}", fastrand::u64(..))
}
