//! What is particular to the RabbitMQ sink, against the real RabbitMQ on this machine: the
//! broker's own view of a message (persistent, `message_id`, `type`), unroutable messages and
//! headers RabbitMQ would act on, a connection the broker closes, the default exchange, and
//! refused credentials. What every sink must do is the conformance suite's
//! (`outbox-sinks/tests/conformance.rs`, module `amqp`).

#![allow(clippy::unwrap_used)]

use crate::common;
use std::collections::{HashMap, HashSet};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use common::World;
use lapin::options::{BasicGetOptions, ExchangeDeclareOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use outbox_core::{NewMessage, Store};
use outbox_sinks::amqp::{AmqpConfig, AmqpReader, AmqpSink};
use outbox_sinks::read::{scratch, Scratch, ScratchOptions};
use outbox_testkit::relay::{
    assert_key_order, envelope, interleaved, keys, read_distinct, triples, wait_failed,
    RunningRelay,
};

fn amqp_url() -> String {
    std::env::var("OUTBOX_TEST_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into())
}

/// The test relay's publish deadline is a third of its 3 s lease: the confirms' wait fits in it.
fn sink_url(base: &str, extra: &str) -> String {
    format!("{base}?ack_timeout=800ms{extra}")
}

async fn sink(url: &str) -> Arc<AmqpSink> {
    Arc::new(
        AmqpSink::connect(AmqpConfig::from_url(url).unwrap())
            .await
            .unwrap(),
    )
}

/// A connection of the test's own to the shared broker, and a channel on it: the broker's own
/// client, to look at what the sink did.
async fn channel() -> (lapin::Connection, lapin::Channel) {
    let conn = lapin::Connection::connect(&amqp_url(), Default::default())
        .await
        .unwrap();
    let ch = conn.create_channel().await.unwrap();
    (conn, ch)
}

async fn declare_queue(ch: &lapin::Channel, name: &str, options: QueueDeclareOptions) {
    ch.queue_declare(name.into(), options, FieldTable::default())
        .await
        .unwrap();
}

async fn new_scratch(tag: &str) -> Scratch {
    scratch(&amqp_url(), &ScratchOptions::new(tag))
        .await
        .expect("RabbitMQ must be running")
}

/// The broker's own view of a relayed message, through a second queue bound to the scratch
/// exchange and `basic.get`: persistent (delivery mode 2), `message_id` the outbox id, `type`
/// the event type, on the exchange and routing key the template named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_is_persistent_with_its_id_as_message_id_and_its_event_as_type() {
    let w = World::with_stream(false).await;
    let mut s = new_scratch("amqpprops").await;
    let exchange = s.destination.split('/').next().unwrap().to_string();
    let m = common::payment();
    w.store().insert(std::slice::from_ref(&m)).await.unwrap();
    let (conn, ch) = channel().await;
    let look = format!("{exchange}_look");
    declare_queue(
        &ch,
        &look,
        QueueDeclareOptions {
            auto_delete: true,
            ..Default::default()
        },
    )
    .await;
    ch.queue_bind(
        look.as_str().into(),
        exchange.as_str().into(),
        "#".into(),
        Default::default(),
        FieldTable::default(),
    )
    .await
    .unwrap();
    let relay = RunningRelay::start(
        w.dyn_store(),
        sink(&sink_url(&amqp_url(), "")).await,
        w.relay_config_to(&s.destination),
    );
    w.wait_drained(Duration::from_secs(20)).await;
    relay.stop().await;

    let got = ch
        .basic_get(look.as_str().into(), BasicGetOptions { no_ack: true })
        .await
        .unwrap()
        .expect("the message is in the queue");
    let p = &got.delivery.properties;
    assert_eq!(*p.delivery_mode(), Some(2), "persistent");
    assert_eq!(
        p.message_id().as_ref().unwrap().as_str(),
        m.id.to_string(),
        "message_id is the outbox id"
    );
    assert_eq!(p.kind().as_ref().unwrap().as_str(), "created");
    assert_eq!(got.delivery.exchange.as_str(), exchange);
    assert_eq!(got.delivery.routing_key.as_str(), "created");
    ch.queue_delete(look.as_str().into(), Default::default())
        .await
        .unwrap();
    conn.close(200, "OK".into()).await.unwrap();
    s.reader.cleanup().await;
    w.drop_all().await;
}

/// A row for an exchange with no queue bound comes back unroutable (the sink publishes
/// `mandatory`), and one whose headers set `BCC` (which RabbitMQ would act on) is invalid: each
/// ends `failed` with its reason, the first after its budget, the second at once, and the other
/// rows flow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unroutable_and_bcc_rows_fail_with_their_reason_and_others_flow() {
    let w = World::with_stream(false).await;
    let mut s = new_scratch("amqprej").await;
    let lonely = outbox_testkit::unique_name("amqp_lonely");
    let (conn, ch) = channel().await;
    ch.exchange_declare(
        lonely.as_str().into(),
        lapin::ExchangeKind::Direct,
        ExchangeDeclareOptions::default(),
        FieldTable::default(),
    )
    .await
    .unwrap();
    let unroutable = NewMessage::new("order", "unroutable", "placed", serde_json::json!({}))
        .topic(format!("{lonely}/nowhere.key"));
    let bcc =
        NewMessage::new("order", "bcc", "placed", serde_json::json!({})).header("BCC", "elsewhere");
    let good = interleaved(&["good".to_string()], 0..2);
    w.store()
        .insert(&[unroutable.clone(), bcc.clone()])
        .await
        .unwrap();
    w.store().insert(&good).await.unwrap();
    let mut cfg = w.relay_config_to(&s.destination);
    cfg.retry.max_attempts = 2;
    let relay = RunningRelay::start(w.dyn_store(), sink(&sink_url(&amqp_url(), "")).await, cfg);
    let failed = wait_failed(w.dyn_store().as_ref(), 2, Duration::from_secs(30)).await;
    w.wait_drained(Duration::from_secs(20)).await;
    relay.stop().await;

    let errors: HashMap<String, (String, i32)> = failed
        .into_iter()
        .map(|f| {
            (
                f.aggregate_id,
                (f.last_error.unwrap_or_default(), f.attempts),
            )
        })
        .collect();
    let (e, attempts) = &errors["unroutable"];
    assert!(
        e.contains("unroutable")
            && e.contains(&format!("exchange `{lonely}` routing key `nowhere.key`")),
        "{e}"
    );
    assert_eq!(*attempts, 2, "a rejection spends its budget");
    let (e, attempts) = &errors["bcc"];
    assert!(e.contains("`BCC`"), "{e}");
    assert_eq!(*attempts, 1);
    let got = read_distinct(s.reader.as_mut(), 2, Duration::from_secs(30)).await;
    assert_eq!(got.len(), 2);
    assert_eq!(assert_key_order(triples(&got))["good"], 2);
    ch.exchange_delete(lonely.as_str().into(), Default::default())
        .await
        .unwrap();
    conn.close(200, "OK".into()).await.unwrap();
    s.reader.cleanup().await;
    w.drop_all().await;
}

/// Closes, from the broker's side, every connection whose client-given name is `name`
/// (`rabbitmqctl close_connection`): the broker stays up for everyone else.
fn close_connections_named(name: &str) -> usize {
    let out = Command::new("rabbitmqctl")
        .args(["-q", "list_connections", "pid", "client_properties"])
        .output()
        .expect("rabbitmqctl must be installed");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // One line per connection: `<pid>\t[{"connection_name",longstr,"NAME"},…]`.
    let quoted = format!("\"{name}\"");
    let mut closed = 0;
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some((pid, props)) = line.split_once('\t') else {
            continue;
        };
        if !props.contains(&quoted) {
            continue;
        }
        let out = Command::new("rabbitmqctl")
            .args(["-q", "close_connection", pid, "outbox-test-close"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "close_connection {pid}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        closed += 1;
    }
    closed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_the_broker_closes_is_reopened_and_nothing_is_lost() {
    let w = World::with_stream(false).await;
    let mut s = new_scratch("amqpclose").await;
    let name = outbox_testkit::unique_name("outbox_close_test");
    let key_names = keys("k", 10);
    let mut cfg = w.relay_config_to(&s.destination);
    cfg.retry.max_attempts = 1000;
    let relay = RunningRelay::start(
        w.dyn_store(),
        sink(&sink_url(&amqp_url(), &format!("&connection_name={name}"))).await,
        cfg,
    );
    w.store()
        .insert(&interleaved(&key_names, 0..20))
        .await
        .unwrap();
    w.wait_drained(Duration::from_secs(30)).await;
    // Close it while more rows are written, twice.
    for round in 0..2 {
        let from = 20 + round * 20;
        let writer = {
            let store = w.store();
            let msgs = interleaved(&key_names, from..from + 20);
            tokio::spawn(async move {
                for chunk in msgs.chunks(10) {
                    store.insert(chunk).await.unwrap();
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            })
        };
        let closed = tokio::task::spawn_blocking({
            let name = name.clone();
            move || close_connections_named(&name)
        })
        .await
        .unwrap();
        assert!(closed >= 1, "the relay's connection was not found");
        writer.await.unwrap();
        w.wait_drained(Duration::from_secs(60)).await;
    }
    relay.stop().await;
    let got = read_distinct(s.reader.as_mut(), 600, Duration::from_secs(30)).await;
    let distinct: HashSet<_> = got.iter().map(|d| d.id).collect();
    assert_eq!(distinct.len(), 600, "every message arrived");
    assert!(assert_key_order(triples(&got)).values().all(|&n| n == 60));
    let st = w.stats().await;
    assert_eq!((st.published, st.failed), (600, 0));
    s.reader.cleanup().await;
    w.drop_all().await;
}

/// A destination without `/` is a routing key on the URL's exchange, here the default one: a
/// queue is reached by its name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_on_the_default_exchange_is_reached_by_its_name() {
    let w = World::with_stream(false).await;
    let queue = outbox_testkit::unique_name("amqp_default");
    let cfg = AmqpConfig::from_url(&amqp_url()).unwrap();
    let (conn, ch) = channel().await;
    declare_queue(
        &ch,
        &queue,
        QueueDeclareOptions {
            durable: true,
            ..Default::default()
        },
    )
    .await;
    w.store()
        .insert(&interleaved(&keys("k", 3), 0..5))
        .await
        .unwrap();
    let relay = RunningRelay::start(
        w.dyn_store(),
        sink(&sink_url(&amqp_url(), "")).await,
        w.relay_config_to(&queue),
    );
    w.wait_drained(Duration::from_secs(20)).await;
    relay.stop().await;
    let mut reader = AmqpReader::open(cfg, &queue, "").await.unwrap();
    let got = read_distinct(&mut reader, 15, Duration::from_secs(30)).await;
    assert_eq!(got.len(), 15);
    assert!(got.iter().all(|d| d.destination == queue));
    assert!(assert_key_order(triples(&got)).values().all(|&n| n == 5));
    outbox_sinks::read::Reader::cleanup(&mut reader).await;
    conn.close(200, "OK".into()).await.unwrap();
    w.drop_all().await;
}

/// Refused credentials cannot be retried into working: a start-up error that names the broker,
/// not the password. A broker that is not there is an outage instead, retried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_credentials_are_a_start_up_error_that_hides_the_password() {
    let url = "amqp://guest:not-the-password@127.0.0.1:5672/%2f?ack_timeout=2s";
    let err = AmqpSink::connect(AmqpConfig::from_url(url).unwrap())
        .await
        .err()
        .expect("refused credentials cannot be retried into working");
    let text = err.to_string();
    assert!(text.contains("127.0.0.1:5672"), "{text}");
    assert!(!text.contains("not-the-password"), "{text}");
    assert!(text.contains("ACCESS_REFUSED"), "{text}");
    let down = AmqpSink::connect(
        AmqpConfig::from_url("amqp://guest:guest@127.0.0.1:1/%2f?ack_timeout=1s").unwrap(),
    )
    .await
    .unwrap();
    let r = outbox_core::Sink::publish(&down, &[envelope("q", "k", 0)]).await;
    assert!(r[0].as_ref().unwrap_err().is_unavailable(), "{r:?}");
}
