//! [`RedisSource`]: a Redis Streams consumer group, `XACK`ed after the ingest committed.
//!
//! Entries written by the Redis Streams sink of `outbox relay` carry the fields `id`, `key`,
//! `headers` (a JSON object, with `outbox-event-type`) and `payload`; other entries are read as
//! well: `type`/`key`/`payload` (or `data`/`body`) fields when present, and a stable id made
//! from the stream and the entry id.
//!
//! **Order across crashes.** The consumer name is stable (`outbox-inbox` unless given), so a
//! restarted daemon first reads its own pending entries (`XREADGROUP … 0`), in entry order,
//! before anything new (`>`); and it first takes over, with `XAUTOCLAIM`, the pending entries of
//! any other consumer of the group (one daemon ingests a source at a time, so those belong to a
//! dead one). Pending entries are always older than undelivered ones, so nothing newer is
//! ingested before them.

use std::collections::HashMap;

use async_trait::async_trait;
use outbox_core::options::{QueryOptions, Role};
use outbox_core::{Error, ErrorKind, Result};
use redis::aio::ConnectionManager;
use redis::Value;
use tracing::{info, warn};

use super::{AckInner, AckToken, Delivery, Source, SourceRetention};
use crate::message::{position_id, InboxMessage};

/// Default consumer group.
pub const DEFAULT_GROUP: &str = "outbox-inbox";
/// Default consumer name (stable, so a restarted daemon finds its pending entries).
pub const DEFAULT_CONSUMER: &str = "outbox-inbox";

/// Where and how to consume.
#[derive(Debug, Clone)]
pub struct RedisSourceConfig {
    /// The server URL without the source options (may hold credentials: never printed).
    url: String,
    /// TLS and the password from a file or variable.
    connection: outbox_sinks::redis::RedisConnection,
    /// The stream key.
    pub stream: String,
    /// The consumer group (created at `start` when missing, with the stream).
    pub group: String,
    /// This daemon's consumer name.
    pub consumer: String,
    /// Where a group the source creates starts: `0` (the whole stream, the default) or `$`
    /// (only new entries).
    pub start: String,
    /// The `source` column: `redis:<stream>` unless given.
    pub name: String,
}

impl RedisSourceConfig {
    /// Parses `redis://[user:pass@]host:port[/db]?stream=K[&group=G][&consumer=C][&start=0]
    /// [&name=N]`.
    pub fn from_url(url: &str) -> Result<Self> {
        // The sink's TLS and credential options mean the same here.
        let known: Vec<&str> = ["stream", "group", "consumer", "start", "name"]
            .into_iter()
            .chain(outbox_sinks::redis::CONNECTION_OPTIONS.iter().copied())
            .collect();
        let (base, o) = QueryOptions::from_url(Role::Source, url, &known)?;
        let connection = outbox_sinks::redis::RedisConnection::from_options(base, &o)?;
        let stream = o.str("stream");
        let group = o.non_empty("group")?.unwrap_or(DEFAULT_GROUP).to_string();
        let consumer = o
            .non_empty("consumer")?
            .unwrap_or(DEFAULT_CONSUMER)
            .to_string();
        // `0`: the whole stream; `$`: only entries added after the group was made.
        let start = o
            .one_of("start", &[("0", "0"), ("$", "$")])?
            .unwrap_or("0")
            .to_string();
        let name = o.non_empty("name")?;
        let stream = stream.filter(|s| !s.is_empty()).ok_or_else(|| {
            Error::config(format!(
                "source `{}`: name the stream key, e.g. redis://127.0.0.1:6379?stream=orders",
                outbox_core::redact::url(url)
            ))
        })?;
        Ok(Self {
            url: base.to_string(),
            connection,
            name: name.map_or_else(|| format!("redis:{stream}"), str::to_string),
            stream: stream.to_string(),
            group,
            consumer,
            start,
        })
    }
}

/// A Redis Streams consumer group as an inbox source.
pub struct RedisSource {
    cfg: RedisSourceConfig,
    conn: ConnectionManager,
    /// Reading this consumer's own pending entries after this id; `None` once they are read.
    pending_after: Option<String>,
}

fn redis_error(what: &str, e: redis::RedisError) -> Error {
    let kind = if e.is_io_error() || e.is_connection_dropped() || e.is_timeout() {
        ErrorKind::Connection
    } else {
        ErrorKind::Other
    };
    Error::new(
        kind,
        outbox_core::redact::sanitize(&format!("redis source: {what}: {e}")),
    )
}

/// Text of a bulk or simple string value.
fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::VerbatimString { text, .. } => Some(text.clone()),
        Value::Int(i) => Some(i.to_string()),
        _ => None,
    }
}

/// An entry as (id, fields), fields `None` for an entry deleted from the stream while pending.
type Entry = (String, Option<HashMap<String, Vec<u8>>>);

fn entry(v: &Value) -> Option<Entry> {
    let Value::Array(parts) = v else { return None };
    let id = text(parts.first()?)?;
    let fields = match parts.get(1) {
        Some(Value::Array(kv)) => {
            let mut map = HashMap::new();
            for pair in kv.chunks(2) {
                if let [k, v] = pair {
                    let value = match v {
                        Value::BulkString(b) => b.clone(),
                        other => text(other).unwrap_or_default().into_bytes(),
                    };
                    map.insert(text(k)?, value);
                }
            }
            Some(map)
        }
        Some(Value::Map(kv)) => Some(
            kv.iter()
                .filter_map(|(k, v)| {
                    Some((
                        text(k)?,
                        match v {
                            Value::BulkString(b) => b.clone(),
                            other => text(other).unwrap_or_default().into_bytes(),
                        },
                    ))
                })
                .collect(),
        ),
        _ => None,
    };
    Some((id, fields))
}

/// The entries of an `XREADGROUP` reply (one stream).
fn read_reply(v: &Value) -> Vec<Entry> {
    let streams: Vec<&Value> = match v {
        Value::Array(items) => items
            .iter()
            .filter_map(|s| match s {
                Value::Array(pair) => pair.get(1),
                _ => None,
            })
            .collect(),
        Value::Map(items) => items.iter().map(|(_, entries)| entries).collect(),
        _ => Vec::new(),
    };
    streams
        .into_iter()
        .filter_map(|e| match e {
            Value::Array(entries) => Some(entries.iter().filter_map(entry).collect::<Vec<_>>()),
            _ => None,
        })
        .flatten()
        .collect()
}

impl RedisSource {
    /// Connects (reconnecting by itself later) and creates the group when missing.
    pub async fn connect(cfg: RedisSourceConfig) -> Result<Self> {
        let client = cfg.connection.client(&cfg.url)?;
        let mut conn = ConnectionManager::new(client)
            .await
            .map_err(|e| redis_error("connecting", e))?;
        let created: std::result::Result<Value, _> = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(&cfg.stream)
            .arg(&cfg.group)
            .arg(&cfg.start)
            .arg("MKSTREAM")
            .query_async(&mut conn)
            .await;
        match created {
            Ok(_) => {
                info!(stream = %cfg.stream, group = %cfg.group, start = %cfg.start, "consumer group created")
            }
            Err(e) if e.code() == Some("BUSYGROUP") => {}
            Err(e) => return Err(redis_error("creating the consumer group", e)),
        }
        Ok(Self {
            cfg,
            conn,
            pending_after: None,
        })
    }

    fn delivery(&self, (entry_id, fields): Entry) -> Option<Delivery> {
        let fields = fields?;
        let field = |name: &str| {
            fields
                .get(name)
                .map(|b| String::from_utf8_lossy(b).into_owned())
        };
        let mut headers: Vec<(String, String)> = field("headers")
            .and_then(|h| {
                serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(&h).ok()
            })
            .map(|m| {
                m.into_iter()
                    .map(|(k, v)| match v {
                        serde_json::Value::String(s) => (k, s),
                        other => (k, other.to_string()),
                    })
                    .collect()
            })
            .unwrap_or_default();
        // The sink's `id` field is the outbox message id: as a header, it wins like one.
        if let Some(id) = field("id") {
            if !headers
                .iter()
                .any(|(k, _)| k.eq_ignore_ascii_case(outbox_core::sink::HEADER_MESSAGE_ID))
            {
                headers.push((outbox_core::sink::HEADER_MESSAGE_ID.to_string(), id));
            }
        }
        let body = ["payload", "data", "body"]
            .iter()
            .find_map(|k| fields.get(*k))
            .cloned()
            .unwrap_or_default();
        let fallback_type = field("type").unwrap_or_else(|| self.cfg.stream.clone());
        let mut message = InboxMessage::from_broker(
            &self.cfg.name,
            &body,
            headers,
            position_id(&format!("redis:{}", self.cfg.stream), &entry_id),
            &fallback_type,
            field("key").as_deref(),
        );
        message.source_position = Some(entry_id.clone());
        Some(Delivery {
            message,
            ack: AckToken(AckInner::Redis(entry_id)),
        })
    }

    async fn read(&mut self, max: usize, id: &str) -> Result<Vec<Entry>> {
        let reply: Value = redis::cmd("XREADGROUP")
            .arg("GROUP")
            .arg(&self.cfg.group)
            .arg(&self.cfg.consumer)
            .arg("COUNT")
            .arg(max.max(1))
            .arg("STREAMS")
            .arg(&self.cfg.stream)
            .arg(id)
            .query_async(&mut self.conn)
            .await
            .map_err(|e| redis_error("XREADGROUP", e))?;
        Ok(read_reply(&reply))
    }

    async fn xack(&mut self, ids: &[String]) -> Result<()> {
        if ids.is_empty() {
            return Ok(());
        }
        let _: Value = redis::cmd("XACK")
            .arg(&self.cfg.stream)
            .arg(&self.cfg.group)
            .arg(ids)
            .query_async(&mut self.conn)
            .await
            .map_err(|e| redis_error("XACK", e))?;
        Ok(())
    }
}

#[async_trait]
impl Source for RedisSource {
    fn name(&self) -> &str {
        &self.cfg.name
    }

    fn describe(&self) -> String {
        format!(
            "Redis stream {} (group {}, consumer {}) at {}",
            self.cfg.stream,
            self.cfg.group,
            self.cfg.consumer,
            outbox_core::redact::url(&self.cfg.url)
        )
    }

    async fn recover(&mut self) -> Result<()> {
        // Other consumers' pending entries become ours (they belong to a dead daemon).
        let mut cursor = "0-0".to_string();
        let mut claimed = 0usize;
        loop {
            let reply: Value = redis::cmd("XAUTOCLAIM")
                .arg(&self.cfg.stream)
                .arg(&self.cfg.group)
                .arg(&self.cfg.consumer)
                .arg(0)
                .arg(&cursor)
                .arg("COUNT")
                .arg(1000)
                .arg("JUSTID")
                .query_async(&mut self.conn)
                .await
                .map_err(|e| redis_error("XAUTOCLAIM", e))?;
            let Value::Array(parts) = reply else { break };
            if let Some(Value::Array(ids)) = parts.get(1) {
                claimed += ids.len();
            }
            match parts.first().and_then(text) {
                Some(next) if next != "0-0" => cursor = next,
                _ => break,
            }
        }
        if claimed > 0 {
            warn!(source = %self.cfg.name, pending = claimed, "the group had entries delivered and never acknowledged (a dead daemon's, or this consumer's before a restart): they are recorded first");
        }
        self.pending_after = Some("0".to_string());
        Ok(())
    }

    async fn fetch(&mut self, max: usize) -> Result<Vec<Delivery>> {
        if let Some(after) = self.pending_after.clone() {
            let entries = self.read(max, &after).await?;
            if entries.is_empty() {
                self.pending_after = None;
            } else {
                if let Some((last, _)) = entries.last() {
                    self.pending_after = Some(last.clone());
                }
                info!(source = %self.cfg.name, entries = entries.len(), "pending entries delivered again");
                let mut out = Vec::with_capacity(entries.len());
                let mut gone = Vec::new();
                for e in entries {
                    let id = e.0.clone();
                    match self.delivery(e) {
                        Some(d) => out.push(d),
                        None => gone.push(id),
                    }
                }
                if !gone.is_empty() {
                    warn!(source = %self.cfg.name, entries = ?gone,
                          "pending entries were trimmed from the stream before they were ingested; they are lost upstream");
                    self.xack(&gone).await?;
                }
                return Ok(out);
            }
        }
        let entries = self.read(max, ">").await?;
        Ok(entries
            .into_iter()
            .filter_map(|e| self.delivery(e))
            .collect())
    }

    async fn ack(&mut self, acks: Vec<AckToken>) -> Result<()> {
        let ids: Vec<String> = acks
            .into_iter()
            .filter_map(|a| match a.0 {
                AckInner::Redis(id) => Some(id),
                #[allow(unreachable_patterns)]
                _ => None,
            })
            .collect();
        self.xack(&ids).await
    }

    async fn retention(&mut self) -> Result<SourceRetention> {
        Ok(SourceRetention::Unknown)
    }
}

/// This source's entry in [`super::SOURCES`].
pub(super) const KIND: super::SourceKind = super::SourceKind {
    schemes: &["redis", "rediss"],
    listed: "redis://",
    open: |url, _| {
        super::boxed(async move { RedisSource::connect(RedisSourceConfig::from_url(url)?).await })
    },
    check: |url| RedisSourceConfig::from_url(url).map(|_| ()),
};

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn url_options_parse() {
        let c = RedisSourceConfig::from_url(
            "redis://:pw@127.0.0.1:6379/0?stream=orders&group=g&consumer=c&start=$",
        )
        .unwrap();
        assert_eq!(
            (
                c.stream.as_str(),
                c.group.as_str(),
                c.consumer.as_str(),
                c.start.as_str()
            ),
            ("orders", "g", "c", "$")
        );
        assert_eq!(c.name, "redis:orders");
        assert!(RedisSourceConfig::from_url("redis://h").is_err());
        assert!(RedisSourceConfig::from_url("redis://h?stream=s&start=5").is_err());
    }

    #[test]
    fn replies_parse_including_deleted_entries() {
        let bulk = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let reply = Value::Array(vec![Value::Array(vec![
            bulk("orders"),
            Value::Array(vec![
                Value::Array(vec![
                    bulk("1-0"),
                    Value::Array(vec![bulk("payload"), bulk("{}")]),
                ]),
                Value::Array(vec![bulk("2-0"), Value::Nil]),
            ]),
        ])]);
        let got = read_reply(&reply);
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].0, "1-0");
        assert_eq!(got[0].1.as_ref().unwrap()["payload"], b"{}");
        assert!(got[1].1.is_none());
        assert!(read_reply(&Value::Nil).is_empty());
    }
}
