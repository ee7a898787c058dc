//! [`RedisReader`]: reads a scratch stream from its first entry with `XREAD`.

use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use outbox_core::sink::HEADER_AGGREGATE_ID;
use outbox_core::Error;
use redis::aio::MultiplexedConnection;
use redis::streams::{StreamId, StreamReadOptions, StreamReadReply};
use redis::{AsyncCommands, Value};

use super::config::RedisConfig;
use crate::read::{Delivered, Polled, Reader, Scratch, ScratchOptions};

/// Entries read per `XREAD`.
const COUNT: usize = 5_000;

/// Reads one stream from where the last read stopped (entry id `0` at first), so it sees every
/// entry once, in stream order, across its own reconnects and the server's restarts (when the
/// server keeps its data).
pub struct RedisReader {
    cfg: RedisConfig,
    stream: String,
    last_id: String,
    conn: Option<MultiplexedConnection>,
}

impl RedisReader {
    /// A reader of `stream` from its first entry.
    pub fn new(cfg: RedisConfig, stream: &str) -> Self {
        Self {
            cfg,
            stream: stream.to_string(),
            last_id: "0".into(),
            conn: None,
        }
    }

    async fn connection(&mut self) -> Result<MultiplexedConnection, Error> {
        if let Some(c) = &self.conn {
            return Ok(c.clone());
        }
        let client = self.cfg.client()?;
        let c = tokio::time::timeout(
            Duration::from_secs(5),
            client.get_multiplexed_async_connection(),
        )
        .await
        .map_err(|_| {
            Error::new(
                outbox_core::ErrorKind::Connection,
                "redis: connect timed out",
            )
        })?
        .map_err(|e| {
            Error::new(
                outbox_core::ErrorKind::Connection,
                format!("redis: cannot connect to {}: {e}", self.cfg.display),
            )
        })?;
        self.conn = Some(c.clone());
        Ok(c)
    }

    /// Entries in the stream (duplicates included: Redis keeps whatever was appended).
    pub async fn stored(&mut self) -> Result<u64, Error> {
        let mut c = self.connection().await?;
        c.xlen(&self.stream).await.map_err(|e| {
            Error::new(
                outbox_core::ErrorKind::Connection,
                format!("redis: XLEN: {e}"),
            )
        })
    }
}

fn text(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

/// One entry as the checker sees it: `id`, `key`, `headers` (a JSON object) and `payload`.
fn delivered(stream: &str, entry: &StreamId) -> Option<Delivered> {
    let id = text(entry.map.get("id"))?.parse().ok()?;
    let headers: Vec<(String, String)> = text(entry.map.get("headers"))
        .and_then(|h| serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(&h).ok())
        .map(|m| {
            m.into_iter()
                .map(|(k, v)| (k, v.as_str().map(str::to_string).unwrap_or(v.to_string())))
                .collect()
        })
        .unwrap_or_default();
    let key = text(entry.map.get("key")).unwrap_or_else(|| {
        headers
            .iter()
            .find(|(k, _)| k == HEADER_AGGREGATE_ID)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    });
    let payload = match entry.map.get("payload")? {
        Value::BulkString(b) => Bytes::from(b.clone()),
        _ => return None,
    };
    Some(Delivered {
        id,
        destination: stream.to_string(),
        key,
        headers,
        payload,
    })
}

#[async_trait]
impl Reader for RedisReader {
    async fn poll(&mut self, wait: Duration) -> Polled {
        let mut out = Polled::default();
        let Ok(mut conn) = self.connection().await else {
            tokio::time::sleep(wait.min(Duration::from_millis(200))).await;
            return out;
        };
        let opts = StreamReadOptions::default()
            .count(COUNT)
            .block(wait.as_millis().max(1) as usize);
        let reply: redis::RedisResult<Option<StreamReadReply>> = tokio::time::timeout(
            wait + Duration::from_secs(2),
            conn.xread_options(&[&self.stream], &[&self.last_id], &opts),
        )
        .await
        .unwrap_or_else(|_| Err(std::io::Error::from(std::io::ErrorKind::TimedOut).into()));
        match reply {
            Ok(Some(r)) => {
                for entry in r.keys.iter().flat_map(|k| k.ids.iter()) {
                    self.last_id = entry.id.clone();
                    match delivered(&self.stream, entry) {
                        Some(d) => out.delivered.push(d),
                        None => out.unreadable += 1,
                    }
                }
            }
            Ok(None) => {}
            Err(_) => {
                // Reconnect next time; `last_id` keeps the place.
                self.conn = None;
                tokio::time::sleep(wait.min(Duration::from_millis(200))).await;
            }
        }
        out
    }

    fn describe(&self) -> String {
        format!("Redis stream {} on {}", self.stream, self.cfg.display)
    }

    async fn cleanup(&mut self) {
        let stream = self.stream.clone();
        let result = async {
            let mut c = self.connection().await?;
            let _: () = c.del(&stream).await.map_err(|e| {
                Error::new(
                    outbox_core::ErrorKind::Connection,
                    format!("redis: DEL: {e}"),
                )
            })?;
            // Dedupe markers, if the sink wrote any, expire with their window.
            Ok::<(), Error>(())
        }
        .await;
        if let Err(error) = result {
            tracing::warn!(stream = %self.stream, %error, "could not delete a scratch stream");
        }
    }
}

/// A stream `outbox_<tag>_<suffix>` (created by the first `XADD`) and a reader of it; the relay
/// publishes every row to it.
pub(crate) async fn scratch(url: &str, options: &ScratchOptions) -> Result<Scratch, Error> {
    let cfg = RedisConfig::from_url(url)?;
    let stream = options.unique_name();
    let mut reader = RedisReader::new(cfg, &stream);
    // Fail now, not in the first poll, when the server is not there.
    reader.connection().await?;
    Ok(Scratch {
        sink_url: url.to_string(),
        destination: stream,
        reader: Box::new(reader),
    })
}
