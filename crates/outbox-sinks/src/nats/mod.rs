//! NATS JetStream sink: async publish with acknowledgements, `Nats-Msg-Id` dedupe.

mod config;
mod denied;
mod error;
mod sink;

pub use config::{NatsAuth, NatsConfig};
pub use sink::NatsSink;
