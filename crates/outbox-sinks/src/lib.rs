//! Sinks for the outbox relay: one folder and one cargo feature per broker.
//!
//! Every sink implements [`outbox_core::Sink`]: it returns `Ok` for a message only after the
//! broker acknowledged it, publishes a whole call's messages concurrently, and passes the
//! message id to the broker's own dedupe where one exists.

#[cfg(feature = "file")]
pub mod file;
#[cfg(any(feature = "file", feature = "stdout"))]
mod jsonl;
#[cfg(feature = "nats")]
pub mod nats;
#[cfg(feature = "stdout")]
pub mod stdout;

use std::sync::Arc;

use outbox_core::{Error, Sink};

/// Connects the sink a URL names: `nats://host:4222`, `file:path.jsonl`, `stdout:`. Unknown schemes and sinks left out of
/// this build are config errors that list what is available.
pub async fn connect(url: &str) -> Result<Arc<dyn Sink>, Error> {
    let scheme = url.split_once(':').map(|(s, _)| s).unwrap_or("");
    match scheme {
        #[cfg(feature = "nats")]
        "nats" | "tls" => Ok(Arc::new(
            nats::NatsSink::connect(nats::NatsConfig::from_url(url)?).await?,
        )),
        #[cfg(feature = "file")]
        "file" => Ok(Arc::new(file::FileSink::from_url(url)?)),
        #[cfg(feature = "stdout")]
        "stdout" => Ok(Arc::new(stdout::StdoutSink)),
        _ => Err(Error::config(format!(
            "sink `{}`: unknown or disabled sink scheme `{scheme}`; this build supports: {}",
            outbox_core::redact::url(url),
            available().join(", ")
        ))),
    }
}

/// URL schemes this build can publish to.
pub fn available() -> Vec<&'static str> {
    let all: &[&str] = &[
        #[cfg(feature = "nats")]
        "nats://",
        #[cfg(feature = "file")]
        "file:",
        #[cfg(feature = "stdout")]
        "stdout:",
    ];
    all.to_vec()
}
