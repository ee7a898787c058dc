//! HTTP webhook sink: a POST per message or per batch, signed per Standard Webhooks
//! (`webhook-id`, `webhook-timestamp`, `webhook-signature`); a 2xx acknowledges.

mod config;
mod error;
mod reader;
pub mod sign;
mod sink;

pub use config::{
    HttpConfig, Mode, SigningKey, DEFAULT_ACK_TIMEOUT, DEFAULT_MAX_BATCH, DEFAULT_MAX_IN_FLIGHT,
    DESTINATION_PLACEHOLDER,
};
pub(crate) use reader::scratch;
pub use reader::{
    Behaviour, HttpReader, HttpReceiver, IncomingRequest, ReceiverStats, DOWN_FILE_ENV,
};
pub use sink::{HttpSink, HEADER_DESTINATION};
