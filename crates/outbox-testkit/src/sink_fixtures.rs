//! One [`SinkFixture`] per sink: where its shared broker is (`OUTBOX_TEST_<SINK>_URL`
//! overrides the address `scripts/services.sh` starts it on), how to make its messages too
//! large or refused, and its private broker for the outage cases.

// Test code: a failed expectation should panic with its message.
#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::sync::Arc;

use async_trait::async_trait;
use outbox_sinks::http::{Behaviour, HttpReader, HttpReceiver};
use outbox_sinks::read::{scratch, Reader, Scratch, ScratchOptions};

use crate::brokers;
use crate::proxy::TcpProxy;
use crate::sink_suite::{LazyReader, Oversized, Private, Rejection, Scale, SinkFixture};
use crate::stdout_process::{ProcessReader, ProcessSink, StdoutProcess};

/// Every sink's conformance suite on the store fixture `$store`, one line per sink (with the
/// cases it leaves out and why): `crates/outbox-sinks/tests/conformance.rs` runs them all.
/// Adding a sink adds its fixture below and its line here.
#[macro_export]
macro_rules! every_sink_conformance_suite {
    ($store:path) => {
        $crate::sink_conformance_suite!(nats, $crate::sink_fixtures::Nats::new, $store);
        $crate::sink_conformance_suite!(kafka, $crate::sink_fixtures::Kafka::new, $store);
        $crate::sink_conformance_suite!(amqp, $crate::sink_fixtures::Amqp::new, $store);
        $crate::sink_conformance_suite!(redis, $crate::sink_fixtures::Redis::new, $store);
        $crate::sink_conformance_suite!(mqtt, $crate::sink_fixtures::Mqtt::new, $store);
        $crate::sink_conformance_suite!(sqs, $crate::sink_fixtures::Aws::sqs_fifo, $store);
        // A standard queue orders nothing: the order case checks it is complete and once each.
        $crate::sink_conformance_suite!(sqs_standard, $crate::sink_fixtures::Aws::sqs_standard, $store;
            // Its refusals, limits and outages are the FIFO module's: the same sink, the same calls.
            except [oversized_message_fails_at_once, rejection_does_not_open_the_circuit,
                    broker_down_mid_stream_with_messages_in_flight, deadline]);
        $crate::sink_conformance_suite!(sns, $crate::sink_fixtures::Aws::sns_fifo, $store);
        $crate::sink_conformance_suite!(sns_standard, $crate::sink_fixtures::Aws::sns_standard, $store;
            // As for SQS: the FIFO module covers the same sink's refusals, limits and outages.
            except [oversized_message_fails_at_once, rejection_does_not_open_the_circuit,
                    broker_down_mid_stream_with_messages_in_flight, deadline]);
        $crate::sink_conformance_suite!(http, $crate::sink_fixtures::Http::single, $store);
        $crate::sink_conformance_suite!(http_batch, $crate::sink_fixtures::Http::batch, $store;
            // A body over the receiver's limit is the same 413 in either mode (`http`).
            except [oversized_message_fails_at_once]);
        $crate::sink_conformance_suite!(file, $crate::sink_fixtures::File::new, $store;
            // A local file has no size limit, refuses no destination, and has no broker to stop or
            // freeze (a full or stalled disk is the writer thread's, tested in `writer.rs`).
            except [oversized_message_fails_at_once, rejection_does_not_open_the_circuit,
                    broker_down_mid_stream_with_messages_in_flight, deadline]);
    };
}

fn env_or(var: &str, default: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| default.to_string())
}

/// A fixture whose shared broker is at the URL in environment variable `$env`, else at
/// `$default` (where `scripts/services.sh` starts it).
macro_rules! shared_broker {
    ($(#[$doc:meta])* $name:ident, $env:literal, $default:literal) => {
        $(#[$doc])*
        pub struct $name(String);

        impl $name {
            #[doc = concat!("The shared broker: `", $env, "`, else `", $default, "`.")]
            pub fn new() -> Self {
                Self(env_or($env, $default))
            }

            /// The broker at `url` (a TLS listener beside the shared one, say).
            pub fn at(url: impl Into<String>) -> Self {
                Self(url.into())
            }
        }

        impl Default for $name {
            fn default() -> Self {
                Self::new()
            }
        }
    };
}

/// The limit of the sinks with a `max_message_size` option, lowered to 1 KiB.
fn max_message_size() -> Option<Oversized> {
    Some(Oversized {
        option: Some("max_message_size=1KiB"),
        bytes: 4096,
        names: "max_message_size",
    })
}

/// A scratch made with `options` on `url`; panics naming the broker that is not there.
async fn make(url: &str, options: &ScratchOptions) -> Scratch {
    scratch(url, options).await.unwrap_or_else(|e| {
        panic!("a scratch destination on {url} (scripts/services.sh starts the broker): {e}")
    })
}

/// A scratch on a private broker started for the case (on a thread the runtime can spare: some
/// take seconds to start).
async fn private_scratch(server: crate::process::PrivateServer, tag: &str) -> Private {
    let scratch = make(&server.url(), &ScratchOptions::new(tag)).await;
    Private {
        broker: Box::new(server),
        scratch,
    }
}

fn start(f: impl FnOnce() -> crate::process::PrivateServer) -> crate::process::PrivateServer {
    tokio::task::block_in_place(f)
}

/// The segment before the first `sep` of a scratch destination: its unique prefix.
fn prefix(destination: &str, sep: char) -> String {
    destination
        .split(sep)
        .next()
        .unwrap_or_default()
        .to_string()
}

shared_broker!(
    /// NATS JetStream: oversized past the server's `max_payload` (1 MiB); refused where no stream
    /// captures the subject; a private nats-server with its own store, killed and restarted.
    Nats,
    "OUTBOX_TEST_NATS_URL", "nats://127.0.0.1:4222");

#[async_trait]
impl SinkFixture for Nats {
    async fn scratch(&self, tag: &str) -> Scratch {
        make(&self.0, &ScratchOptions::new(tag)).await
    }
    fn oversized(&self) -> Option<Oversized> {
        Some(Oversized {
            option: None,
            bytes: 1_100_000,
            names: "max_payload",
        })
    }
    async fn rejection(&self, tag: &str) -> Option<Rejection> {
        let scratch = self.scratch(tag).await;
        let destination = format!("{}_nostream.placed", prefix(&scratch.destination, '.'));
        Some(Rejection {
            names: vec![destination.clone(), "no JetStream stream".into()],
            destination,
            scratch,
            broker: None,
        })
    }
    async fn private(&self, tag: &str) -> Option<Private> {
        Some(private_scratch(start(brokers::nats), tag).await)
    }
}

shared_broker!(
    /// Kafka (tansu): oversized past the 1 MB `message.max.bytes`; refused for a topic that does not
    /// exist; a private tansu on S3 (a private moto), killed and restarted, which loses writes it
    /// acknowledged shortly before the kill (tansu 0.6 hands their offsets to new records).
    Kafka,
    "OUTBOX_TEST_KAFKA_URL", "kafka://127.0.0.1:9092");

fn kafka_options(tag: &str) -> ScratchOptions {
    let mut o = ScratchOptions::new(tag);
    o.partitions = 4;
    o
}

#[async_trait]
impl SinkFixture for Kafka {
    async fn scratch(&self, tag: &str) -> Scratch {
        make(&self.0, &kafka_options(tag)).await
    }
    fn oversized(&self) -> Option<Oversized> {
        Some(Oversized {
            option: None,
            bytes: 1_100_000,
            names: "message.max.bytes",
        })
    }
    async fn rejection(&self, tag: &str) -> Option<Rejection> {
        let missing = crate::unique_name("outbox_missing");
        Some(Rejection {
            scratch: self.scratch(tag).await,
            names: vec![format!("topic `{missing}` does not exist")],
            destination: missing,
            broker: None,
        })
    }
    async fn private(&self, tag: &str) -> Option<Private> {
        let server = start(brokers::tansu_on_s3);
        let mut s = make(&server.url(), &kafka_options(tag)).await;
        // The restart hands lost offsets to new records: read from a consumer made after it.
        drop(std::mem::replace(&mut s.reader, Box::new(NoReader)));
        let (brokers, topic) = (
            outbox_sinks::kafka::KafkaConfig::from_url(&server.url())
                .unwrap()
                .brokers,
            s.destination.clone(),
        );
        s.reader = Box::new(LazyReader::new(
            format!("Kafka topic {topic}"),
            Box::new(move || {
                Box::pin(async move {
                    Box::new(
                        outbox_sinks::kafka::KafkaReader::open(&brokers, &topic)
                            .await
                            .unwrap(),
                    ) as Box<dyn Reader>
                })
            }),
        ));
        Some(Private {
            broker: Box::new(server),
            scratch: s,
        })
    }
    fn loses_acknowledged_writes(&self) -> bool {
        true
    }
}

/// A placeholder reader that reads nothing.
struct NoReader;

#[async_trait]
impl Reader for NoReader {
    async fn poll(&mut self, _wait: std::time::Duration) -> outbox_sinks::read::Polled {
        outbox_sinks::read::Polled::default()
    }
    fn describe(&self) -> String {
        "nothing".into()
    }
    async fn cleanup(&mut self) {}
}

shared_broker!(
    /// RabbitMQ: oversized past `max_message_size=1KiB`; refused for an exchange that does not
    /// exist; a private node stopped with SIGTERM (durable queue, persistent messages).
    Amqp,
    "OUTBOX_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2f");

#[async_trait]
impl SinkFixture for Amqp {
    async fn scratch(&self, tag: &str) -> Scratch {
        make(&self.0, &ScratchOptions::new(tag)).await
    }
    fn oversized(&self) -> Option<Oversized> {
        max_message_size()
    }
    async fn rejection(&self, tag: &str) -> Option<Rejection> {
        let missing = crate::unique_name("amqp_missing");
        Some(Rejection {
            scratch: self.scratch(tag).await,
            names: vec![format!("exchange `{missing}` does not exist")],
            destination: format!("{missing}/any"),
            broker: None,
        })
    }
    async fn private(&self, tag: &str) -> Option<Private> {
        Some(private_scratch(start(brokers::rabbitmq), tag).await)
    }
}

shared_broker!(
    /// Redis Streams: oversized past `max_message_size=1KiB`; refused for a key holding another
    /// type (`WRONGTYPE`); a private redis-server with an fsynced append-only file, killed.
    Redis,
    "OUTBOX_TEST_REDIS_URL", "redis://127.0.0.1:6379");

/// Sets `key` to a string on the Redis at `url` (`redis://host:port`), in plain RESP.
fn redis_set_string(url: &str, key: &str) {
    let addr = url
        .trim_start_matches("redis://")
        .split(['/', '?'])
        .next()
        .unwrap();
    let mut c = std::net::TcpStream::connect(addr).unwrap();
    let value = "not a stream";
    write!(
        c,
        "*3\r\n$3\r\nSET\r\n${}\r\n{key}\r\n${}\r\n{value}\r\n",
        key.len(),
        value.len()
    )
    .unwrap();
    let mut answer = [0u8; 5];
    c.read_exact(&mut answer).unwrap();
    assert_eq!(&answer, b"+OK\r\n");
}

#[async_trait]
impl SinkFixture for Redis {
    async fn scratch(&self, tag: &str) -> Scratch {
        make(&self.0, &ScratchOptions::new(tag)).await
    }
    fn oversized(&self) -> Option<Oversized> {
        max_message_size()
    }
    async fn rejection(&self, tag: &str) -> Option<Rejection> {
        let taken = crate::unique_name("outbox_redis_string");
        redis_set_string(&self.0, &taken);
        Some(Rejection {
            scratch: self.scratch(tag).await,
            names: vec![format!("stream `{taken}`"), "WRONGTYPE".into()],
            destination: taken,
            broker: None,
        })
    }
    async fn private(&self, tag: &str) -> Option<Private> {
        Some(private_scratch(start(brokers::redis), tag).await)
    }
}

shared_broker!(
    /// MQTT (Mosquitto): oversized past `max_message_size=1KiB`; refused by a private broker's ACL
    /// (the shared one lets anonymous clients publish anywhere); a private broker stopped with
    /// SIGTERM (it saves its sessions and queued messages).
    Mqtt,
    "OUTBOX_TEST_MQTT_URL", "mqtt://127.0.0.1:1883");

#[async_trait]
impl SinkFixture for Mqtt {
    async fn scratch(&self, tag: &str) -> Scratch {
        make(&self.0, &ScratchOptions::new(tag)).await
    }
    fn oversized(&self) -> Option<Oversized> {
        max_message_size()
    }
    async fn rejection(&self, tag: &str) -> Option<Rejection> {
        // Anonymous clients may use `allowed/#` only: the scratch lives there.
        let server = start(|| brokers::mosquitto("topic readwrite allowed/#\n"));
        let name = ScratchOptions::new(tag).unique_name();
        let cfg = outbox_sinks::mqtt::MqttConfig::from_url(&server.url()).unwrap();
        let reader = outbox_sinks::mqtt::MqttReader::open(
            cfg,
            &format!("{name}_reader"),
            &format!("allowed/{name}/#"),
        )
        .await
        .unwrap();
        let denied = format!("denied/{name}/x");
        Some(Rejection {
            scratch: Scratch {
                sink_url: server.url(),
                destination: format!("allowed/{name}/{{event_type}}"),
                reader: Box::new(reader),
            },
            names: vec![format!("`{denied}`"), "NotAuthorized".into()],
            destination: denied,
            broker: Some(server),
        })
    }
    async fn private(&self, tag: &str) -> Option<Private> {
        Some(private_scratch(start(|| brokers::mosquitto("topic readwrite #\n")), tag).await)
    }
}

/// SQS and SNS (moto; SNS read through an SQS queue subscribed to the topic): FIFO queues and
/// topics (each key a message group, so keys keep their order) or standard ones; oversized past
/// their 256 KiB; refused for a queue or topic that does not exist; the outage is a proxy in
/// front of moto (moto keeps its state in memory: a restart would lose the queue, which SQS
/// never does).
pub struct Aws {
    scheme: &'static str,
    fifo: bool,
}

/// moto answers slowly under load (it is one Python process for every test): a longer ack
/// timeout, so a slow answer is not an outage.
const MOTO_ACK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(4);

/// A backlog moto drains in reasonable time, in small batches, so the outage still finds much
/// of it unpublished.
const MOTO_BACKLOG: Scale = Scale {
    keys: 10,
    per_key: 40,
    down_after: 100,
    batch_size: 40,
};

/// The endpoint of the shared moto and its port.
fn moto() -> (String, u16) {
    let endpoint = brokers::moto_endpoint();
    let port = endpoint
        .rsplit(':')
        .next()
        .and_then(|p| p.trim_end_matches('/').parse().ok())
        .unwrap_or(4566);
    (endpoint, port)
}

/// A scratch on the shared moto for `scheme` whose sink reaches moto through a proxy.
async fn moto_private(scheme: &str, fifo: bool, tag: &str) -> Private {
    let (endpoint, port) = moto();
    let proxy = TcpProxy::start(port);
    let mut o = ScratchOptions::new(tag);
    o.fifo = fifo;
    let mut s = make(&aws_url(scheme, &endpoint), &o).await;
    s.sink_url = aws_url(scheme, &format!("http://127.0.0.1:{}", proxy.port()));
    Private {
        broker: Box::new(proxy),
        scratch: s,
    }
}

fn aws_url(scheme: &str, endpoint: &str) -> String {
    format!("{scheme}://?region=us-east-1&endpoint={endpoint}")
}

impl Aws {
    /// SQS FIFO queues: ordered, deduplicated by message id.
    pub fn sqs_fifo() -> Self {
        Self::new("sqs", true)
    }

    /// SQS standard queues: no order, no dedupe.
    pub fn sqs_standard() -> Self {
        Self::new("sqs", false)
    }

    /// SNS FIFO topics (and a FIFO queue behind): ordered.
    pub fn sns_fifo() -> Self {
        Self::new("sns", true)
    }

    /// SNS standard topics: no order.
    pub fn sns_standard() -> Self {
        Self::new("sns", false)
    }

    fn new(scheme: &'static str, fifo: bool) -> Self {
        brokers::moto_credentials();
        Self { scheme, fifo }
    }
}

#[async_trait]
impl SinkFixture for Aws {
    async fn scratch(&self, tag: &str) -> Scratch {
        let mut o = ScratchOptions::new(tag);
        o.fifo = self.fifo;
        make(&aws_url(self.scheme, &moto().0), &o).await
    }
    fn ordered(&self) -> bool {
        self.fifo
    }
    fn ack_timeout(&self) -> std::time::Duration {
        MOTO_ACK_TIMEOUT
    }
    fn backlog(&self) -> Scale {
        MOTO_BACKLOG
    }
    fn order_scale(&self) -> (usize, usize) {
        (8, 25)
    }
    fn oversized(&self) -> Option<Oversized> {
        Some(Oversized {
            option: None,
            bytes: 300 * 1024,
            names: "the limit is 262144",
        })
    }
    async fn rejection(&self, tag: &str) -> Option<Rejection> {
        let missing = crate::unique_name("outbox_missing");
        let what = if self.scheme == "sqs" {
            "no queue"
        } else {
            "no topic"
        };
        Some(Rejection {
            scratch: self.scratch(tag).await,
            names: vec![missing.clone(), what.into()],
            destination: missing,
            broker: None,
        })
    }
    async fn private(&self, tag: &str) -> Option<Private> {
        Some(moto_private(self.scheme, self.fifo, tag).await)
    }
}

/// HTTP webhooks, signed, to a receiver in the test process that answers as a receiving
/// application does: 413 for a body over 64 KiB, 422 for a destination starting with
/// `refused`. One message per request, or batches (`mode=batch`). The outage is a proxy in
/// front of the receiver.
pub struct Http {
    options: &'static str,
}

/// The signing secret (16 bytes, base64).
const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const BODY_LIMIT: usize = 64 * 1024;

impl Http {
    /// One message per request.
    pub fn single() -> Self {
        Self { options: "" }
    }

    /// Batches of up to 37 messages per request.
    pub fn batch() -> Self {
        Self {
            options: "mode=batch&max_batch=37",
        }
    }

    /// A receiver and a scratch posting to it, through `proxy` when given; the proxy made is
    /// returned with it.
    async fn receiver(&self, tag: &str, proxied: bool) -> (Scratch, Option<TcpProxy>) {
        let prefix = ScratchOptions::new(tag).unique_name();
        let behaviour: Behaviour = Arc::new(|req| {
            if req.body.len() > BODY_LIMIT {
                Some((413, vec![]))
            } else if req.destination.starts_with("refused") {
                Some((422, vec![]))
            } else {
                None
            }
        });
        let key = outbox_sinks::http::HttpConfig::from_url(&format!("http://h/#secret={SECRET}"))
            .unwrap()
            .signing_key
            .map(|k| k.bytes().to_vec());
        let r = HttpReceiver::start(&prefix, key, Some(behaviour))
            .await
            .unwrap();
        let mut url = r.url();
        let proxy = proxied.then(|| {
            let port: u16 = url
                .trim_start_matches("http://127.0.0.1:")
                .split('/')
                .next()
                .unwrap()
                .parse()
                .unwrap();
            let proxy = TcpProxy::start(port);
            url = url.replacen(&port.to_string(), &proxy.port().to_string(), 1);
            proxy
        });
        let sink_url =
            crate::sink_suite::with_options(&url, &[&format!("secret={SECRET}"), self.options]);
        let scratch = Scratch {
            sink_url,
            destination: prefix,
            reader: Box::new(HttpReader::new(r)),
        };
        (scratch, proxy)
    }
}

#[async_trait]
impl SinkFixture for Http {
    async fn scratch(&self, tag: &str) -> Scratch {
        self.receiver(tag, false).await.0
    }
    fn oversized(&self) -> Option<Oversized> {
        Some(Oversized {
            option: None,
            bytes: 2 * BODY_LIMIT,
            names: "413",
        })
    }
    async fn rejection(&self, tag: &str) -> Option<Rejection> {
        let destination = crate::unique_name("refused");
        Some(Rejection {
            scratch: self.scratch(tag).await,
            names: vec![destination.clone(), "422".into()],
            destination,
            broker: None,
        })
    }
    async fn private(&self, tag: &str) -> Option<Private> {
        let (scratch, proxy) = self.receiver(tag, true).await;
        Some(Private {
            broker: Box::new(proxy.unwrap()),
            scratch,
        })
    }
}

/// JSON lines in a file of the test's own: no limit, nothing to refuse, no broker to stop.
pub struct File;

impl File {
    /// A file in the temporary directory per scratch.
    pub fn new() -> Self {
        Self
    }
}

impl Default for File {
    fn default() -> Self {
        Self::new()
    }
}

#[async_trait]
impl SinkFixture for File {
    async fn scratch(&self, tag: &str) -> Scratch {
        make("file:", &ScratchOptions::new(tag)).await
    }
}

/// `stdout:`, in a child process whose standard output the test reads
/// ([`crate::stdout_process`]): no limit, nothing to refuse, no broker to stop; frozen, it is a
/// pipe nobody reads.
pub struct Stdout {
    child_test: &'static str,
    process: std::sync::Mutex<Option<Arc<StdoutProcess>>>,
}

impl Stdout {
    /// The child runs the test binary's test `child_test`, which calls
    /// [`crate::stdout_process::child_main`].
    pub fn new(child_test: &'static str) -> Self {
        Self {
            child_test,
            process: std::sync::Mutex::default(),
        }
    }

    fn process(&self) -> Arc<StdoutProcess> {
        let p = StdoutProcess::start(self.child_test);
        *self.process.lock().unwrap() = Some(p.clone());
        p
    }

    fn scratch_of(p: &Arc<StdoutProcess>) -> Scratch {
        Scratch {
            sink_url: "stdout:".into(),
            destination: "{event_type}".into(),
            reader: Box::new(ProcessReader(p.clone())),
        }
    }
}

#[async_trait]
impl SinkFixture for Stdout {
    async fn scratch(&self, _tag: &str) -> Scratch {
        Self::scratch_of(&self.process())
    }
    async fn sink(&self, _url: &str) -> Arc<dyn outbox_core::Sink> {
        let p = self.process.lock().unwrap().clone();
        Arc::new(ProcessSink(p.expect("a scratch first")))
    }
    async fn private(&self, _tag: &str) -> Option<Private> {
        let p = self.process();
        Some(Private {
            broker: Box::new(ProcessReader(p.clone())),
            scratch: Self::scratch_of(&p),
        })
    }
}
