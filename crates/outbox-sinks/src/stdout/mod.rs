//! `stdout:` sink: one JSON object per line on standard output, for trying things out and pipes.

use std::io::Write;

use async_trait::async_trait;
use outbox_core::{Envelope, Error, Sink, SinkError};

use crate::writer::{LineWriter, Target};

/// This sink's entry in [`crate::SINKS`].
pub(crate) const KIND: crate::registry::SinkKind = crate::registry::SinkKind {
    schemes: &["stdout"],
    listed: &["stdout:"],
    options: crate::registry::OptionsIn::Nowhere,
    connect: connect_url,
    check: |_| Ok(None),
    scratch: None,
};

fn connect_url(_: &str) -> crate::registry::Connecting<'_> {
    crate::registry::boxed(async move { StdoutSink::new() })
}

/// Writes each message as a JSON line to stdout and flushes before acknowledging. A closed
/// pipe is the sink being unavailable: the messages stay pending and are retried.
///
/// Writes run on a thread of the sink's own: a pipe nobody reads blocks that thread, never the
/// async runtime, and the relay's publish deadline turns the wait into a retry.
pub struct StdoutSink {
    writer: LineWriter,
}

impl StdoutSink {
    /// A sink writing to this process's standard output.
    pub fn new() -> Result<Self, Error> {
        Ok(Self {
            writer: LineWriter::spawn("stdout sink".into(), Stdout)?,
        })
    }
}

impl std::fmt::Debug for StdoutSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StdoutSink")
    }
}

/// Standard output, as the writer thread holds it.
struct Stdout;

impl Write for Stdout {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        std::io::stdout().lock().write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stdout().lock().flush()
    }
}

impl Target for Stdout {
    fn commit(&mut self) -> std::io::Result<()> {
        self.flush()
    }

    fn repair(&mut self) -> std::io::Result<()> {
        // A pipe cannot be read back: close whatever line a failed write left open. A blank
        // line is the worst case, and line readers skip it.
        std::io::stdout().lock().write_all(b"\n")
    }
}

#[async_trait]
impl Sink for StdoutSink {
    fn name(&self) -> &str {
        "stdout"
    }

    async fn publish(&self, batch: &[Envelope]) -> Vec<Result<(), SinkError>> {
        self.writer.write(batch).await
    }
}
