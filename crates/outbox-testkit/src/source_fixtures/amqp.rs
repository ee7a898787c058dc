//! RabbitMQ: a durable queue per channel.

use async_trait::async_trait;
use futures::StreamExt;
use uuid::Uuid;

use super::{env_or, settle, SETTLE};
use crate::source_suite::{Channel, Mistake, SourceFixture, SECRET};
use crate::unique_name;

/// RabbitMQ (`OUTBOX_TEST_AMQP_URL`): a durable queue per channel, published to through the
/// default exchange. The dead consumer holds its messages on a connection that then closes,
/// as a killed process's does: RabbitMQ puts them back at their places.
pub struct Amqp(String);

impl Amqp {
    /// The shared broker.
    pub fn new() -> Self {
        Self(env_or(
            "OUTBOX_TEST_AMQP_URL",
            "amqp://guest:guest@127.0.0.1:5672/%2f",
        ))
    }
}

/// A durable queue of its own.
pub struct AmqpChannel {
    url: String,
    conn: lapin::Connection,
    /// The queue's name.
    pub queue: String,
}

impl AmqpChannel {
    /// (ready, consumers) of the queue.
    pub async fn counts(&self) -> (u32, u32) {
        let ch = self.conn.create_channel().await.unwrap();
        let q = ch
            .queue_declare(
                self.queue.as_str().into(),
                lapin::options::QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                lapin::types::FieldTable::default(),
            )
            .await
            .unwrap();
        let _ = ch.close(200, "OK".into()).await;
        (q.message_count(), q.consumer_count())
    }
}

#[async_trait]
impl Channel for AmqpChannel {
    fn source_url(&self) -> String {
        format!("{}?queue={}", self.url, self.queue)
    }
    fn sink_url(&self) -> String {
        self.url.clone()
    }
    fn destination(&self) -> String {
        self.queue.clone()
    }
    async fn take_and_die(&mut self, n: usize) -> Vec<Uuid> {
        let dead = lapin::Connection::connect(&self.url, lapin::ConnectionProperties::default())
            .await
            .unwrap();
        let ch = dead.create_channel().await.unwrap();
        ch.basic_qos(n as u16, lapin::options::BasicQosOptions::default())
            .await
            .unwrap();
        let mut consumer = ch
            .basic_consume(
                self.queue.as_str().into(),
                "dead".into(),
                lapin::options::BasicConsumeOptions::default(),
                lapin::types::FieldTable::default(),
            )
            .await
            .unwrap();
        let mut taken = Vec::new();
        while taken.len() < n {
            let d = tokio::time::timeout(SETTLE, consumer.next())
                .await
                .unwrap()
                .unwrap()
                .unwrap();
            let id = d.properties.message_id().as_ref().unwrap().as_str();
            taken.push(id.parse().unwrap());
        }
        drop(consumer);
        // Closed, as a killed process's connection is: the broker requeues what it held.
        let _ = dead.close(320, "killed".into()).await;
        taken
    }
    async fn assert_drained(&mut self, _published: usize) {
        let me = &*self;
        settle("the queue", || async move {
            let counts = me.counts().await;
            (counts != (0, 0)).then(|| format!("(ready, consumers) = {counts:?}"))
        })
        .await;
    }
    async fn cleanup(self: Box<Self>) {
        let ch = self.conn.create_channel().await.unwrap();
        let _ = ch
            .queue_delete(
                self.queue.as_str().into(),
                lapin::options::QueueDeleteOptions::default(),
            )
            .await;
        let _ = self.conn.close(200, "OK".into()).await;
    }
}

#[async_trait]
impl SourceFixture for Amqp {
    async fn channel(&self, tag: &str) -> Box<dyn Channel> {
        let queue = unique_name(tag);
        let conn = lapin::Connection::connect(&self.0, lapin::ConnectionProperties::default())
            .await
            .expect("RabbitMQ must be running: scripts/services.sh starts it");
        let ch = conn.create_channel().await.unwrap();
        ch.queue_declare(
            queue.as_str().into(),
            lapin::options::QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            lapin::types::FieldTable::default(),
        )
        .await
        .unwrap();
        Box::new(AmqpChannel {
            url: self.0.clone(),
            conn,
            queue,
        })
    }
    fn mistakes(&self) -> Vec<Mistake> {
        let missing = unique_name("ibx_missing");
        vec![
            Mistake::new(self.0.clone(), "name the queue"),
            Mistake::new(format!("{}?queue=q&bogus={SECRET}", self.0), "`bogus`"),
            Mistake::new(format!("{}?queue={missing}", self.0), "no queue"),
            Mistake::new(
                format!(
                    "{}?queue=q",
                    self.0
                        .replacen("guest:guest@", &format!("guest:{SECRET}@"), 1)
                ),
                "ACCESS_REFUSED",
            ),
        ]
    }
}
