//! NATS JetStream sink: async publish with acknowledgements, `Nats-Msg-Id` dedupe.

mod config;
mod denied;
mod error;
mod reader;
mod sink;

pub use config::{NatsAuth, NatsConfig, OPTIONS};
pub(crate) use reader::scratch;
pub use reader::{create_stream, NatsReader};
pub use sink::NatsSink;
