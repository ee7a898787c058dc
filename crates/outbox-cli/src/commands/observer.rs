//! An independent reader of what reached the broker, for `demo` and `verify`: tails the
//! `file:` sink's JSON lines, or reads a JetStream stream of its own with a separate consumer.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use futures::StreamExt;
use outbox_core::{DestinationTemplate, Sink};
use uuid::Uuid;

/// One message as a consumer sees it.
pub struct Delivered {
    /// Message id.
    pub id: Uuid,
    /// The payload.
    pub payload: serde_json::Value,
    /// Ordering key.
    pub key: String,
}

/// The broker and an independent reader of what reached it.
// One value per command run: its size does not matter, boxing would only add noise.
#[allow(clippy::large_enum_variant)]
pub enum Broker {
    /// JSON-lines files: the `file:` sink's, or each relay's standard output (`stdout:`).
    Files(Vec<Tail>),
    Nats {
        js: async_nats::jetstream::Context,
        stream: String,
        messages: Box<async_nats::jetstream::consumer::pull::Stream>,
    },
}

impl Broker {
    /// Prepares the broker (a fresh file, or a stream named after `tag`); returns it, the relay's sink and the destination template.
    pub async fn open(
        url: &str,
        tag: &str,
    ) -> anyhow::Result<(Self, Arc<dyn Sink>, DestinationTemplate)> {
        if let Some(path) = url
            .strip_prefix("file://")
            .or_else(|| url.strip_prefix("file:"))
        {
            let _ = std::fs::remove_file(path);
            let sink = outbox_sinks::connect(url).await?;
            let broker = Self::Files(vec![Tail::new(PathBuf::from(path))]);
            Ok((broker, sink, DestinationTemplate::parse("{event_type}")?))
        } else if url.starts_with("nats://") {
            use async_nats::jetstream;
            let sfx = format!("{:08x}", fastrand::u32(..));
            // The reader needs only the server; sink options (`?ack_timeout=`) are the relay's.
            let server = url.split('?').next().unwrap_or(url);
            let client = async_nats::connect(server)
                .await
                .context("connecting to NATS")?;
            let js = jetstream::new(client);
            let stream = format!("OUTBOX_{}_{sfx}", tag.to_uppercase());
            let prefix = format!("outbox_{tag}_{sfx}");
            let st = js
                .create_stream(jetstream::stream::Config {
                    name: stream.clone(),
                    subjects: vec![format!("{prefix}.>")],
                    storage: jetstream::stream::StorageType::File,
                    duplicate_window: Duration::from_secs(120),
                    ..Default::default()
                })
                .await
                .context("creating a stream (is NATS running with JetStream?)")?;
            let consumer: jetstream::consumer::PullConsumer = st
                .create_consumer(jetstream::consumer::pull::Config {
                    ack_policy: jetstream::consumer::AckPolicy::None,
                    ..Default::default()
                })
                .await?;
            let messages = Box::new(consumer.messages().await?);
            let sink = outbox_sinks::connect(url).await?;
            Ok((
                Self::Nats {
                    js,
                    stream,
                    messages,
                },
                sink,
                DestinationTemplate::parse(&format!("{prefix}.{{event_type}}"))?,
            ))
        } else {
            anyhow::bail!(
                "broker `{}`: use file:path.jsonl or nats://host:port",
                outbox_core::redact::url(url)
            )
        }
    }

    /// A reader of the relays' standard output, for the `stdout:` sink: every relay appends to
    /// the one file (`O_APPEND`, one write per batch), so its lines are in arrival order.
    pub fn stdout_file(path: PathBuf) -> (Self, DestinationTemplate) {
        (
            Self::Files(vec![Tail::new(path)]),
            DestinationTemplate::default(),
        )
    }

    /// Everything that arrived since the last call, and how many items could not be read (a
    /// torn line, a message without an id). Never fails half-way: what was read is returned, so
    /// nothing consumed is dropped; a broker that is down yields nothing until it is back.
    pub async fn poll(&mut self) -> (Vec<Delivered>, usize) {
        let mut out = Vec::new();
        let mut unreadable = 0;
        match self {
            Self::Files(tails) => {
                for tail in tails.iter_mut() {
                    let Ok(lines) = tail.read_lines() else {
                        continue;
                    };
                    for line in lines {
                        match serde_json::from_str::<serde_json::Value>(&line)
                            .map_err(anyhow::Error::from)
                            .and_then(|v| {
                                parse_event(
                                    &v["id"],
                                    v["key"].as_str().unwrap_or_default(),
                                    &v["payload"],
                                )
                            }) {
                            Ok(d) => out.push(d),
                            Err(_) => unreadable += 1,
                        }
                    }
                }
            }
            Self::Nats { messages, .. } => {
                // Bounded, so a caller polling a busy stream gets control back regularly.
                let until = tokio::time::Instant::now() + Duration::from_millis(250);
                while tokio::time::Instant::now() < until {
                    let Ok(Some(m)) =
                        tokio::time::timeout(Duration::from_millis(20), messages.next()).await
                    else {
                        break;
                    };
                    // A stream error (missed heartbeat while the broker restarts) consumed
                    // nothing: stop this poll and try again next time.
                    let Ok(m) = m else { break };
                    let header = |name: &str| {
                        m.headers
                            .as_ref()
                            .and_then(|h| h.get(name))
                            .map(|v| v.as_str().to_string())
                            .unwrap_or_default()
                    };
                    let id = header(outbox_core::sink::HEADER_MESSAGE_ID);
                    let key = header(outbox_core::sink::HEADER_AGGREGATE_ID);
                    match serde_json::from_slice::<serde_json::Value>(&m.payload)
                        .map_err(anyhow::Error::from)
                        .and_then(|payload| {
                            parse_event(&serde_json::Value::String(id), &key, &payload)
                        }) {
                        Ok(d) => out.push(d),
                        Err(_) => unreadable += 1,
                    }
                }
            }
        }
        (out, unreadable)
    }

    pub fn describe(&self) -> String {
        match self {
            Self::Files(t) => {
                let paths: Vec<String> = t.iter().map(|t| t.path.display().to_string()).collect();
                format!("JSON lines in {}", paths.join(", "))
            }
            Self::Nats { stream, .. } => format!("NATS JetStream stream {stream}"),
        }
    }

    pub async fn cleanup(&self) {
        if let Self::Nats { js, stream, .. } = self {
            let _ = js.delete_stream(stream).await;
        }
    }
}

fn parse_event(
    id: &serde_json::Value,
    key: &str,
    payload: &serde_json::Value,
) -> anyhow::Result<Delivered> {
    let id = id
        .as_str()
        .and_then(|s| s.parse().ok())
        .context("message without an id")?;
    Ok(Delivered {
        id,
        payload: payload.clone(),
        key: key.to_string(),
    })
}

/// Reads a growing JSON-lines file from where the last read stopped.
pub struct Tail {
    path: PathBuf,
    offset: u64,
    partial: String,
}

impl Tail {
    /// A reader of `path` from its start (the file may not exist yet).
    pub fn new(path: PathBuf) -> Self {
        Self {
            path,
            offset: 0,
            partial: String::new(),
        }
    }

    /// Complete lines appended since the last call.
    fn read_lines(&mut self) -> anyhow::Result<Vec<String>> {
        use std::io::{Read, Seek, SeekFrom};
        let mut f = match std::fs::File::open(&self.path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e.into()),
        };
        f.seek(SeekFrom::Start(self.offset))?;
        let mut new = Vec::new();
        f.read_to_end(&mut new)?;
        self.offset += new.len() as u64;
        self.partial.push_str(&String::from_utf8_lossy(&new));
        let mut lines = Vec::new();
        while let Some(nl) = self.partial.find('\n') {
            let line: String = self.partial.drain(..=nl).collect();
            let line = line.trim_end();
            if !line.is_empty() {
                lines.push(line.to_string());
            }
        }
        Ok(lines)
    }
}
