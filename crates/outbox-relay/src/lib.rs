//! The relay engine: claim a batch of pending messages under a partition lease, publish it with
//! many acknowledgements in flight, record the results in one statement, repeat.
//!
//! Delivery is at least once: a row is marked published only after the sink acknowledged it,
//! and a crash between the two republishes the row with the same id. Order per key holds
//! because a partition (and so a key) has one owner at a time, rows are read in sequence order,
//! and within a batch the engine keeps several publish calls in flight but at most one message
//! per key: message n+1 of a key is sent only after message n was acknowledged (a sink that
//! orders keys itself, such as Kafka, gets a key's run in one call instead).

pub mod breaker;
mod config;
mod deliver;
pub mod health;
mod lane;
mod metrics;
mod publish;
mod relay;
pub mod spans;
pub mod telemetry;
mod worker;

pub use breaker::{Breaker, CircuitState};
pub use config::RelayConfig;
pub use health::{CircuitView, MemberHealth, Pulse, RelayHealth, Verdict};
pub use lane::Route;
pub use metrics::{ClaimTimes, ClaimTimesSnapshot, RelayMetrics};
pub use relay::Relay;
