//! A thread of its own for the local sinks' blocking writes, so the async runtime's workers
//! never wait on a disk, an `fsync` or a pipe nobody reads.

use std::io::{self, BufWriter, Write};

use outbox_core::{Envelope, Error, ErrorKind, SinkError};
use tokio::sync::{mpsc, oneshot};

/// Where a [`LineWriter`] writes JSON lines.
pub(crate) trait Target: Write + Send + 'static {
    /// Makes everything written so far durable before it is acknowledged: `fsync` for a file,
    /// a flush for a pipe.
    fn commit(&mut self) -> io::Result<()>;

    /// After a write failed midway, ends a torn last line so the next record starts on a line of
    /// its own.
    fn repair(&mut self) -> io::Result<()>;
}

/// One publish call handed to the writer thread.
struct Job {
    batch: Vec<Envelope>,
    reply: oneshot::Sender<Vec<Result<(), SinkError>>>,
}

/// Encodes and writes batches on a dedicated thread, one batch at a time, in the order they were
/// handed over; answers each only after [`Target::commit`] succeeded.
///
/// A caller that stops waiting (the relay's publish deadline) loses nothing: its batch is either
/// written and committed (and published again later, same ids: a duplicate) or, if it was still
/// queued, skipped. The thread ends when the writer is dropped; a write blocked for ever (a pipe
/// nobody reads) keeps only this thread, never the process's exit.
pub(crate) struct LineWriter {
    jobs: mpsc::Sender<Job>,
    what: String,
}

/// Bytes gathered before a `write` system call: many small lines per call, and a large payload
/// passes through without being copied into one buffer with the rest of its batch.
const CHUNK: usize = 64 * 1024;

impl LineWriter {
    /// Starts the thread writing to `target`; `what` names it in errors ("file sink x.jsonl").
    pub(crate) fn spawn(what: String, target: impl Target) -> Result<Self, Error> {
        // One batch queued behind the one being written: a stuck target makes callers wait
        // (asynchronously, under their deadline) instead of piling batches up in memory.
        let (jobs, rx) = mpsc::channel(1);
        std::thread::Builder::new()
            .name("outbox-sink-writer".into())
            .spawn(move || run(rx, target))
            .map_err(|e| {
                Error::with_source(
                    ErrorKind::Other,
                    format!("{what}: cannot start its writer thread"),
                    e,
                )
            })?;
        Ok(Self { jobs, what })
    }

    /// Writes `batch` and waits for the thread's answer: one result per envelope, `Ok` only
    /// once its line is committed.
    pub(crate) async fn write(&self, batch: &[Envelope]) -> Vec<Result<(), SinkError>> {
        let stopped = || {
            let e = SinkError::unavailable(format!("{}: its writer thread stopped", self.what));
            batch.iter().map(|_| Err(e.clone())).collect()
        };
        let (reply, answer) = oneshot::channel();
        // Envelopes share their payloads (`Bytes`): this copies ids and routing, not payloads.
        let job = Job {
            batch: batch.to_vec(),
            reply,
        };
        if self.jobs.send(job).await.is_err() {
            return stopped();
        }
        answer.await.unwrap_or_else(|_| stopped())
    }
}

fn run(mut jobs: mpsc::Receiver<Job>, mut target: impl Target) {
    let mut torn = false;
    let mut line = Vec::new();
    while let Some(Job { batch, reply }) = jobs.blocking_recv() {
        // Its caller gave up while it queued: writing it now would only make a duplicate.
        if reply.is_closed() {
            continue;
        }
        let results = write_batch(&mut target, &batch, &mut torn, &mut line);
        // Let go of the payloads before answering, so the caller's next batch never overlaps
        // this one in memory; and keep no large line around between batches.
        drop(batch);
        line.clear();
        line.shrink_to(CHUNK);
        let _ = reply.send(results);
    }
}

/// Writes one batch, then commits it. Invalid messages are skipped (their result says why);
/// after an I/O error nothing more is written and every message not yet failed is unavailable.
fn write_batch(
    target: &mut impl Target,
    batch: &[Envelope],
    torn: &mut bool,
    line: &mut Vec<u8>,
) -> Vec<Result<(), SinkError>> {
    let mut results: Vec<Result<(), SinkError>> = Vec::with_capacity(batch.len());
    let io_failed = |e: io::Error, results: &mut Vec<Result<(), SinkError>>| {
        let err = SinkError::unavailable(format!("writing: {e}"));
        results.resize(batch.len(), Err(err.clone()));
        for r in results.iter_mut().filter(|r| r.is_ok()) {
            *r = Err(err.clone());
        }
    };
    if *torn {
        match target.repair() {
            Ok(()) => *torn = false,
            Err(e) => {
                io_failed(e, &mut results);
                return results;
            }
        }
    }
    let mut out = BufWriter::with_capacity(CHUNK, &mut *target);
    for e in batch {
        match crate::jsonl::encode_one(e, line) {
            Ok(()) => {}
            Err(invalid) => {
                results.push(Err(invalid));
                continue;
            }
        }
        if let Err(err) = out.write_all(line) {
            *torn = true;
            io_failed(err, &mut results);
            return results;
        }
        results.push(Ok(()));
    }
    let flushed = out.flush();
    drop(out);
    if let Err(err) = flushed.and_then(|()| target.commit()) {
        *torn = true;
        io_failed(err, &mut results);
    }
    results
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A target that fails its first write after `fail_after` bytes, writing those bytes.
    struct Flaky {
        data: Vec<u8>,
        fail_after: Option<usize>,
        commits: usize,
    }

    impl Write for Flaky {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            if let Some(n) = self.fail_after.take() {
                let n = n.min(buf.len());
                self.data.extend_from_slice(&buf[..n]);
                return Err(io::Error::other("disk full"));
            }
            self.data.extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl Target for Flaky {
        fn commit(&mut self) -> io::Result<()> {
            self.commits += 1;
            Ok(())
        }
        fn repair(&mut self) -> io::Result<()> {
            if self.data.last().is_some_and(|b| *b != b'\n') {
                self.data.push(b'\n');
            }
            Ok(())
        }
    }

    fn env(payload: &str) -> Envelope {
        Envelope {
            id: uuid::Uuid::now_v7(),
            destination: "d".into(),
            key: "k".into(),
            headers: vec![],
            payload: payload.to_string().into(),
            created_at: chrono::Utc::now(),
        }
    }

    #[test]
    fn a_failed_write_fails_the_batch_and_the_next_batch_starts_on_a_new_line() {
        let mut t = Flaky {
            data: Vec::new(),
            fail_after: Some(5),
            commits: 0,
        };
        let (mut torn, mut line) = (false, Vec::new());
        let r = write_batch(&mut t, &[env("{}"), env("[1]")], &mut torn, &mut line);
        assert!(r.iter().all(|r| r.as_ref().unwrap_err().is_unavailable()));
        assert!(torn);
        assert_eq!(t.commits, 0, "nothing acknowledged without a commit");
        let r = write_batch(&mut t, &[env("{\"a\":1}")], &mut torn, &mut line);
        assert!(r.iter().all(Result::is_ok));
        let text = String::from_utf8(t.data).unwrap();
        let last = text.lines().last().unwrap();
        assert!(
            serde_json::from_str::<serde_json::Value>(last).is_ok(),
            "{text}"
        );
    }

    #[test]
    fn an_invalid_payload_fails_alone() {
        let mut t = Flaky {
            data: Vec::new(),
            fail_after: None,
            commits: 0,
        };
        let (mut torn, mut line) = (false, Vec::new());
        let r = write_batch(
            &mut t,
            &[env("{}"), env("not json"), env("[2]")],
            &mut torn,
            &mut line,
        );
        assert!(r[0].is_ok() && r[2].is_ok());
        assert_eq!(
            r[1].as_ref().unwrap_err().kind,
            outbox_core::SinkErrorKind::Invalid
        );
        assert_eq!(String::from_utf8(t.data).unwrap().lines().count(), 2);
    }
}
