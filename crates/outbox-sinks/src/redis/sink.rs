//! [`RedisSink`]: appends envelopes to streams with one pipelined `XADD` per message, all of a
//! call in one round trip.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use outbox_core::{Envelope, Error, Sink, SinkError};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{RedisResult, ServerErrorKind, Value};

use super::config::RedisConfig;
use super::error::classify;

/// Appends one message unless its dedupe marker exists. `KEYS[1]` the stream, `KEYS[2]` the
/// marker; `ARGV[1]` the window in ms, `ARGV[2]` the `MAXLEN ~` bound or `""`, then the
/// field/value pairs. Returns the entry id, or `false` for a duplicate. A failed `XADD` (a key
/// of another type) removes the marker again, so the retry of a refused message is never taken
/// for a duplicate. Atomic, as every Redis script is.
const DEDUPE_XADD: &str = r"
if not redis.call('SET', KEYS[2], '1', 'NX', 'PX', ARGV[1]) then
  return false
end
local added
if ARGV[2] ~= '' then
  added = redis.pcall('XADD', KEYS[1], 'MAXLEN', '~', ARGV[2], '*', unpack(ARGV, 3))
else
  added = redis.pcall('XADD', KEYS[1], '*', unpack(ARGV, 3))
end
if type(added) == 'table' and added.err then
  redis.call('DEL', KEYS[2])
end
return added
";

/// Redis Streams sink.
///
/// Each message is one `XADD <destination> [MAXLEN ~ N] * id <uuid> key <aggregate id>
/// headers <JSON object> payload <bytes>`; the messages of a call go out in one pipeline and
/// each gets its own reply. `Ok` means Redis answered with the new entry's id: the entry is in
/// the server's memory, and on disk as its `appendonly`/`appendfsync` settings promise (with
/// `appendfsync always`, before the reply). With `?dedupe=` a message whose id was appended
/// within the window is acknowledged without being appended again.
pub struct RedisSink {
    cfg: RedisConfig,
    conn: ConnectionManager,
    /// Whether the dedupe script is in the server's script cache (lost when it restarts).
    script_loaded: AtomicBool,
    script_sha: String,
}

impl RedisSink {
    /// A sink for `cfg`. Connects lazily: a server that is down is an outage of the publishes,
    /// which reconnect, not an error here.
    pub fn connect(cfg: RedisConfig) -> Result<Self, Error> {
        let manager = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(cfg.ack_timeout))
            .set_response_timeout(Some(cfg.ack_timeout))
            // Reconnecting is the relay's business (backoff, circuit): one quick try here.
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_millis(200));
        let conn =
            ConnectionManager::new_lazy_with_config(cfg.client()?, manager).map_err(|e| {
                Error::config(format!(
                    "redis: {}: {}",
                    cfg.display,
                    outbox_core::redact::sanitize(&e.to_string())
                ))
            })?;
        Ok(Self {
            cfg,
            conn,
            script_loaded: AtomicBool::new(false),
            script_sha: redis::Script::new(DEDUPE_XADD).get_hash().to_string(),
        })
    }

    /// Checks that `e` can be appended at all; an invalid message when it never can.
    fn check(&self, e: &Envelope) -> Result<(), SinkError> {
        if e.payload.len() as u64 > self.cfg.max_message_size {
            return Err(SinkError::invalid(format!(
                "redis: the message for stream `{}` is {} bytes; max_message_size is {} bytes",
                e.destination,
                e.payload.len(),
                self.cfg.max_message_size
            )));
        }
        Ok(())
    }

    /// The command appending `e`: a plain `XADD`, or the dedupe script. Fields: `id`, `key`,
    /// `headers` (a JSON object of strings) and `payload` (the bytes as written).
    fn command(&self, e: &Envelope) -> redis::Cmd {
        // A map of strings always serialises; an empty object is the only fallback needed.
        let headers = serde_json::to_vec(&e.header_map()).unwrap_or_else(|_| b"{}".to_vec());
        let mut c;
        match self.cfg.dedupe {
            None => {
                c = redis::cmd("XADD");
                c.arg(&e.destination);
                if let Some(n) = self.cfg.maxlen {
                    c.arg("MAXLEN").arg("~").arg(n);
                }
                c.arg("*");
            }
            Some(window) => {
                c = redis::cmd("EVALSHA");
                c.arg(&self.script_sha)
                    .arg(2)
                    .arg(&e.destination)
                    .arg(format!("{}:outbox-dedupe:{}", e.destination, e.id))
                    .arg(window.as_millis().max(1) as u64)
                    .arg(self.cfg.maxlen.map(|n| n.to_string()).unwrap_or_default());
            }
        }
        c.arg("id")
            .arg(e.id.to_string())
            .arg("key")
            .arg(&e.key)
            .arg("headers")
            .arg(headers)
            .arg("payload")
            // Borrowed: written once, into the command's buffer.
            .arg(&e.payload[..]);
        c
    }

    /// Sends the commands of `msgs` in one pipeline; one reply per message, or the error of the
    /// whole round trip.
    async fn pipeline(&self, msgs: &[&Envelope]) -> RedisResult<Vec<RedisResult<Value>>> {
        let mut pipe = redis::pipe();
        for e in msgs {
            pipe.add_command(self.command(e));
        }
        let mut conn = self.conn.clone();
        pipe.ignore_errors().query_async(&mut conn).await
    }

    async fn load_script(&self) -> RedisResult<()> {
        let mut conn = self.conn.clone();
        let _: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(DEDUPE_XADD)
            .query_async(&mut conn)
            .await?;
        self.script_loaded.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// Appends `msgs` (with the script loaded first in dedupe mode, and once more for the
    /// messages that found it missing, after a server restart emptied the script cache).
    async fn run(&self, msgs: &[&Envelope]) -> RedisResult<Vec<RedisResult<Value>>> {
        if self.cfg.dedupe.is_some() && !self.script_loaded.load(Ordering::Relaxed) {
            self.load_script().await?;
        }
        let mut replies = self.pipeline(msgs).await?;
        let missing: Vec<usize> = (0..replies.len())
            .filter(|&i| {
                matches!(&replies[i], Err(e)
                    if e.kind() == redis::ErrorKind::Server(ServerErrorKind::NoScript))
            })
            .collect();
        if !missing.is_empty() {
            self.script_loaded.store(false, Ordering::Relaxed);
            self.load_script().await?;
            let again: Vec<&Envelope> = missing.iter().map(|&i| msgs[i]).collect();
            for (i, reply) in missing.into_iter().zip(self.pipeline(&again).await?) {
                replies[i] = reply;
            }
        }
        Ok(replies)
    }
}

#[async_trait]
impl Sink for RedisSink {
    fn name(&self) -> &str {
        "redis"
    }

    fn ack_timeout(&self) -> Option<Duration> {
        Some(self.cfg.ack_timeout)
    }

    async fn publish(&self, batch: &[Envelope]) -> Vec<Result<(), SinkError>> {
        let mut results: Vec<Result<(), SinkError>> = batch.iter().map(|e| self.check(e)).collect();
        let sent: Vec<usize> = (0..batch.len()).filter(|&i| results[i].is_ok()).collect();
        if sent.is_empty() {
            return results;
        }
        let msgs: Vec<&Envelope> = sent.iter().map(|&i| &batch[i]).collect();
        let replies = match tokio::time::timeout(self.cfg.ack_timeout, self.run(&msgs)).await {
            Ok(Ok(r)) => r,
            Ok(Err(err)) => {
                for &i in &sent {
                    results[i] = Err(classify(&self.cfg.display, &batch[i].destination, &err));
                }
                return results;
            }
            Err(_) => {
                for &i in &sent {
                    results[i] = Err(SinkError::unavailable(format!(
                        "redis: no reply from {} within {:?}",
                        self.cfg.display, self.cfg.ack_timeout
                    )));
                }
                return results;
            }
        };
        for (n, &i) in sent.iter().enumerate() {
            results[i] = match replies.get(n) {
                // An entry id, or nil (`false` from the script): a duplicate inside the window,
                // already in the stream.
                Some(Ok(_)) => Ok(()),
                Some(Err(err)) => Err(classify(&self.cfg.display, &batch[i].destination, err)),
                None => Err(SinkError::rejected(format!(
                    "redis: no reply for the XADD to stream `{}`",
                    batch[i].destination
                ))),
            };
        }
        results
    }
}
