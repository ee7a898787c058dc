//! [`RedisDedupe`]: the dedupe claim in Redis (`SET key 1 NX PX ttl`), for consumers whose
//! effects are not in a database, or that want the check before they open a transaction.
//!
//! **Weaker than the database claim, plainly:**
//! - It is **not atomic with the effect.** The claim is written in Redis, the effect somewhere
//!   else. A consumer that crashes after claiming and before its effect commits has claimed a
//!   message it never processed: the redelivery is then skipped and **the effect is lost**.
//!   [`RedisDedupe::release`] undoes a claim whose effect failed, but a crash gives no chance
//!   to call it. (The other order, effect first and claim after, duplicates instead.)
//! - **Redis may forget.** Keys expire after the TTL; an eviction policy other than
//!   `noeviction` can drop them early under memory pressure; a failover to a replica that had
//!   not received the write, or a restart without persistence, loses recent claims: a
//!   redelivery is then processed again.
//!
//! Use it where a lost or doubled effect is acceptable (a cache refresh, a notification), or
//! as a fast pre-check in front of the database claim ([`crate::claim`]), which stays the
//! guarantee.

use std::time::Duration;

use outbox_core::{Error, ErrorKind, Result};
use redis::aio::ConnectionManager;
use uuid::Uuid;

/// The dedupe claim in Redis, keys `<prefix>:<consumer>:<message id>`.
#[derive(Clone)]
pub struct RedisDedupe {
    conn: ConnectionManager,
    prefix: String,
}

impl std::fmt::Debug for RedisDedupe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisDedupe")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

fn redis_error(what: &str, e: redis::RedisError) -> Error {
    let kind = if e.is_io_error() || e.is_connection_dropped() || e.is_timeout() {
        ErrorKind::Connection
    } else {
        ErrorKind::Other
    };
    Error::new(
        kind,
        outbox_core::redact::sanitize(&format!("redis dedupe: {what}: {e}")),
    )
}

impl RedisDedupe {
    /// Connects to `url` (`redis://host:6379[/db]`); keys start with `prefix`.
    pub async fn connect(url: &str, prefix: &str) -> Result<Self> {
        let client = redis::Client::open(url).map_err(|e| {
            Error::config(outbox_core::redact::sanitize(&format!("redis dedupe: {e}")))
        })?;
        let conn = ConnectionManager::new(client)
            .await
            .map_err(|e| redis_error("connecting", e))?;
        Ok(Self {
            conn,
            prefix: prefix.to_string(),
        })
    }

    fn key(&self, consumer: &str, message_id: Uuid) -> String {
        format!("{}:{consumer}:{message_id}", self.prefix)
    }

    /// Claims `message_id` for `consumer` for `ttl` (`SET NX PX`): `true` for the first claim
    /// within the TTL, `false` when a claim exists. See the module documentation for what it
    /// does not guarantee.
    pub async fn claim(&self, consumer: &str, message_id: Uuid, ttl: Duration) -> Result<bool> {
        let ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1);
        let set: Option<String> = redis::cmd("SET")
            .arg(self.key(consumer, message_id))
            .arg(1)
            .arg("NX")
            .arg("PX")
            .arg(ms)
            .query_async(&mut self.conn.clone())
            .await
            .map_err(|e| redis_error("SET NX", e))?;
        Ok(set.is_some())
    }

    /// Removes a claim whose effect failed, so the redelivery is processed.
    pub async fn release(&self, consumer: &str, message_id: Uuid) -> Result<()> {
        let _: i64 = redis::cmd("DEL")
            .arg(self.key(consumer, message_id))
            .query_async(&mut self.conn.clone())
            .await
            .map_err(|e| redis_error("DEL", e))?;
        Ok(())
    }
}
