//! What is particular to the Redis Streams sink, against the real Redis on this machine (a
//! private redis-server from the testkit for the restart): the fields of a stream entry, the
//! dedupe window, and `maxlen`. What every sink must do is the conformance suite's
//! (`outbox-sinks/tests/conformance.rs`, module `redis`).

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use outbox_core::{Envelope, Sink};
use outbox_sinks::redis::{RedisConfig, RedisSink};
use outbox_testkit::relay::envelope;

fn redis_url() -> String {
    std::env::var("OUTBOX_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

fn sink(url: &str, options: &str) -> Arc<RedisSink> {
    let url = format!("{url}?ack_timeout=800ms{options}");
    Arc::new(RedisSink::connect(RedisConfig::from_url(&url).unwrap()).unwrap())
}

async fn redis_conn(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

async fn xlen(url: &str, stream: &str) -> u64 {
    let mut c = redis_conn(url).await;
    redis::AsyncCommands::xlen(&mut c, stream).await.unwrap()
}

/// A stream entry holds exactly the four documented fields: `id`, `key`, `headers`, `payload`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_has_exactly_the_id_key_headers_and_payload_fields() {
    let stream = outbox_testkit::unique_name("outbox_redis_fields");
    let r = sink(&redis_url(), "")
        .publish(&[envelope(&stream, "p-42", 0)])
        .await;
    assert!(r[0].is_ok(), "{r:?}");
    let mut c = redis_conn(&redis_url()).await;
    let raw: redis::streams::StreamRangeReply = redis::AsyncCommands::xrange_all(&mut c, &stream)
        .await
        .unwrap();
    assert_eq!(raw.ids.len(), 1);
    let mut fields: Vec<&str> = raw.ids[0].map.keys().map(String::as_str).collect();
    fields.sort();
    assert_eq!(fields, ["headers", "id", "key", "payload"]);
    let _: () = redis::AsyncCommands::del(&mut c, &stream).await.unwrap();
}

/// On a private server: the restart in the middle empties the script cache (the sink loads the
/// script again) and must keep the dedupe markers (they are in the append-only file).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_republished_message_is_appended_once_inside_the_dedupe_window_and_twice_without() {
    let mut redis = tokio::task::block_in_place(outbox_testkit::brokers::redis);
    let stream = outbox_testkit::unique_name("outbox_redis_dedupe");
    let plain = format!("{stream}_plain");
    let e = envelope(&stream, "k", 0);
    let deduped = sink(&redis.url(), "&dedupe=1m");
    // The same message three times (a relay crash after the append, before the record), and a
    // second message once.
    for _ in 0..3 {
        assert!(deduped.publish(std::slice::from_ref(&e)).await[0].is_ok());
    }
    assert!(deduped.publish(&[envelope(&stream, "k", 1)]).await[0].is_ok());
    assert_eq!(
        xlen(&redis.url(), &stream).await,
        2,
        "the republished message is appended once"
    );
    tokio::task::block_in_place(|| {
        redis.stop();
        redis.start();
    });
    // The first publish after the restart may find the connection gone (an outage, retried).
    let deadline = Instant::now() + Duration::from_secs(10);
    while deduped.publish(std::slice::from_ref(&e)).await[0].is_err() {
        assert!(Instant::now() < deadline, "the sink never reconnected");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(deduped.publish(&[envelope(&stream, "k", 2)]).await[0].is_ok());
    assert_eq!(
        xlen(&redis.url(), &stream).await,
        3,
        "still deduped after the restart, and new messages go on"
    );

    let mut p = e.clone();
    p.destination = plain.clone();
    let undeduped = sink(&redis.url(), "");
    for _ in 0..2 {
        assert!(undeduped.publish(std::slice::from_ref(&p)).await[0].is_ok());
    }
    assert_eq!(
        xlen(&redis.url(), &plain).await,
        2,
        "without a window Redis keeps both; consumers dedupe on `id`"
    );
}

/// `maxlen=100` trims the stream approximately: at least 100 entries stay, far from 1,000.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maxlen_trims_the_stream_approximately() {
    let stream = outbox_testkit::unique_name("outbox_redis_maxlen");
    let s = sink(&redis_url(), "&maxlen=100");
    let batch: Vec<Envelope> = (0..1000).map(|n| envelope(&stream, "k", n)).collect();
    for chunk in batch.chunks(100) {
        assert!(s.publish(chunk).await.iter().all(Result::is_ok));
    }
    let len = xlen(&redis_url(), &stream).await;
    // `~` trims whole macro nodes (100 entries by default): at least 100 stay, far from 1,000.
    assert!((100..=300).contains(&len), "{len}");
    let mut c = redis_conn(&redis_url()).await;
    let _: () = redis::AsyncCommands::del(&mut c, &stream).await.unwrap();
}
