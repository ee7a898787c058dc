//! [`NatsReader`]: reads a scratch JetStream stream with a consumer of its own.

use std::time::Duration;

use async_nats::jetstream::{self, consumer};
use async_trait::async_trait;
use futures::StreamExt;
use outbox_core::{Error, ErrorKind};

use super::config::NatsConfig;
use crate::read::{Delivered, Polled, Reader, Scratch, ScratchOptions};

/// How long a stream remembers message ids for dedupe in scratch streams: longer than any
/// relay retry in a test, bench or verify run.
const SCRATCH_DUPLICATE_WINDOW: Duration = Duration::from_secs(120);

/// Creates the stream `name` capturing `subjects` (file storage when `durable`, else memory),
/// with a two-minute duplicate window: the one place tests, benches and `verify` make streams.
pub async fn create_stream(
    js: &jetstream::Context,
    name: &str,
    subjects: Vec<String>,
    durable: bool,
) -> Result<jetstream::stream::Stream, Error> {
    js.create_stream(jetstream::stream::Config {
        name: name.to_string(),
        subjects,
        storage: if durable {
            jetstream::stream::StorageType::File
        } else {
            jetstream::stream::StorageType::Memory
        },
        duplicate_window: SCRATCH_DUPLICATE_WINDOW,
        ..Default::default()
    })
    .await
    .map_err(|e| {
        Error::with_source(
            ErrorKind::Connection,
            format!("nats: creating stream {name} (is NATS running with JetStream?): {e}"),
            e,
        )
    })
}

/// An unacknowledged consumer of one stream: every message once, in stream order.
///
/// A caller may leave it unpolled for a long time (`verify` while a fault runs): the server
/// keeps the consumer for [`INACTIVE_THRESHOLD`] without pull requests, and if its message
/// stream ends anyway the reader opens a new consumer after the last stream sequence it read,
/// so nothing is skipped and nothing read twice.
pub struct NatsReader {
    js: jetstream::Context,
    stream: String,
    messages: consumer::pull::Stream,
    /// The stream sequence of the last message handed out (0 before the first).
    last_seq: u64,
}

/// How long the server keeps an ephemeral consumer nobody pulls from (its default is seconds).
const INACTIVE_THRESHOLD: Duration = Duration::from_secs(3600);

impl NatsReader {
    /// A reader of `stream` from its first message.
    pub async fn open(js: jetstream::Context, stream: &str) -> Result<Self, Error> {
        let messages = consume(&js, stream, 1).await?;
        Ok(Self {
            js,
            stream: stream.to_string(),
            messages,
            last_seq: 0,
        })
    }

    /// A new consumer from the message after the last one read, in place of one that ended.
    async fn reopen(&mut self) -> Result<(), Error> {
        self.messages = consume(&self.js, &self.stream, self.last_seq + 1).await?;
        Ok(())
    }

    /// Messages the stream holds: what the broker acknowledged, deduplicated by id.
    pub async fn stored(&self) -> Result<u64, Error> {
        let mut s = self
            .js
            .get_stream(&self.stream)
            .await
            .map_err(|e| Error::config(format!("nats: no stream {}: {e}", self.stream)))?;
        let info = s
            .info()
            .await
            .map_err(|e| Error::config(format!("nats: stream info of {}: {e}", self.stream)))?;
        Ok(info.state.messages)
    }
}

#[async_trait]
impl Reader for NatsReader {
    async fn poll(&mut self, wait: Duration) -> Polled {
        let mut out = Polled::default();
        // Bounded, so a caller polling a busy stream gets control back regularly.
        let until = tokio::time::Instant::now() + wait.max(Duration::from_millis(20));
        while tokio::time::Instant::now() < until {
            let m = match tokio::time::timeout(Duration::from_millis(20), self.messages.next())
                .await
            {
                Err(_) if out.delivered.is_empty() && out.unreadable == 0 => continue,
                Err(_) => break,
                // The consumer's stream ended or failed (the server dropped the consumer after
                // a long quiet spell, a missed heartbeat while the broker restarted): nothing
                // was consumed; a new consumer from the next sequence, then try again next time.
                Ok(None) | Ok(Some(Err(_))) => {
                    if let Err(error) = self.reopen().await {
                        tracing::warn!(stream = %self.stream, %error, "nats reader: could not open a new consumer; will try again");
                    }
                    break;
                }
                Ok(Some(Ok(m))) => m,
            };
            if let Ok(info) = m.info() {
                self.last_seq = info.stream_sequence;
            }
            let headers = m
                .headers
                .as_ref()
                .map(|h| {
                    h.iter()
                        .flat_map(|(k, vs)| {
                            vs.iter()
                                .map(move |v| (k.to_string(), v.as_str().to_string()))
                        })
                        .collect()
                })
                .unwrap_or_default();
            match Delivered::from_headers(m.subject.to_string(), headers, m.payload.clone()) {
                Some(d) => out.delivered.push(d),
                None => out.unreadable += 1,
            }
        }
        out
    }

    fn describe(&self) -> String {
        format!("NATS JetStream stream {}", self.stream)
    }

    async fn cleanup(&mut self) {
        if let Err(error) = self.js.delete_stream(&self.stream).await {
            tracing::warn!(stream = %self.stream, %error, "could not delete a scratch stream");
        }
    }
}

/// The message stream of a new unacknowledged consumer of `stream`, from sequence `from`.
async fn consume(
    js: &jetstream::Context,
    stream: &str,
    from: u64,
) -> Result<consumer::pull::Stream, Error> {
    let consumer: consumer::PullConsumer = js
        .get_stream(stream)
        .await
        .map_err(|e| Error::config(format!("nats: no stream {stream}: {e}")))?
        .create_consumer(consumer::pull::Config {
            ack_policy: consumer::AckPolicy::None,
            deliver_policy: consumer::DeliverPolicy::ByStartSequence {
                start_sequence: from,
            },
            inactive_threshold: INACTIVE_THRESHOLD,
            ..Default::default()
        })
        .await
        .map_err(|e| Error::config(format!("nats: consumer on {stream}: {e}")))?;
    consumer
        .messages()
        .await
        .map_err(|e| Error::config(format!("nats: reading {stream}: {e}")))
}

/// A stream `OUTBOX_<TAG>_<suffix>` capturing `outbox_<tag>_<suffix>.>`, and a reader of it;
/// the relay publishes to `outbox_<tag>_<suffix>.{event_type}`.
pub(crate) async fn scratch(url: &str, options: &ScratchOptions) -> Result<Scratch, Error> {
    let client = NatsConfig::from_url(url)?.connect_client().await?;
    let js = jetstream::new(client);
    let prefix = options.unique_name();
    let stream = prefix.to_ascii_uppercase();
    create_stream(&js, &stream, vec![format!("{prefix}.>")], options.durable).await?;
    let reader = match NatsReader::open(js.clone(), &stream).await {
        Ok(r) => r,
        Err(e) => {
            let _ = js.delete_stream(&stream).await;
            return Err(e);
        }
    };
    Ok(Scratch {
        sink_url: url.to_string(),
        destination: format!("{prefix}.{{event_type}}"),
        reader: Box::new(reader),
    })
}
