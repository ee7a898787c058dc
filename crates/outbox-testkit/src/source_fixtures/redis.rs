//! Redis Streams: a stream and a consumer group per channel.

use async_trait::async_trait;

use super::{env_or, settle, with_password};
use crate::source_suite::{Channel, Mistake, SourceFixture, SECRET};
use crate::unique_name;

/// Redis Streams (`OUTBOX_TEST_REDIS_URL`): a stream per channel, the group `outbox-inbox`;
/// the dead consumer is another consumer of the group, whose entries the daemon takes over.
pub struct Redis(String);

impl Redis {
    /// The shared server.
    pub fn new() -> Self {
        Self(env_or("OUTBOX_TEST_REDIS_URL", "redis://127.0.0.1:6379"))
    }
}

/// A stream key of its own.
pub struct RedisChannel {
    url: String,
    conn: redis::aio::MultiplexedConnection,
    /// The stream's key.
    pub stream: String,
}

impl RedisChannel {
    async fn new(url: &str, tag: &str) -> Self {
        let client = redis::Client::open(url).unwrap();
        let conn = client
            .get_multiplexed_async_connection()
            .await
            .expect("Redis must be running: scripts/services.sh starts it");
        Self {
            url: url.to_string(),
            conn,
            stream: unique_name(tag),
        }
    }

    /// Entries delivered to the group and not acknowledged.
    pub async fn pending(&self) -> i64 {
        let v: redis::Value = redis::cmd("XPENDING")
            .arg(&self.stream)
            .arg("outbox-inbox")
            .query_async(&mut self.conn.clone())
            .await
            .unwrap();
        match v {
            redis::Value::Array(parts) => match parts.first() {
                Some(redis::Value::Int(n)) => *n,
                _ => -1,
            },
            _ => -1,
        }
    }
}

#[async_trait]
impl Channel for RedisChannel {
    fn source_url(&self) -> String {
        format!("{}?stream={}", self.url, self.stream)
    }
    fn dead_consumer_url(&self) -> String {
        format!("{}&consumer=dead-daemon", self.source_url())
    }
    fn sink_url(&self) -> String {
        self.url.clone()
    }
    fn destination(&self) -> String {
        self.stream.clone()
    }
    async fn assert_drained(&mut self, _published: usize) {
        let me = &*self;
        settle("the consumer group", || async move {
            let n = me.pending().await;
            (n != 0).then(|| format!("{n} entries pending"))
        })
        .await;
    }
    async fn cleanup(mut self: Box<Self>) {
        let _: redis::RedisResult<i64> = redis::cmd("DEL")
            .arg(&self.stream)
            .query_async(&mut self.conn)
            .await;
    }
}

#[async_trait]
impl SourceFixture for Redis {
    async fn channel(&self, tag: &str) -> Box<dyn Channel> {
        Box::new(RedisChannel::new(&self.0, tag).await)
    }
    fn mistakes(&self) -> Vec<Mistake> {
        vec![
            Mistake::new(with_password(&self.0, "app"), "name the stream key"),
            Mistake::new(format!("{}?stream=s&bogus={SECRET}", self.0), "`bogus`"),
        ]
    }
}
