//! [`FileSink`]: one JSON object per line, flushed and fsynced before a batch is acknowledged.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use async_trait::async_trait;
use outbox_core::{Envelope, Error, ErrorKind, Sink, SinkError};

use crate::writer::{LineWriter, Target};

/// Appends messages to a JSON-lines file.
///
/// Guarantee: `publish` returns `Ok` only after the lines were written and `fsync`ed, so a crash
/// (of the relay or the machine) never acknowledges a message that is not on disk. A crash after
/// the write and before the relay records the result leaves the line in the file and the message
/// pending: it is appended again (same `id`) — consumers dedupe by `id`.
///
/// Writes and `fsync`s run on a thread of the sink's own, never on the async runtime's workers;
/// a disk that stalls makes `publish` wait (the relay's publish deadline bounds the wait), not
/// the runtime.
pub struct FileSink {
    path: PathBuf,
    writer: LineWriter,
}

/// The appended file, as the writer thread holds it.
struct AppendFile(File);

impl Write for AppendFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

impl Target for AppendFile {
    fn commit(&mut self) -> std::io::Result<()> {
        self.0.sync_data()
    }

    fn repair(&mut self) -> std::io::Result<()> {
        end_torn_line(&mut self.0)
    }
}

/// Appends a newline when the file's last byte is not one: a line torn by a crash or a failed
/// write must not swallow the next record.
fn end_torn_line(file: &mut File) -> std::io::Result<()> {
    let len = file.metadata()?.len();
    if len == 0 {
        return Ok(());
    }
    let mut last = [0u8; 1];
    file.seek(SeekFrom::Start(len - 1))?;
    file.read_exact(&mut last)?;
    if last[0] != b'\n' {
        // Opened for appending: the write lands at the end wherever the cursor is.
        file.write_all(b"\n")?;
        file.sync_data()?;
    }
    Ok(())
}

impl FileSink {
    /// Opens (creating if needed) `path` for appending; creates missing parent directories.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, Error> {
        let path = path.as_ref().to_path_buf();
        let io = |what: &str, e: std::io::Error| {
            Error::with_source(
                ErrorKind::Config,
                format!("file sink: cannot {what} {}", path.display()),
                e,
            )
        };
        let dir = path
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .map(Path::to_path_buf);
        if let Some(dir) = &dir {
            std::fs::create_dir_all(dir).map_err(|e| io("create the folder of", e))?;
        }
        let existed = path.exists();
        let mut file = OpenOptions::new()
            .create(true)
            .read(true)
            .append(true)
            .open(&path)
            .map_err(|e| io("open", e))?;
        // A line torn by a crash mid-write must not swallow the next record: start on a new line.
        end_torn_line(&mut file).map_err(|e| io("repair", e))?;
        if !existed {
            // The new file's directory entry must be durable too, or a power loss could take
            // away acknowledged lines with the whole file.
            if let Some(d) = dir.as_deref().or(Some(Path::new("."))) {
                let _ = File::open(d).and_then(|d| d.sync_all());
            }
        }
        let writer = LineWriter::spawn(format!("file sink {}", path.display()), AppendFile(file))?;
        Ok(Self { path, writer })
    }

    /// Parses `file:path` or `file://path`.
    pub fn from_url(url: &str) -> Result<Self, Error> {
        Self::open(Self::path_of(url)?)
    }

    /// The path a `file:path.jsonl` (or `file://path.jsonl`) URL names, checked without
    /// touching the file.
    pub fn path_of(url: &str) -> Result<&str, Error> {
        let path = url
            .strip_prefix("file://")
            .or_else(|| url.strip_prefix("file:"))
            .unwrap_or("");
        if path.is_empty() {
            return Err(Error::config(format!(
                "sink `{url}`: expected file:path.jsonl"
            )));
        }
        Ok(path)
    }

    /// The file written to.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[async_trait]
impl Sink for FileSink {
    fn name(&self) -> &str {
        "file"
    }

    async fn publish(&self, batch: &[Envelope]) -> Vec<Result<(), SinkError>> {
        self.writer.write(batch).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn appends_lines_and_survives_reopen() {
        let dir = std::env::temp_dir().join(format!("outbox-file-sink-{:x}", fastrand_u64()));
        let path = dir.join("nested/events.jsonl");
        let env = |n: u32| Envelope {
            id: uuid::Uuid::now_v7(),
            destination: "d".into(),
            key: "k".into(),
            headers: vec![],
            payload: format!("{{\"n\":{n}}}").into(),
            created_at: chrono::Utc::now(),
        };
        let sink = FileSink::from_url(&format!("file:{}", path.display())).unwrap();
        assert!(sink
            .publish(&[env(1), env(2)])
            .await
            .iter()
            .all(Result::is_ok));
        drop(sink);
        let sink = FileSink::open(&path).unwrap();
        assert!(sink.publish(&[env(3)]).await.iter().all(Result::is_ok));
        let text = std::fs::read_to_string(&path).unwrap();
        let ns: Vec<u64> = text
            .lines()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l).unwrap()["payload"]["n"]
                    .as_u64()
                    .unwrap()
            })
            .collect();
        assert_eq!(ns, vec![1, 2, 3]);
        std::fs::remove_dir_all(&dir).ok();
    }

    #[tokio::test]
    async fn a_torn_last_line_is_closed_before_appending() {
        let dir = std::env::temp_dir().join(format!("outbox-file-sink-torn-{:x}", fastrand_u64()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("events.jsonl");
        std::fs::write(&path, "{\"id\":\"torn").unwrap();
        let sink = FileSink::open(&path).unwrap();
        let e = Envelope {
            id: uuid::Uuid::now_v7(),
            destination: "d".into(),
            key: "k".into(),
            headers: vec![],
            payload: "{}".into(),
            created_at: chrono::Utc::now(),
        };
        assert!(sink.publish(&[e]).await.iter().all(Result::is_ok));
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2);
        assert!(serde_json::from_str::<serde_json::Value>(lines[1]).is_ok());
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn empty_path_is_a_config_error() {
        assert_eq!(
            FileSink::from_url("file:").err().unwrap().kind(),
            ErrorKind::Config
        );
    }

    fn fastrand_u64() -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0)
            ^ u64::from(std::process::id())
    }
}
