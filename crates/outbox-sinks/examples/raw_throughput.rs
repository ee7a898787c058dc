//! Raw throughput of the broker clients behind the NATS, RabbitMQ, Redis, MQTT, HTTP, SQS and
//! SNS sinks, and of the sinks themselves, with 200-byte messages on this machine: what the sink
//! can hope for at best.
//!
//! ```sh
//! cargo run --release -p outbox-sinks --example raw_throughput -- [nats|amqp|redis|mqtt|http|sqs|sns|all] [N]
//! ```
//!
//! Uses the servers of `../shared/services.md` (override with `NATS_URL`, `AMQP_URL`,
//! `REDIS_URL`, `MQTT_URL`, `SQS_URL`, `SNS_URL`: the sink URLs, e.g.
//! `sqs://?region=us-east-1&endpoint=http://127.0.0.1:4567` for LocalStack), and names of its
//! own with a random suffix, deleted afterwards. `all` leaves SQS and SNS out: moto, the
//! emulator the tests use, slows down with every message a queue holds (`docs/sinks.md`).

#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use outbox_core::{Envelope, Sink};

const PAYLOAD: usize = 200;
/// Messages per sink call, as the relay's default batch.
const BATCH: usize = 1000;

fn env(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

fn suffix() -> String {
    format!("{:08x}", fastrand::u32(..))
}

fn rate(what: &str, n: usize, took: Duration) {
    println!(
        "{what:<58} {n:>7} msgs in {:>6.2} s = {:>8.0} msgs/s",
        took.as_secs_f64(),
        n as f64 / took.as_secs_f64()
    );
}

fn envelopes(destination: &str, n: usize) -> Vec<Envelope> {
    let payload = outbox_core::Bytes::from(format!("{{\"p\":\"{}\"}}", "x".repeat(PAYLOAD - 8)));
    (0..n)
        .map(|i| Envelope {
            id: uuid::Uuid::now_v7(),
            destination: destination.to_string(),
            key: format!("k{}", i % 100),
            headers: vec![
                ("outbox-message-id".into(), uuid::Uuid::now_v7().to_string()),
                ("outbox-aggregate-id".into(), format!("k{}", i % 100)),
            ],
            payload: payload.clone(),
            created_at: chrono::Utc::now(),
        })
        .collect()
}

async fn through_sink(what: &str, sink: &dyn Sink, destination: &str, n: usize) {
    let all = envelopes(destination, n);
    let started = Instant::now();
    for chunk in all.chunks(BATCH) {
        let results = sink.publish(chunk).await;
        assert!(
            results.iter().all(Result::is_ok),
            "{:?}",
            results.iter().find(|r| r.is_err())
        );
    }
    rate(what, n, started.elapsed());
}

/// `n` messages through `sink` one per call, each after the previous one's answer: what the
/// relay does for one hot key when the sink does not order keys itself.
async fn one_by_one(what: &str, sink: &dyn Sink, destination: &str, n: usize) {
    let all = envelopes(destination, n);
    let started = Instant::now();
    for e in all.chunks(1) {
        let results = sink.publish(e).await;
        assert!(results.iter().all(Result::is_ok), "{results:?}");
    }
    rate(what, n, started.elapsed());
}

/// JetStream into a file-storage stream with a duplicate window, as `outbox bench` drains into:
/// the async-nats client alone (every message's ack awaited, 1,000 in flight), then `NatsSink`.
async fn nats(n: usize) {
    let url = env("NATS_URL", "nats://127.0.0.1:4222");
    let js = async_nats::jetstream::new(async_nats::connect(&url).await.unwrap());
    let name = format!("outbox_raw_{}", suffix());
    let stream = name.to_uppercase();
    outbox_sinks::nats::create_stream(&js, &stream, vec![format!("{name}.>")], true)
        .await
        .unwrap();
    let payload = bytes::Bytes::from(vec![b'x'; PAYLOAD]);
    let started = Instant::now();
    for _ in 0..n / BATCH {
        let mut acks = Vec::with_capacity(BATCH);
        for _ in 0..BATCH {
            let mut h = async_nats::HeaderMap::new();
            h.insert("Nats-Msg-Id", uuid::Uuid::now_v7().to_string().as_str());
            acks.push(
                js.publish_with_headers(format!("{name}.k"), h, payload.clone())
                    .await
                    .unwrap(),
            );
        }
        for a in acks {
            a.await.unwrap();
        }
    }
    rate(
        "nats: JetStream publish, Nats-Msg-Id, 1000 acks in flight",
        n / BATCH * BATCH,
        started.elapsed(),
    );
    let sink = outbox_sinks::nats::NatsSink::connect(
        outbox_sinks::nats::NatsConfig::from_url(&url).unwrap(),
    )
    .await
    .unwrap();
    through_sink(
        "NatsSink::publish, calls of 1000",
        &sink,
        &format!("{name}.sink"),
        n,
    )
    .await;
    one_by_one(
        "NatsSink::publish, one message per call",
        &sink,
        &format!("{name}.sink"),
        n / 20,
    )
    .await;
    let started = Instant::now();
    for _ in 0..n / 20 {
        let mut h = async_nats::HeaderMap::new();
        h.insert("Nats-Msg-Id", uuid::Uuid::now_v7().to_string().as_str());
        js.publish_with_headers(format!("{name}.k"), h, payload.clone())
            .await
            .unwrap()
            .await
            .unwrap();
    }
    rate(
        "nats: JetStream publish, one ack awaited after another",
        n / 20,
        started.elapsed(),
    );
    let _ = js.delete_stream(&stream).await;
}

/// Webhooks into an in-process receiver on 127.0.0.1 (signed, checked): reqwest alone with 32
/// requests in flight, then `HttpSink` one message per request and in batches of 100.
async fn http(n: usize) {
    use futures::StreamExt as _;
    let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let key = {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD
            .decode(secret.trim_start_matches("whsec_"))
            .unwrap()
    };
    let receiver = outbox_sinks::http::HttpReceiver::start(
        &format!("raw_{}", suffix()),
        Some(key.clone()),
        None,
    )
    .await
    .unwrap();
    let url = receiver.url().replace("{destination}", "raw");
    let client = reqwest::Client::new();
    let payload = bytes::Bytes::from(vec![b'x'; PAYLOAD]);
    let post = || {
        let (client, url, payload, key) = (&client, &url, payload.clone(), &key);
        async move {
            let id = uuid::Uuid::now_v7().to_string();
            let ts = chrono::Utc::now().timestamp();
            let sig = outbox_sinks::http::sign::signature(key, &id, ts, &payload);
            let r = client
                .post(url)
                .header("outbox-message-id", &id)
                .header("webhook-id", &id)
                .header("webhook-timestamp", ts.to_string())
                .header("webhook-signature", sig)
                .body(payload)
                .send()
                .await
                .unwrap();
            assert!(r.status().is_success());
        }
    };
    let started = Instant::now();
    futures::stream::iter((0..n).map(|_| post()))
        .buffer_unordered(32)
        .collect::<Vec<()>>()
        .await;
    rate(
        "http: reqwest POST, signed, 32 in flight",
        n,
        started.elapsed(),
    );
    let started = Instant::now();
    for _ in 0..n / 20 {
        post().await;
    }
    rate(
        "http: reqwest POST, signed, one after another",
        n / 20,
        started.elapsed(),
    );
    for (what, options) in [
        ("HttpSink::publish, calls of 1000, mode=single", ""),
        (
            "HttpSink::publish, calls of 1000, mode=batch",
            "&mode=batch",
        ),
    ] {
        let sink = outbox_sinks::http::HttpSink::connect(
            outbox_sinks::http::HttpConfig::from_url(&format!(
                "{}#secret={secret}{options}",
                receiver.url()
            ))
            .unwrap(),
        )
        .unwrap();
        through_sink(what, &sink, "raw", n).await;
        one_by_one(
            &what.replace("calls of 1000", "one message per call"),
            &sink,
            "raw",
            n / 20,
        )
        .await;
    }
}

async fn amqp(n: usize) {
    use lapin::options::*;
    use lapin::types::FieldTable;
    let url = env("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2f");
    let conn = lapin::Connection::connect(&url, Default::default())
        .await
        .unwrap();
    let ch = conn.create_channel().await.unwrap();
    let queue = format!("outbox_raw_{}", suffix());
    ch.queue_declare(
        queue.as_str().into(),
        QueueDeclareOptions {
            durable: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await
    .unwrap();
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    let payload = vec![b'x'; PAYLOAD];
    let started = Instant::now();
    for _ in 0..n / BATCH {
        let mut confirms = Vec::with_capacity(BATCH);
        for _ in 0..BATCH {
            confirms.push(
                ch.basic_publish(
                    "".into(),
                    queue.as_str().into(),
                    BasicPublishOptions::default(),
                    &payload,
                    lapin::BasicProperties::default().with_delivery_mode(2),
                )
                .await
                .unwrap(),
            );
        }
        for c in futures::future::join_all(confirms).await {
            assert!(c.unwrap().is_ack());
        }
    }
    rate(
        "lapin: persistent, durable queue, confirms, 1000 in flight",
        n / BATCH * BATCH,
        started.elapsed(),
    );
    ch.queue_purge(queue.as_str().into(), Default::default())
        .await
        .unwrap();
    let sink = outbox_sinks::amqp::AmqpSink::connect(
        outbox_sinks::amqp::AmqpConfig::from_url(&url).unwrap(),
    )
    .await
    .unwrap();
    through_sink("AmqpSink::publish, calls of 1000", &sink, &queue, n).await;
    one_by_one(
        "AmqpSink::publish, one message per call",
        &sink,
        &queue,
        n / 20,
    )
    .await;
    let started = Instant::now();
    for _ in 0..n / 20 {
        let confirm = ch
            .basic_publish(
                "".into(),
                queue.as_str().into(),
                BasicPublishOptions::default(),
                &payload,
                lapin::BasicProperties::default().with_delivery_mode(2),
            )
            .await
            .unwrap();
        assert!(confirm.await.unwrap().is_ack());
    }
    rate(
        "lapin: persistent, one confirm awaited after another",
        n / 20,
        started.elapsed(),
    );
    ch.queue_delete(queue.as_str().into(), Default::default())
        .await
        .unwrap();
}

async fn redis(n: usize) {
    let url = env("REDIS_URL", "redis://127.0.0.1:6379");
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    let stream = format!("outbox_raw_{}", suffix());
    let payload = [b'x'; PAYLOAD];
    let started = Instant::now();
    for _ in 0..n / BATCH {
        let mut pipe = redis::pipe();
        for i in 0..BATCH {
            pipe.cmd("XADD")
                .arg(&stream)
                .arg("*")
                .arg("id")
                .arg(i)
                .arg("payload")
                .arg(&payload[..]);
        }
        let _: Vec<String> = pipe.query_async(&mut c).await.unwrap();
    }
    rate(
        "redis: pipelined XADD, 1000 per pipeline",
        n / BATCH * BATCH,
        started.elapsed(),
    );
    let _: () = redis::AsyncCommands::del(&mut c, &stream).await.unwrap();
    for (what, extra) in [
        ("RedisSink::publish, calls of 1000", ""),
        ("RedisSink::publish, calls of 1000, dedupe=2m", "?dedupe=2m"),
    ] {
        let sink = outbox_sinks::redis::RedisSink::connect(
            outbox_sinks::redis::RedisConfig::from_url(&format!("{url}{extra}")).unwrap(),
        )
        .unwrap();
        through_sink(what, &sink, &stream, n).await;
        one_by_one(
            &what.replace("calls of 1000", "one message per call"),
            &sink,
            &stream,
            n / 20,
        )
        .await;
        let _: () = redis::AsyncCommands::del(&mut c, &stream).await.unwrap();
    }
    let started = Instant::now();
    for i in 0..n / 20 {
        let _: String = redis::cmd("XADD")
            .arg(&stream)
            .arg("*")
            .arg("id")
            .arg(i)
            .arg("payload")
            .arg(&payload[..])
            .query_async(&mut c)
            .await
            .unwrap();
    }
    rate("redis: XADD, one after another", n / 20, started.elapsed());
    let _: () = redis::AsyncCommands::del(&mut c, &stream).await.unwrap();
}

async fn mqtt(n: usize) {
    use rumqttc::v5::mqttbytes::v5::Packet;
    use rumqttc::v5::mqttbytes::QoS;
    use rumqttc::v5::{AsyncClient, Event, MqttOptions};
    let url = env("MQTT_URL", "mqtt://127.0.0.1:1883");
    let cfg = outbox_sinks::mqtt::MqttConfig::from_url(&url).unwrap();
    let topic = format!("outbox_raw_{}/t", suffix());
    let mut opts = MqttOptions::new(
        format!("outbox-raw-{}", suffix()),
        cfg.host.clone(),
        cfg.port,
    );
    opts.set_keep_alive(Duration::from_secs(30));
    let (client, mut eventloop) = AsyncClient::new(opts, 10_000);
    let payload = vec![b'x'; PAYLOAD];
    let poller = tokio::spawn(async move {
        let mut acks = 0usize;
        let mut receive_max = None;
        while acks < n {
            match eventloop.poll().await.unwrap() {
                Event::Incoming(Packet::PubAck(_)) => acks += 1,
                Event::Incoming(Packet::ConnAck(c)) => {
                    receive_max = c.properties.and_then(|p| p.receive_max)
                }
                _ => {}
            }
        }
        receive_max
    });
    let props = rumqttc::v5::mqttbytes::v5::PublishProperties {
        user_properties: vec![
            ("outbox-message-id".into(), uuid::Uuid::now_v7().to_string()),
            ("outbox-aggregate-id".into(), "k1".into()),
        ],
        content_type: Some("application/json".into()),
        ..Default::default()
    };
    let started = Instant::now();
    for _ in 0..n {
        client
            .publish_with_properties(
                topic.clone(),
                QoS::AtLeastOnce,
                false,
                payload.clone(),
                props.clone(),
            )
            .await
            .unwrap();
    }
    let receive_max = poller.await.unwrap();
    rate(
        &format!("rumqttc v5: QoS 1, 2 user properties, PUBACKs (receive max {receive_max:?})"),
        n,
        started.elapsed(),
    );
    let sink = outbox_sinks::mqtt::MqttSink::connect(cfg).unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    through_sink("MqttSink::publish, calls of 1000", &sink, &topic, n).await;
    one_by_one(
        "MqttSink::publish, one message per call",
        &sink,
        &topic,
        n / 20,
    )
    .await;
    // Four calls in flight at once, as four relay workers would.
    let all = envelopes(&topic, n);
    let started = Instant::now();
    let sink = &sink;
    futures::future::join_all(all.chunks(n / 4).map(|part| async move {
        for chunk in part.chunks(BATCH) {
            assert!(sink.publish(chunk).await.iter().all(Result::is_ok));
        }
    }))
    .await;
    rate(
        "MqttSink::publish, calls of 1000, 4 at once",
        n,
        started.elapsed(),
    );
}

/// `n` messages for raw batch calls, ten per call: each entry's id in its call and a message id.
fn aws_ids(n: usize) -> Vec<Vec<(String, String)>> {
    (0..n)
        .collect::<Vec<_>>()
        .chunks(10)
        .map(|c| {
            c.iter()
                .map(|i| (format!("m{i}"), uuid::Uuid::now_v7().to_string()))
                .collect()
        })
        .collect()
}

/// A consumer draining the queue at `queue_url` (receive, then delete, as `outbox bench`'s
/// reader does) until the returned flag is set: one-key rates are measured with and without it,
/// since each message then costs the service three calls instead of one.
fn drain_meanwhile(
    client: &aws_sdk_sqs::Client,
    queue_url: &str,
) -> (
    std::sync::Arc<std::sync::atomic::AtomicBool>,
    tokio::task::JoinHandle<usize>,
) {
    use outbox_sinks::read::Reader as _;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut reader = outbox_sinks::sqs::SqsReader::new(
        client.clone(),
        queue_url.to_string(),
        "raw".into(),
        false,
    );
    let flag = stop.clone();
    let task = tokio::spawn(async move {
        let mut read = 0;
        while !flag.load(std::sync::atomic::Ordering::Relaxed) {
            read += reader.poll(Duration::from_secs(1)).await.delivered.len();
        }
        read
    });
    (stop, task)
}

/// SQS into a standard queue: the SDK alone (`SendMessageBatch` of ten with the message id
/// attribute, 32 calls in flight, as the sink sends), then `SqsSink`.
async fn sqs(n: usize) {
    let url = env(
        "SQS_URL",
        "sqs://?region=us-east-1&endpoint=http://127.0.0.1:4566",
    );
    let client = outbox_sinks::sqs::reader_client(&url).await.unwrap();
    let name = format!("outbox_raw_{}", suffix());
    let queue = outbox_sinks::sqs::create_queue(&client, &name, false)
        .await
        .unwrap();
    let body = "x".repeat(PAYLOAD);
    sqs_batches(
        "aws-sdk-sqs: SendMessageBatch of 10, 32 calls in flight",
        &client,
        &queue,
        n,
    )
    .await;
    // One key in order: one message per call, each after the previous one's answer.
    let one = n / 20;
    let started = Instant::now();
    for _ in 0..one {
        client
            .send_message()
            .queue_url(&queue)
            .message_body(&body)
            .send()
            .await
            .unwrap();
    }
    rate(
        "aws-sdk-sqs: SendMessage, one call after another",
        one,
        started.elapsed(),
    );
    let sink = outbox_sinks::sqs::SqsSink::connect(
        outbox_sinks::sqs::SqsConfig::sqs_from_url(&format!("{url}&ack_timeout=30s")).unwrap(),
    )
    .await
    .unwrap();
    through_sink("SqsSink::publish, calls of 1000", &sink, &name, n).await;
    one_by_one(
        "SqsSink::publish, one message per call",
        &sink,
        &name,
        n / 20,
    )
    .await;
    let _ = client.purge_queue().queue_url(&queue).send().await;
    let (stop, reader) = drain_meanwhile(&client, &queue);
    // With a reader draining, as in `outbox bench`: the service serves both.
    sqs_batches(
        "aws-sdk-sqs: SendMessageBatch of 10, 32 in flight, a reader draining",
        &client,
        &queue,
        n,
    )
    .await;
    through_sink(
        "SqsSink::publish, calls of 1000, a reader draining",
        &sink,
        &name,
        n,
    )
    .await;
    let started = Instant::now();
    for _ in 0..one {
        client
            .send_message()
            .queue_url(&queue)
            .message_body(&body)
            .send()
            .await
            .unwrap();
    }
    rate(
        "aws-sdk-sqs: SendMessage, one after another, a reader draining",
        one,
        started.elapsed(),
    );
    one_by_one(
        "SqsSink::publish, one message per call, a reader draining",
        &sink,
        &name,
        one,
    )
    .await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = reader.await;
    let _ = client.delete_queue().queue_url(&queue).send().await;
}

/// SNS into a standard topic with a queue subscribed (raw delivery, as `outbox bench` reads
/// it): the SDK alone (`PublishBatch` of ten, 32 calls in flight), then `SnsSink`.
async fn sns(n: usize) {
    let url = env(
        "SNS_URL",
        "sns://?region=us-east-1&endpoint=http://127.0.0.1:4566",
    );
    let sdk = outbox_sinks::sns::SnsConfig::sns_from_url(&url)
        .unwrap()
        .reader_sdk_config()
        .await
        .unwrap();
    let sns = aws_sdk_sns::Client::new(&sdk);
    let sqs = aws_sdk_sqs::Client::new(&sdk);
    let name = format!("outbox_raw_{}", suffix());
    let topic = outbox_sinks::sns::create_topic(&sns, &name, false)
        .await
        .unwrap();
    let queue = outbox_sinks::sqs::create_queue(&sqs, &name, false)
        .await
        .unwrap();
    outbox_sinks::sns::subscribe_queue(&sns, &sqs, &topic, &queue)
        .await
        .unwrap();
    let body = "x".repeat(PAYLOAD);
    sns_batches(
        "aws-sdk-sns: PublishBatch of 10, 32 calls in flight",
        &sns,
        &topic,
        n,
    )
    .await;
    let one = n / 20;
    let started = Instant::now();
    for _ in 0..one {
        sns.publish()
            .topic_arn(&topic)
            .message(&body)
            .send()
            .await
            .unwrap();
    }
    rate(
        "aws-sdk-sns: Publish, one call after another",
        one,
        started.elapsed(),
    );
    let sink = outbox_sinks::sns::SnsSink::connect(
        outbox_sinks::sns::SnsConfig::sns_from_url(&format!("{url}&ack_timeout=30s")).unwrap(),
    )
    .await
    .unwrap();
    through_sink("SnsSink::publish, calls of 1000", &sink, &topic, n).await;
    one_by_one(
        "SnsSink::publish, one message per call",
        &sink,
        &topic,
        n / 20,
    )
    .await;
    // With a reader draining the subscribed queue, as in `outbox bench`: the service fans out
    // and serves the reader too.
    let _ = sqs.purge_queue().queue_url(&queue).send().await;
    let (stop, reader) = drain_meanwhile(&sqs, &queue);
    sns_batches(
        "aws-sdk-sns: PublishBatch of 10, 32 in flight, a reader draining",
        &sns,
        &topic,
        n,
    )
    .await;
    through_sink(
        "SnsSink::publish, calls of 1000, a reader draining",
        &sink,
        &topic,
        n,
    )
    .await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = reader.await;
    let _ = sns.delete_topic().topic_arn(&topic).send().await;
    let _ = sqs.delete_queue().queue_url(&queue).send().await;
}

/// Sends `n` messages as batches of ten ids (an entry id and a message id each) through
/// `send`, 32 batches in flight, and prints the rate as `what`.
async fn timed_batches<F, Fut>(what: &str, n: usize, send: F)
where
    F: Fn(Vec<(String, String)>) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    use futures::StreamExt as _;
    let started = Instant::now();
    futures::stream::iter(aws_ids(n).into_iter().map(send))
        .buffer_unordered(32)
        .collect::<Vec<()>>()
        .await;
    rate(what, n, started.elapsed());
}

/// `n` messages through the SDK alone as `SendMessageBatch` calls of ten with the message id
/// attribute (as the sink sends), 32 calls in flight.
async fn sqs_batches(what: &str, client: &aws_sdk_sqs::Client, queue: &str, n: usize) {
    use aws_sdk_sqs::types::{MessageAttributeValue, SendMessageBatchRequestEntry};
    let body = "x".repeat(PAYLOAD);
    timed_batches(what, n, |batch| {
        let entries = batch
            .into_iter()
            .map(|(id, message_id)| {
                let attribute = MessageAttributeValue::builder()
                    .data_type("String")
                    .string_value(message_id)
                    .build()
                    .unwrap();
                SendMessageBatchRequestEntry::builder()
                    .id(id)
                    .message_body(body.clone())
                    .message_attributes("outbox-message-id", attribute)
                    .build()
                    .unwrap()
            })
            .collect();
        let call = client
            .send_message_batch()
            .queue_url(queue)
            .set_entries(Some(entries))
            .send();
        async move {
            let out = call.await.unwrap();
            assert!(out.failed().is_empty(), "{:?}", out.failed());
        }
    })
    .await;
}

/// `n` messages through the SDK alone as `PublishBatch` calls of ten with the message id
/// attribute (as the sink sends), 32 calls in flight.
async fn sns_batches(what: &str, sns: &aws_sdk_sns::Client, topic: &str, n: usize) {
    use aws_sdk_sns::types::{MessageAttributeValue, PublishBatchRequestEntry};
    let body = "x".repeat(PAYLOAD);
    timed_batches(what, n, |batch| {
        let entries = batch
            .into_iter()
            .map(|(id, message_id)| {
                let attribute = MessageAttributeValue::builder()
                    .data_type("String")
                    .string_value(message_id)
                    .build()
                    .unwrap();
                PublishBatchRequestEntry::builder()
                    .id(id)
                    .message(body.clone())
                    .message_attributes("outbox-message-id", attribute)
                    .build()
                    .unwrap()
            })
            .collect();
        let call = sns
            .publish_batch()
            .topic_arn(topic)
            .set_publish_batch_request_entries(Some(entries))
            .send();
        async move {
            let out = call.await.unwrap();
            assert!(out.failed().is_empty(), "{:?}", out.failed());
        }
    })
    .await;
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let which = args.get(1).map(String::as_str).unwrap_or("all");
    let n: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(100_000);
    if matches!(which, "nats" | "all") {
        nats(n).await;
    }
    if matches!(which, "amqp" | "all") {
        amqp(n).await;
    }
    if matches!(which, "redis" | "all") {
        redis(n).await;
    }
    if matches!(which, "mqtt" | "all") {
        mqtt(n).await;
    }
    if matches!(which, "http" | "all") {
        http(n).await;
    }
    if which == "sqs" {
        sqs(n).await;
    }
    if which == "sns" {
        sns(n).await;
    }
}
