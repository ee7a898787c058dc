//! `stdout:` sink: one JSON object per line on standard output, for trying things out and pipes.

use std::io::Write;

use async_trait::async_trait;
use outbox_core::{Envelope, Sink, SinkError};

/// Writes each message as a JSON line to stdout and flushes before acknowledging. A closed
/// pipe is the sink being unavailable: the messages stay pending and are retried.
#[derive(Debug, Default)]
pub struct StdoutSink;

#[async_trait]
impl Sink for StdoutSink {
    fn name(&self) -> &str {
        "stdout"
    }

    async fn publish(&self, batch: &[Envelope]) -> Vec<Result<(), SinkError>> {
        let mut buf = Vec::with_capacity(batch.len() * 256);
        let mut results = crate::jsonl::encode(batch, &mut buf);
        let mut out = std::io::stdout().lock();
        if let Err(e) = out.write_all(&buf).and_then(|()| out.flush()) {
            for r in results.iter_mut().filter(|r| r.is_ok()) {
                *r = Err(SinkError::unavailable(format!("stdout: {e}")));
            }
        }
        results
    }
}
