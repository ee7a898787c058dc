//! The brokers `outbox inbox` reads, as fixtures of the source conformance suite
//! (`outbox_testkit::source_suite`; included with `#[path]` by `inbox_sources.rs` and the
//! per-broker `inbox*.rs` files): per broker, a channel of the test's own with a random suffix,
//! a consumer that takes messages and dies without acknowledging, and the broker's own view of
//! what is left unacknowledged, read with its own client.
//!
//! They live here, not in the testkit, because they read each broker with its own client
//! (`async-nats`, `redis`, `rdkafka`, `lapin`, `rumqttc`, the SQS SDK): dev-dependencies of this
//! crate, behind the testkit's `sinks` feature there, which this crate's tests do not turn on.

#![allow(clippy::unwrap_used)]

use std::process::Command;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer};
use async_trait::async_trait;
use futures::StreamExt;
use outbox_testkit::source_suite::{
    open, Channel, DaemonScale, Mistake, Order, Scale, SourceFixture, SECRET,
};
use outbox_testkit::unique_name;
use uuid::Uuid;

/// How long a drained check waits for the broker to settle.
const SETTLE: Duration = Duration::from_secs(60);

/// The `outbox` binary, with no configuration from the caller's environment.
pub fn outbox() -> Command {
    crate::common::outbox_command(&std::env::temp_dir())
}

fn env_or(var: &str, default: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| default.to_string())
}

/// `url` with `user` and [`SECRET`] as its credentials.
fn with_password(url: &str, user: &str) -> String {
    url.replacen("://", &format!("://{user}:{SECRET}@"), 1)
}

/// Polls `check` until it returns `None`; panics with its last `Some(why)` after [`SETTLE`].
async fn settle<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<String>>,
{
    let deadline = Instant::now() + SETTLE;
    loop {
        let Some(why) = check().await else { return };
        assert!(
            Instant::now() < deadline,
            "{what} not drained after {SETTLE:?}: {why}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// NATS JetStream (`OUTBOX_TEST_NATS_URL`): a stream per channel, the durable consumer
/// `outbox-inbox` with a 2 s ack wait, so what a dead consumer fetched comes back quickly.
pub struct Nats(String);

impl Nats {
    /// The shared server.
    pub fn new() -> Self {
        Self(crate::common::nats_url())
    }
}

/// A stream capturing `<name>.>`, published to on `<name>.changed`.
pub struct NatsChannel {
    pub url: String,
    pub js: jetstream::Context,
    pub stream: String,
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

/// Kafka (tansu, `OUTBOX_TEST_KAFKA_URL`): a topic of three partitions per channel, the group
/// `outbox-inbox`; drained when the group's committed offsets reach every partition's end.
pub struct Kafka(String);

impl Kafka {
    /// The shared broker.
    pub fn new() -> Self {
        Self(env_or("OUTBOX_TEST_KAFKA_URL", "kafka://127.0.0.1:9092"))
    }

    fn brokers(&self) -> String {
        outbox_sinks::kafka::KafkaConfig::from_url(&self.0)
            .unwrap()
            .brokers
    }
}

/// A topic of its own with three partitions.
pub struct KafkaChannel {
    url: String,
    brokers: String,
    pub topic: String,
    partitions: i32,
}

impl KafkaChannel {
    /// A consumer of group `outbox-inbox` with every partition assigned at the group's
    /// committed offsets.
    fn consumer(&self) -> rdkafka::consumer::BaseConsumer {
        use rdkafka::consumer::Consumer;
        let c: rdkafka::consumer::BaseConsumer = outbox_sinks::kafka::client_config(&self.brokers)
            .set("group.id", "outbox-inbox")
            .set("enable.auto.commit", "false")
            .create()
            .unwrap();
        let mut tpl = rdkafka::TopicPartitionList::new();
        for p in 0..self.partitions {
            tpl.add_partition_offset(&self.topic, p, rdkafka::Offset::Stored)
                .unwrap();
        }
        c.assign(&tpl).unwrap();
        c
    }

    /// The offset after the last record of each partition, found by reading the `total`
    /// records of the topic from its start (tansu 0.6's high watermark, from ListOffsets, lags
    /// behind the log end: it cannot be used for this).
    fn ends(&self, total: usize) -> Vec<i64> {
        use rdkafka::consumer::Consumer;
        use rdkafka::Message;
        let c: rdkafka::consumer::BaseConsumer = outbox_sinks::kafka::client_config(&self.brokers)
            .set("group.id", format!("outbox-test-{}", Uuid::now_v7()))
            .set("enable.auto.commit", "false")
            .create()
            .unwrap();
        let mut tpl = rdkafka::TopicPartitionList::new();
        for p in 0..self.partitions {
            tpl.add_partition_offset(&self.topic, p, rdkafka::Offset::Beginning)
                .unwrap();
        }
        c.assign(&tpl).unwrap();
        let mut ends = vec![0; self.partitions as usize];
        let deadline = Instant::now() + SETTLE;
        let mut seen = 0;
        while seen < total {
            assert!(Instant::now() < deadline, "read only {seen} of {total}");
            if let Some(Ok(m)) = c.poll(Duration::from_millis(100)) {
                ends[m.partition() as usize] = m.offset() + 1;
                seen += 1;
            }
        }
        ends
    }

    /// The committed offset of each partition for group `outbox-inbox` (-1: none).
    fn committed(&self) -> Vec<i64> {
        use rdkafka::consumer::Consumer;
        let mut tpl = rdkafka::TopicPartitionList::new();
        for p in 0..self.partitions {
            tpl.add_partition(&self.topic, p);
        }
        let committed = self
            .consumer()
            .committed_offsets(tpl, Duration::from_secs(10))
            .unwrap();
        (0..self.partitions)
            .map(
                |p| match committed.find_partition(&self.topic, p).map(|e| e.offset()) {
                    Some(rdkafka::Offset::Offset(n)) => n,
                    _ => -1,
                },
            )
            .collect()
    }
}

#[async_trait]
impl Channel for KafkaChannel {
    fn source_url(&self) -> String {
        format!("{}?topic={}", self.url, self.topic)
    }
    fn sink_url(&self) -> String {
        self.url.clone()
    }
    fn destination(&self) -> String {
        self.topic.clone()
    }
    async fn assert_drained(&mut self, published: usize) {
        let me = &*self;
        let ends = &tokio::task::block_in_place(|| me.ends(published));
        settle("the group's committed offsets", || async move {
            let committed = tokio::task::block_in_place(|| me.committed());
            (committed != *ends).then(|| format!("committed {committed:?}, ends {ends:?}"))
        })
        .await;
    }
    async fn cleanup(self: Box<Self>) {
        let _ = outbox_sinks::kafka::delete_topic(&self.brokers, &self.topic).await;
    }
}

#[async_trait]
impl SourceFixture for Kafka {
    async fn channel(&self, tag: &str) -> Box<dyn Channel> {
        let topic = unique_name(tag);
        outbox_sinks::kafka::create_topic(&self.brokers(), &topic, 3)
            .await
            .expect("the Kafka broker (tansu) must be running: scripts/services.sh starts it");
        Box::new(KafkaChannel {
            url: self.0.clone(),
            brokers: self.brokers(),
            topic,
            partitions: 3,
        })
    }
    fn order(&self) -> Order {
        // Per partition, and a key's messages share one partition.
        Order::PerKey
    }
    fn mistakes(&self) -> Vec<Mistake> {
        let missing = unique_name("ibx_missing");
        vec![
            Mistake::new(
                format!("{}?topic=orders", with_password(&self.0, "app")),
                "credentials",
            ),
            Mistake::new(self.0.clone(), "name the topic"),
            Mistake::new(format!("{}?topic=t&bogus={SECRET}", self.0), "`bogus`"),
            Mistake::new(format!("{}?topic={missing}", self.0), "no topic"),
        ]
    }
}

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

/// MQTT (Mosquitto, `OUTBOX_TEST_MQTT_URL`): a topic and a persistent session per channel.
/// MQTT keeps no history, so the channel creates the session (the source subscribes once)
/// before anything is published. Mosquitto queues at most 1,000 QoS 1 messages per session
/// (`max_queued_messages`) and has at most 20 in flight, so the workloads stay below both.
pub struct Mqtt(pub String);

impl Mqtt {
    /// The shared broker.
    pub fn new() -> Self {
        Self(env_or("OUTBOX_TEST_MQTT_URL", "mqtt://127.0.0.1:1883"))
    }
}

/// A raw MQTT v5 client of the broker at `url` under `client_id`, with manual
/// acknowledgements: a consumer that can receive and not acknowledge.
pub fn mqtt_client(
    url: &str,
    client_id: &str,
    clean: bool,
    receive_max: u16,
) -> (rumqttc::v5::AsyncClient, rumqttc::v5::EventLoop) {
    let cfg = outbox_sinks::mqtt::MqttConfig::from_url(url).unwrap();
    let mut o = rumqttc::v5::MqttOptions::new(client_id, cfg.host, cfg.port);
    o.set_clean_start(clean)
        .set_session_expiry_interval(Some(600))
        .set_manual_acks(true)
        .set_receive_maximum(Some(receive_max));
    rumqttc::v5::AsyncClient::new(o, 100)
}

/// A topic and a session of its own.
pub struct MqttChannel {
    url: String,
    pub topic: String,
    pub client_id: String,
}

impl MqttChannel {
    /// A topic `<name>/orders` and the session `<name>` subscribed to it.
    pub async fn new(url: &str, tag: &str) -> Self {
        let name = unique_name(tag);
        let ch = Self {
            url: url.to_string(),
            topic: format!("{name}/orders"),
            client_id: name,
        };
        let mut source = open(&ch.source_url(), 20).await;
        source.recover().await.unwrap();
        ch
    }

    /// Connects to the session, and to `clean` it when asked; returns every message it was
    /// sent within a moment (disconnecting after).
    async fn visit_session(&self, clean: bool) -> Vec<rumqttc::v5::mqttbytes::v5::Publish> {
        use rumqttc::v5::mqttbytes::v5::Packet;
        use rumqttc::v5::Event;
        let (client, mut events) = mqtt_client(&self.url, &self.client_id, clean, 100);
        let mut sent = Vec::new();
        let visit = async {
            let mut connected: Option<Instant> = None;
            loop {
                let wait = match connected {
                    Some(at) => Duration::from_secs(2).saturating_sub(at.elapsed()),
                    None => SETTLE,
                };
                match tokio::time::timeout(wait, events.poll()).await {
                    Ok(Ok(Event::Incoming(Packet::ConnAck(_)))) => connected = Some(Instant::now()),
                    Ok(Ok(Event::Incoming(Packet::Publish(p)))) => sent.push(p),
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => panic!("MQTT session {}: {e}", self.client_id),
                    Err(_) => return,
                }
            }
        };
        visit.await;
        let _ = client.try_disconnect();
        let _ = tokio::time::timeout(Duration::from_secs(2), events.poll()).await;
        sent
    }

    /// Ends the session on the broker (clean start, then disconnect).
    pub async fn end_session(&self) {
        self.visit_session(true).await;
    }
}

#[async_trait]
impl Channel for MqttChannel {
    fn source_url(&self) -> String {
        format!(
            "{}?topic={}&client_id={}&session_expiry=10m",
            self.url, self.topic, self.client_id
        )
    }
    fn sink_url(&self) -> String {
        self.url.clone()
    }
    fn destination(&self) -> String {
        self.topic.clone()
    }
    /// Nothing is sent again to the session when it reconnects: every message it received was
    /// acknowledged, and nothing is queued.
    async fn assert_drained(&mut self, _published: usize) {
        let sent = self.visit_session(false).await;
        assert!(
            sent.is_empty(),
            "the session still had {} messages for its consumer",
            sent.len()
        );
    }
    async fn cleanup(self: Box<Self>) {
        self.end_session().await;
    }
}

#[async_trait]
impl SourceFixture for Mqtt {
    async fn channel(&self, tag: &str) -> Box<dyn Channel> {
        Box::new(MqttChannel::new(&self.0, tag).await)
    }
    fn scale(&self) -> Scale {
        Scale {
            keys: 5,
            per_key: 20,
            dead_takes: 15,
            batch: 20,
        }
    }
    fn daemon_scale(&self) -> DaemonScale {
        DaemonScale {
            keys: 10,
            per_key: 40,
            kill_after: 100,
            more_per_key: 5,
            batch: 20,
        }
    }
    fn mistakes(&self) -> Vec<Mistake> {
        let base = with_password(&self.0, "app");
        vec![
            Mistake::new(base.clone(), "name the topic filter"),
            Mistake::new(format!("{base}?topic=t&qos=2"), "`qos`"),
            Mistake::new(
                format!("mqtt://app:{SECRET}@127.0.0.1:port?topic=t"),
                "mqtt://",
            ),
        ]
    }
}

/// SQS on moto's server (`OUTBOX_TEST_MOTO_URL`): a FIFO or a standard queue per channel,
/// read with a 3-second visibility timeout so what a dead consumer received comes back soon.
///
/// moto answers a call in tens to hundreds of milliseconds on a busy machine, so the workloads
/// are small. One of its FIFO quirks shapes them: when several messages of one group come back
/// at once after their visibility timeout, moto hands out the group's last one first (SQS
/// returns them in order). A receive takes at most one message per group here, so the dead
/// consumer takes no more messages than there are keys, each the only one of its group.
pub struct Sqs {
    fifo: bool,
}

impl Sqs {
    /// FIFO queues: each key a message group, in order.
    pub fn fifo() -> Self {
        outbox_testkit::brokers::moto_credentials();
        Self { fifo: true }
    }

    /// Standard queues: no order.
    pub fn standard() -> Self {
        outbox_testkit::brokers::moto_credentials();
        Self { fifo: false }
    }
}

fn moto() -> String {
    outbox_testkit::brokers::moto_endpoint()
}

/// A queue of its own.
pub struct SqsChannel {
    pub client: aws_sdk_sqs::Client,
    pub name: String,
    pub queue_url: String,
}

impl SqsChannel {
    /// A queue on moto, FIFO when `fifo`.
    pub async fn new(tag: &str, fifo: bool) -> Self {
        let url = format!("sqs://?region=us-east-1&endpoint={}", moto());
        let client = outbox_sinks::sqs::reader_client(&url).await.unwrap();
        let mut name = unique_name(tag);
        if fifo {
            name.push_str(".fifo");
        }
        let queue_url = outbox_sinks::sqs::create_queue(&client, &name, fifo)
            .await
            .expect("moto must be running: scripts/services.sh starts it");
        Self {
            client,
            name,
            queue_url,
        }
    }

    /// (visible, in flight) messages, as SQS approximates them.
    pub async fn depth(&self) -> (u64, u64) {
        use aws_sdk_sqs::types::QueueAttributeName as A;
        let out = self
            .client
            .get_queue_attributes()
            .queue_url(&self.queue_url)
            .attribute_names(A::ApproximateNumberOfMessages)
            .attribute_names(A::ApproximateNumberOfMessagesNotVisible)
            .send()
            .await
            .unwrap();
        let a = out.attributes.unwrap_or_default();
        let get = |n: A| a.get(&n).and_then(|v| v.parse().ok()).unwrap_or(0);
        (
            get(A::ApproximateNumberOfMessages),
            get(A::ApproximateNumberOfMessagesNotVisible),
        )
    }
}

#[async_trait]
impl Channel for SqsChannel {
    fn source_url(&self) -> String {
        format!(
            "sqs://?queue={}&region=us-east-1&endpoint={}&visibility_timeout=3s",
            self.name,
            moto()
        )
    }
    /// moto answers a FIFO batch slowly when the machine is busy: a generous ack timeout.
    fn sink_url(&self) -> String {
        format!(
            "sqs://?region=us-east-1&endpoint={}&ack_timeout=60s",
            moto()
        )
    }
    fn destination(&self) -> String {
        self.name.clone()
    }
    async fn assert_drained(&mut self, _published: usize) {
        let me = &*self;
        settle("the queue", || async move {
            let depth = me.depth().await;
            (depth != (0, 0)).then(|| format!("(visible, in flight) = {depth:?}"))
        })
        .await;
    }
    /// The killed daemon's messages come back after the 3 s visibility timeout: the queue is
    /// empty once the running daemon took and deleted them.
    async fn await_redelivery(&mut self) {
        self.assert_drained(0).await;
    }
    async fn cleanup(self: Box<Self>) {
        let _ = self
            .client
            .delete_queue()
            .queue_url(&self.queue_url)
            .send()
            .await;
    }
}

#[async_trait]
impl SourceFixture for Sqs {
    async fn channel(&self, tag: &str) -> Box<dyn Channel> {
        Box::new(SqsChannel::new(tag, self.fifo).await)
    }
    fn order(&self) -> Order {
        if self.fifo {
            Order::PerKey
        } else {
            Order::None
        }
    }
    fn scale(&self) -> Scale {
        Scale {
            keys: 5,
            per_key: 8,
            dead_takes: 2,
            batch: 10,
        }
    }
    fn daemon_scale(&self) -> DaemonScale {
        DaemonScale {
            keys: 10,
            per_key: 12,
            kill_after: 40,
            more_per_key: 3,
            batch: 10,
        }
    }
    fn mistakes(&self) -> Vec<Mistake> {
        let endpoint = moto();
        vec![
            Mistake::new(
                format!("sqs://?region=us-east-1&endpoint={endpoint}"),
                "name the queue",
            ),
            Mistake::new(
                format!(
                    "sqs://?queue=q&region=us-east-1&endpoint=http://AKIA:{SECRET}@127.0.0.1:4566"
                ),
                "credentials",
            ),
            Mistake::new(
                format!("sqs://?queue=q&bogus={SECRET}&region=us-east-1"),
                "bogus",
            ),
            Mistake::new(
                format!("sqs://?queue=nope_nope&region=us-east-1&endpoint={endpoint}"),
                "no queue named `nope_nope` in us-east-1",
            ),
        ]
    }
}
