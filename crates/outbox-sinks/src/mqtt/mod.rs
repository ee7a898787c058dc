//! MQTT sink (v5): QoS 1 publishes whose PUBACK is the acknowledgement, headers as user
//! properties.

mod config;
mod error;
mod reader;
mod sink;

pub use config::{MqttConfig, DEFAULT_ACK_TIMEOUT, DEFAULT_MAX_MESSAGE_SIZE, OPTIONS};
pub(crate) use reader::scratch;
pub use reader::MqttReader;
pub use sink::MqttSink;
