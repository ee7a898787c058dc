//! Redis Streams sink: pipelined `XADD` (optionally trimmed with `MAXLEN ~`), the message id as
//! a field, and an optional dedupe window.

mod config;
mod error;
mod reader;
mod sink;

pub use config::{
    RedisConfig, RedisConnection, CONNECTION_OPTIONS, DEFAULT_ACK_TIMEOUT, DEFAULT_MAX_MESSAGE_SIZE,
};
pub(crate) use reader::scratch;
pub use reader::RedisReader;
pub use sink::RedisSink;
