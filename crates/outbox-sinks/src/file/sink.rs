//! [`FileSink`]: one JSON object per line, flushed and fsynced before a batch is acknowledged.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use outbox_core::{Envelope, Error, ErrorKind, Sink, SinkError};

/// Appends messages to a JSON-lines file.
///
/// Guarantee: `publish` returns `Ok` only after the lines were written and `fsync`ed, so a crash
/// (of the relay or the machine) never acknowledges a message that is not on disk. A crash after
/// the write and before the relay records the result leaves the line in the file and the message
/// pending: it is appended again (same `id`) — consumers dedupe by `id`.
pub struct FileSink {
    path: PathBuf,
    file: Arc<Mutex<File>>,
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
        let len = file.metadata().map_err(|e| io("read", e))?.len();
        if len > 0 {
            use std::io::{Read, Seek, SeekFrom};
            let mut last = [0u8; 1];
            file.seek(SeekFrom::Start(len - 1))
                .and_then(|_| file.read_exact(&mut last))
                .map_err(|e| io("read", e))?;
            if last[0] != b'\n' {
                file.write_all(b"\n")
                    .and_then(|()| file.sync_data())
                    .map_err(|e| io("repair", e))?;
            }
        }
        if !existed {
            // The new file's directory entry must be durable too, or a power loss could take
            // away acknowledged lines with the whole file.
            if let Some(d) = dir.as_deref().or(Some(Path::new("."))) {
                let _ = File::open(d).and_then(|d| d.sync_all());
            }
        }
        Ok(Self {
            path,
            file: Arc::new(Mutex::new(file)),
        })
    }

    /// Parses `file:path` or `file://path`.
    pub fn from_url(url: &str) -> Result<Self, Error> {
        let path = url
            .strip_prefix("file://")
            .or_else(|| url.strip_prefix("file:"))
            .unwrap_or("");
        if path.is_empty() {
            return Err(Error::config(format!(
                "sink `{url}`: expected file:path.jsonl"
            )));
        }
        Self::open(path)
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
        let mut buf = Vec::with_capacity(batch.len() * 256);
        let mut results = crate::jsonl::encode(batch, &mut buf);
        if buf.is_empty() {
            return results;
        }
        let file = self.file.clone();
        let path = self.path.display().to_string();
        // Blocking file I/O and fsync off the async threads.
        let written = tokio::task::spawn_blocking(move || -> Result<(), String> {
            let mut f = file
                .lock()
                .map_err(|_| "file sink lock poisoned".to_string())?;
            f.write_all(&buf)
                .map_err(|e| format!("file sink: writing {path}: {e}"))?;
            f.sync_data()
                .map_err(|e| format!("file sink: fsync of {path}: {e}"))
        })
        .await
        .unwrap_or_else(|e| Err(format!("file sink: writer task failed: {e}")));
        if let Err(msg) = written {
            for r in results.iter_mut().filter(|r| r.is_ok()) {
                *r = Err(SinkError::unavailable(msg.clone()));
            }
        }
        results
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
            payload: format!("{{\"n\":{n}}}"),
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
