//! NATS JetStream: a stream and a durable consumer per channel.

use async_nats::jetstream::{self, consumer};
use async_trait::async_trait;

use super::{env_or, settle, with_password};
use crate::source_suite::{Channel, Mistake, SourceFixture, SECRET};
use crate::unique_name;

/// NATS JetStream (`OUTBOX_TEST_NATS_URL`): a stream per channel, the durable consumer
/// `outbox-inbox` with a 2 s ack wait, so what a dead consumer fetched comes back quickly.
pub struct Nats(String);

impl Nats {
    /// The shared server.
    pub fn new() -> Self {
        Self(env_or("OUTBOX_TEST_NATS_URL", "nats://127.0.0.1:4222"))
    }
}

/// A stream capturing `<name>.>`, published to on `<name>.changed`.
pub struct NatsChannel {
    /// The server's URL.
    pub url: String,
    /// A JetStream context on it.
    pub js: jetstream::Context,
    /// The stream's name.
    pub stream: String,
    /// The subject published to.
    pub subject: String,
}

impl NatsChannel {
    /// A stream on the server at `url`, on disk when `durable` (it survives a restart).
    pub async fn new(url: &str, tag: &str, durable: bool) -> Self {
        let client = async_nats::connect(url)
            .await
            .expect("NATS must be running: scripts/services.sh starts it");
        let js = jetstream::new(client);
        let name = unique_name(tag);
        let stream = name.to_uppercase();
        outbox_sinks::nats::create_stream(&js, &stream, vec![format!("{name}.>")], durable)
            .await
            .unwrap();
        Self {
            url: url.to_string(),
            js,
            stream,
            subject: format!("{name}.changed"),
        }
    }

    /// The daemon's durable consumer.
    pub async fn consumer_info(&self) -> consumer::Info {
        self.js
            .get_stream(&self.stream)
            .await
            .unwrap()
            .consumer_info("outbox-inbox")
            .await
            .unwrap()
    }
}

#[async_trait]
impl Channel for NatsChannel {
    fn source_url(&self) -> String {
        format!("{}?stream={}&ack_wait=2s", self.url, self.stream)
    }
    fn sink_url(&self) -> String {
        self.url.clone()
    }
    fn destination(&self) -> String {
        self.subject.clone()
    }
    async fn assert_drained(&mut self, _published: usize) {
        let me = &*self;
        settle("the durable consumer", || async move {
            let i = me.consumer_info().await;
            (i.num_pending + i.num_ack_pending as u64 > 0).then(|| {
                format!(
                    "{} undelivered, {} unacknowledged",
                    i.num_pending, i.num_ack_pending
                )
            })
        })
        .await;
    }
    async fn cleanup(self: Box<Self>) {
        let _ = self.js.delete_stream(&self.stream).await;
    }
}

#[async_trait]
impl SourceFixture for Nats {
    async fn channel(&self, tag: &str) -> Box<dyn Channel> {
        Box::new(NatsChannel::new(&self.0, tag, false).await)
    }
    fn mistakes(&self) -> Vec<Mistake> {
        let missing = unique_name("ibx_missing").to_uppercase();
        vec![
            Mistake::new(with_password(&self.0, "app"), "name the stream"),
            Mistake::new(format!("{}?stream=S&bogus={SECRET}", self.0), "`bogus`"),
            Mistake::new(
                format!("{}?stream={missing}", with_password(&self.0, "app")),
                "create it first",
            ),
        ]
    }
}
