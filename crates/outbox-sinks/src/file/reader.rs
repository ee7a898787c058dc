//! [`FileReader`]: tails the JSON lines the `file:` and `stdout:` sinks write.

use std::path::{Path, PathBuf};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use outbox_core::Error;

use crate::read::{Delivered, Polled, Reader, Scratch, ScratchOptions};

/// Reads a growing JSON-lines file from where the last read stopped. Several writers may append
/// to the file (`O_APPEND`, one write per batch), so its lines are in arrival order.
pub struct FileReader {
    path: PathBuf,
    offset: u64,
    partial: Vec<u8>,
}

impl FileReader {
    /// A reader of `path` from its start (the file may not exist yet).
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            offset: 0,
            partial: Vec::new(),
        }
    }

    /// The file read.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Complete lines appended since the last call; a line still being written stays for the
    /// next call.
    fn read_lines(&mut self) -> std::io::Result<Vec<Vec<u8>>> {
        use std::io::{Read, Seek, SeekFrom};
        let mut f = match std::fs::File::open(&self.path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        f.seek(SeekFrom::Start(self.offset))?;
        let mut new = Vec::new();
        f.read_to_end(&mut new)?;
        self.offset += new.len() as u64;
        self.partial.extend_from_slice(&new);
        let mut lines = Vec::new();
        while let Some(nl) = self.partial.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.partial.drain(..=nl).collect();
            if line.iter().any(|b| !b.is_ascii_whitespace()) {
                lines.push(line);
            }
        }
        Ok(lines)
    }
}

/// One line as the sinks write it (`jsonl.rs`).
#[derive(serde::Deserialize)]
struct Line<'a> {
    id: uuid::Uuid,
    #[serde(default)]
    destination: String,
    #[serde(default)]
    key: String,
    #[serde(default)]
    headers: serde_json::Map<String, serde_json::Value>,
    #[serde(borrow)]
    payload: &'a serde_json::value::RawValue,
}

fn parse(line: &[u8]) -> Option<Delivered> {
    let l: Line<'_> = serde_json::from_slice(line).ok()?;
    Some(Delivered {
        id: l.id,
        destination: l.destination,
        key: l.key,
        headers: l
            .headers
            .into_iter()
            .map(|(k, v)| (k, v.as_str().unwrap_or_default().to_string()))
            .collect(),
        payload: Bytes::copy_from_slice(l.payload.get().as_bytes()),
    })
}

#[async_trait]
impl Reader for FileReader {
    async fn poll(&mut self, wait: Duration) -> Polled {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let mut out = Polled::default();
            // An unreadable file (permissions, a disk error) yields nothing this time.
            for line in self.read_lines().unwrap_or_default() {
                match parse(&line) {
                    Some(d) => out.delivered.push(d),
                    None => out.unreadable += 1,
                }
            }
            if !out.delivered.is_empty()
                || out.unreadable > 0
                || tokio::time::Instant::now() >= deadline
            {
                return out;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn describe(&self) -> String {
        format!("JSON lines in {}", self.path.display())
    }

    async fn cleanup(&mut self) {}
}

/// A fresh file: `file:` alone names one in the temporary directory, `file:PATH` that path
/// (removed first, so a run reads only its own lines).
pub(crate) fn scratch(url: &str, options: &ScratchOptions) -> Result<Scratch, Error> {
    let path = url
        .strip_prefix("file://")
        .or_else(|| url.strip_prefix("file:"))
        .unwrap_or("");
    let path = if path.is_empty() {
        std::env::temp_dir().join(format!("{}.jsonl", options.unique_name()))
    } else {
        PathBuf::from(path)
    };
    match std::fs::remove_file(&path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            return Err(Error::config(format!(
                "file sink: cannot start from an empty {}: {e}",
                path.display()
            )))
        }
    }
    Ok(Scratch {
        sink_url: format!("file:{}", path.display()),
        destination: "{event_type}".into(),
        reader: Box::new(FileReader::new(path)),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[tokio::test]
    async fn lines_are_read_once_and_a_torn_line_waits_for_its_end() {
        let path = std::env::temp_dir().join(format!("reader-{}.jsonl", fastrand::u64(..)));
        let id = uuid::Uuid::now_v7();
        let line = format!(
            r#"{{"id":"{id}","destination":"d","key":"k","headers":{{"h":"v"}},"payload":{{"a":1}}}}"#
        );
        std::fs::write(&path, format!("{line}\n{}", &line[..10])).unwrap();
        let mut r = FileReader::new(&path);
        let p = r.poll(Duration::ZERO).await;
        assert_eq!(p.delivered.len(), 1);
        assert_eq!(p.unreadable, 0);
        let d = &p.delivered[0];
        assert_eq!((d.id, d.key.as_str(), d.header("H")), (id, "k", Some("v")));
        assert_eq!(&d.payload[..], br#"{"a":1}"#);
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        f.write_all(format!("{}\nnot json\n", &line[10..]).as_bytes())
            .unwrap();
        let p = r.poll(Duration::ZERO).await;
        assert_eq!((p.delivered.len(), p.unreadable), (1, 1));
        assert!(r.poll(Duration::ZERO).await.delivered.is_empty());
        std::fs::remove_file(&path).unwrap();
    }
}
