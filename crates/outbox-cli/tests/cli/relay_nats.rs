//! The relay end to end against the real PostgreSQL and NATS JetStream on this machine: the
//! engine's behaviour (several relays, failures, policies, panics, hot keys, read-ahead), with
//! NATS as the broker. What every sink must do is the conformance suite's
//! (`outbox-sinks/tests/conformance.rs`).

#![allow(clippy::unwrap_used)]

use crate::common;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use common::{header, payload_json, World};
use outbox_core::{NewMessage, Sink, Store};
use outbox_relay::{Relay, RelayMetrics};
use outbox_sinks::nats::{NatsConfig, NatsSink};
use outbox_testkit::relay::RunningRelay;
use outbox_testkit::sinks::{FlakySink, RecordingSink};

async fn nats() -> NatsSink {
    NatsSink::connect(NatsConfig::from_url(&common::nats_url()).unwrap())
        .await
        .unwrap()
}

/// Relays everything `w` holds to the shared NATS, until nothing is pending.
async fn drain_to_nats(w: &World) {
    let sink = Arc::new(nats().await);
    let relay = RunningRelay::start(w.dyn_store(), sink, w.relay_config());
    w.wait_drained(Duration::from_secs(20)).await;
    relay.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn minimal_sql_insert_is_relayed_with_id_and_headers() {
    let w = World::new().await;
    // Exactly the insert the SQL contract promises to accept from any language.
    let mut conn = w.pool.acquire().await.unwrap();
    sqlx::query(&format!("SET search_path TO {}", w.schema.as_str()))
        .execute(&mut *conn)
        .await
        .unwrap();
    sqlx::query("INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ($1, $2, $3, $4::jsonb)")
        .bind("payment")
        .bind("p-42")
        .bind("created")
        .bind(r#"{"amount": 1000, "currency": "BRL"}"#)
        .execute(&mut *conn)
        .await
        .unwrap();
    drop(conn);
    let id: uuid::Uuid = sqlx::query_scalar(&w.schema.render("SELECT id FROM {schema}.outbox"))
        .fetch_one(&w.pool)
        .await
        .unwrap();
    assert_eq!(id.get_version_num(), 7, "SQL default id must be a UUIDv7");
    assert_eq!(id.get_variant(), uuid::Variant::RFC4122);
    // Its first 48 bits are the insert's Unix time in milliseconds.
    let (secs, _) = id
        .get_timestamp()
        .expect("a v7 id has a timestamp")
        .to_unix();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert!(now.abs_diff(secs) < 60, "id time {secs}, now {now}");

    drain_to_nats(&w).await;

    let got = w.read_all(1, Duration::from_secs(10)).await;
    assert_eq!(got.len(), 1);
    let m = &got[0];
    assert_eq!(m.subject.as_str(), format!("{}.payment.created", w.prefix));
    assert_eq!(
        payload_json(m),
        serde_json::json!({"amount": 1000, "currency": "BRL"})
    );
    assert_eq!(header(m, "Nats-Msg-Id").unwrap(), id.to_string());
    assert_eq!(header(m, "outbox-message-id").unwrap(), id.to_string());
    assert_eq!(header(m, "outbox-event-type").unwrap(), "created");
    assert_eq!(header(m, "outbox-aggregate-type").unwrap(), "payment");
    assert_eq!(header(m, "outbox-aggregate-id").unwrap(), "p-42");
    let s = w.stats().await;
    assert_eq!((s.pending, s.published, s.failed), (0, 1, 0));
    w.drop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolled_back_transaction_publishes_nothing() {
    let w = World::new().await;
    let writer = w.store().writer().clone();
    let mut tx = w.pool.begin().await.unwrap();
    writer
        .enqueue(
            &mut tx,
            &NewMessage::new("payment", "p-1", "created", serde_json::json!({"n": 1})),
        )
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    let kept = NewMessage::new("payment", "p-2", "created", serde_json::json!({"n": 2})).header(
        "traceparent",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    );
    let mut tx = w.pool.begin().await.unwrap();
    writer.enqueue(&mut tx, &kept).await.unwrap();
    tx.commit().await.unwrap();

    drain_to_nats(&w).await;
    let got = w.read_all(1, Duration::from_secs(10)).await;
    assert_eq!(got.len(), 1, "only the committed message may be published");
    assert_eq!(
        header(&got[0], "outbox-message-id").unwrap(),
        kept.id.to_string()
    );
    assert_eq!(
        header(&got[0], "traceparent").unwrap(),
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    );
    w.drop_all().await;
}

/// Checks every key's messages arrived in order and every message arrived once.
fn assert_complete_and_ordered(
    got: &[async_nats::jetstream::Message],
    keys: usize,
    per_key: usize,
) {
    let d = common::deliveries(got);
    let distinct: HashSet<&str> = d.iter().map(|(id, _, _)| id.as_str()).collect();
    assert_eq!(distinct.len(), keys * per_key);
    let per = common::assert_key_order(d.iter().cloned());
    assert_eq!(per.len(), keys);
    assert!(
        per.values().all(|&v| v as usize == per_key),
        "some key is incomplete"
    );
}

/// `per_key` messages for each of `keys` keys, interleaved.
fn workload(keys: usize, per_key: usize) -> Vec<NewMessage> {
    common::interleaved(&common::keys("order-", keys), 0..per_key)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_relays_deliver_every_row_in_key_order_and_none_twice() {
    let w = World::new().await;
    let (keys, per_key) = (200, 100);
    let mut relays = Vec::new();
    let mut acked = Vec::new();
    for _ in 0..3 {
        let sink = RecordingSink::new(nats().await);
        acked.push(sink.acked());
        let mut cfg = w.relay_config();
        cfg.batch_size = 300;
        relays.push(RunningRelay::spawn(Relay::new(
            w.dyn_store(),
            Arc::new(sink),
            cfg,
        )));
    }
    // Let the six workers settle on their shares, then write while they run.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let members = w.stats().await.members;
        if members.len() == 6 && members.iter().all(|m| m.partitions > 0) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "partitions never spread: {members:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for chunk in workload(keys, per_key).chunks(1000) {
        w.store().insert(chunk).await.unwrap();
    }
    w.wait_drained(Duration::from_secs(120)).await;
    for relay in relays {
        relay.stop().await;
    }
    // Every relay took part, and no message was acknowledged twice across the three.
    let mut total: HashMap<uuid::Uuid, u32> = HashMap::new();
    for a in &acked {
        let a = a.lock().unwrap();
        assert!(
            !a.is_empty(),
            "a relay published nothing: the partitions were not shared"
        );
        for (id, n) in a.iter() {
            *total.entry(*id).or_default() += n;
        }
    }
    assert_eq!(total.len(), keys * per_key);
    assert!(
        total.values().all(|&n| n == 1),
        "a message was published twice"
    );
    let got = w.read_all(keys * per_key, Duration::from_secs(60)).await;
    assert_eq!(got.len(), keys * per_key);
    assert_complete_and_ordered(&got, keys, per_key);
    w.drop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sink_failing_then_recovering_delivers_everything_in_order() {
    let w = World::new().await;
    let (keys, per_key) = (20, 25);
    w.store().insert(&workload(keys, per_key)).await.unwrap();
    // Eight failed calls in a row: more than the breaker's threshold, so the circuit opens,
    // probes, and must close again for everything to arrive.
    let sink = Arc::new(FlakySink::failing_first(nats().await, 8));
    let relay = RunningRelay::spawn(Relay::new(w.dyn_store(), sink.clone(), w.relay_config()));
    w.wait_drained(Duration::from_secs(60)).await;
    relay.stop().await;
    assert_eq!(sink.failures(), 8);
    let got = w.read_all(keys * per_key, Duration::from_secs(20)).await;
    assert_eq!(got.len(), keys * per_key);
    assert_complete_and_ordered(&got, keys, per_key);
    let s = w.stats().await;
    assert_eq!((s.failed, s.published), (0, (keys * per_key) as i64));
    w.drop_all().await;
}

async fn wait_failed(w: &World, n: usize) {
    outbox_testkit::relay::wait_failed(w.dyn_store().as_ref(), n, Duration::from_secs(30)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn message_exhausting_its_attempts_ends_failed_with_its_error() {
    let w = World::new().await;
    let (a1, a2, b1) = (
        NewMessage::new("order", "a", "placed", serde_json::json!({"n": 0})),
        NewMessage::new("order", "a", "placed", serde_json::json!({"n": 1})),
        NewMessage::new("order", "b", "placed", serde_json::json!({"n": 0})),
    );
    w.store()
        .insert(&[a1.clone(), a2.clone(), b1.clone()])
        .await
        .unwrap();
    let mut cfg = w.relay_config();
    cfg.retry.max_attempts = 3;
    // Refused every time: rejections spend attempts. (An unavailable broker would open the
    // circuit instead, and an outage never pushes messages into `failed`.)
    let sink: Arc<dyn Sink> = Arc::new(FlakySink::always_rejecting(nats().await));
    let relay = RunningRelay::spawn(Relay::new(w.dyn_store(), sink, cfg));
    wait_failed(&w, 2).await;
    relay.stop().await;
    let rows: Vec<(uuid::Uuid, String, i32, Option<String>)> =
        sqlx::query_as(&w.schema.render(
            "SELECT id, state, attempts, last_error FROM {schema}.outbox_parked ORDER BY seq",
        ))
        .fetch_all(&w.pool)
        .await
        .unwrap();
    // a1 and b1 used their three attempts; a2 waits behind a1 untouched (its key is blocked).
    assert_eq!(rows[0].0, a1.id);
    assert_eq!((rows[0].1.as_str(), rows[0].2), ("failed", 3));
    assert!(rows[0].3.as_deref().unwrap().contains("injected failure"));
    assert_eq!(
        (rows[1].0, rows[1].1.as_str(), rows[1].2),
        (a2.id, "waiting", 0)
    );
    assert_eq!(
        (rows[2].0, rows[2].1.as_str(), rows[2].2),
        (b1.id, "failed", 3)
    );
    let s = w.stats().await;
    assert_eq!((s.failed, s.pending, s.blocked_keys), (2, 1, 2));
    assert_eq!(w.stream_count().await, 0);
    w.drop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permanent_error_fails_at_once() {
    let w = World::new().await;
    w.store()
        .insert(&[NewMessage::new(
            "order",
            "a",
            "placed",
            serde_json::json!({}),
        )])
        .await
        .unwrap();
    let sink: Arc<dyn Sink> = Arc::new(FlakySink::permanently_failing(nats().await));
    let relay = RunningRelay::spawn(Relay::new(w.dyn_store(), sink, w.relay_config()));
    wait_failed(&w, 1).await;
    relay.stop().await;
    let attempts: i32 = sqlx::query_scalar(
        &w.schema
            .render("SELECT attempts FROM {schema}.outbox_parked"),
    )
    .fetch_one(&w.pool)
    .await
    .unwrap();
    assert_eq!(attempts, 1);
    w.drop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_headers_fail_the_row_visibly_and_others_flow() {
    let w = World::new().await;
    sqlx::query(&w.schema.render(
        "INSERT INTO {schema}.outbox (aggregate_type, aggregate_id, event_type, payload, headers)
         VALUES ('order', 'bad', 'placed', '{}', '[1,2]'), ('order', 'good', 'placed', '{}', '{}')",
    ))
    .execute(&w.pool)
    .await
    .unwrap();
    let relay = RunningRelay::spawn(Relay::new(
        w.dyn_store(),
        Arc::new(nats().await),
        w.relay_config(),
    ));
    wait_failed(&w, 1).await;
    w.wait_drained(Duration::from_secs(20)).await;
    relay.stop().await;
    let err: String = sqlx::query_scalar(
        &w.schema
            .render("SELECT last_error FROM {schema}.outbox_parked WHERE state = 'failed'"),
    )
    .fetch_one(&w.pool)
    .await
    .unwrap();
    assert!(err.contains("headers"), "{err}");
    assert_eq!(w.stream_count().await, 1);
    w.drop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skip_policy_delivers_the_rest_of_a_key_whose_head_failed() {
    let w = World::new().await;
    // The key's head cannot be published (its headers are not an object): it fails at once.
    sqlx::query(&w.schema.render(
        "INSERT INTO {schema}.outbox (aggregate_type, aggregate_id, event_type, payload, headers)
         VALUES ('order', 'k', 'placed', '{\"n\": 0}', '[1]'),
                ('order', 'k', 'placed', '{\"n\": 1}', '{}'),
                ('order', 'k', 'placed', '{\"n\": 2}', '{}')",
    ))
    .execute(&w.pool)
    .await
    .unwrap();
    let mut cfg = w.relay_config();
    cfg.on_failed = outbox_core::OnFailed::Skip;
    let relay = RunningRelay::spawn(Relay::new(w.dyn_store(), Arc::new(nats().await), cfg));
    wait_failed(&w, 1).await;
    w.wait_drained(Duration::from_secs(20)).await;
    relay.stop().await;
    let got = w.read_all(2, Duration::from_secs(10)).await;
    let ns: Vec<u64> = got
        .iter()
        .map(|m| payload_json(m)["n"].as_u64().unwrap())
        .collect();
    assert_eq!(
        ns,
        vec![1, 2],
        "the rest of the key flows past its failed head, in order"
    );
    let s = w.stats().await;
    assert_eq!((s.failed, s.pending, s.published), (1, 0, 2));
    w.drop_all().await;
}

/// A sink that panics on its first call (a bug in a sink, or in the relay).
struct PanicsOnce<S>(S, std::sync::atomic::AtomicBool);

#[async_trait::async_trait]
impl<S: Sink> Sink for PanicsOnce<S> {
    fn name(&self) -> &str {
        self.0.name()
    }
    async fn publish(
        &self,
        batch: &[outbox_core::Envelope],
    ) -> Vec<Result<(), outbox_core::SinkError>> {
        if !self.1.swap(true, std::sync::atomic::Ordering::SeqCst) {
            panic!("injected panic inside publish");
        }
        self.0.publish(batch).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_worker_is_replaced_and_its_rows_are_delivered() {
    let w = World::new().await;
    w.store().insert(&workload(5, 10)).await.unwrap();
    let mut cfg = w.relay_config();
    cfg.workers = 1;
    let sink = PanicsOnce(nats().await, std::sync::atomic::AtomicBool::new(false));
    let relay = RunningRelay::spawn(Relay::new(w.dyn_store(), Arc::new(sink), cfg));
    // The dead worker's lease (3 s) must expire before its replacement may take its partitions.
    w.wait_drained(Duration::from_secs(60)).await;
    relay.stop().await;
    let got = w.read_all(50, Duration::from_secs(10)).await;
    assert_complete_and_ordered(&got, 5, 10);
    w.drop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_aimed_at_system_subjects_forged_headers_or_outside_the_allow_list_end_failed_and_others_flow(
) {
    let w = World::new().await;
    // A stream a hostile row tries to delete through the JetStream API, with the relay's
    // credentials.
    let victim = format!("{}_VICTIM", w.stream);
    outbox_sinks::nats::create_stream(
        &w.js,
        &victim,
        vec![format!("{}_victim.>", w.prefix)],
        false,
    )
    .await
    .unwrap();
    let forged_id = uuid::Uuid::now_v7();
    sqlx::query(&w.schema.render(
        "INSERT INTO {schema}.outbox (aggregate_type, aggregate_id, event_type, payload, headers, topic)
         VALUES ('order', 'api', 'placed', '{}', '{}', $1),
                ('order', 'forged', 'placed', '{}', $2::jsonb, NULL),
                ('order', 'outside', 'placed', '{}', '{}', 'elsewhere.placed'),
                ('order', 'good1', 'placed', '{\"n\": 0}', '{\"traceparent\": \"00-1-2-01\"}', NULL),
                ('order', 'good2', 'placed', '{\"n\": 0}', '{}', NULL),
                ('order', 'good2', 'placed', '{\"n\": 1}', '{}', NULL)",
    ))
    .bind(format!("$JS.API.STREAM.DELETE.{victim}"))
    .bind(serde_json::json!({ "Nats-Msg-Id": forged_id.to_string() }).to_string())
    .execute(&w.pool)
    .await
    .unwrap();
    let mut cfg = w.relay_config();
    cfg.destination_rules =
        outbox_core::DestinationRules::allow(vec![outbox_core::DestinationPattern::parse(
            &format!("{}.>", w.prefix),
        )
        .unwrap()]);
    let relay = RunningRelay::spawn(Relay::new(w.dyn_store(), Arc::new(nats().await), cfg));
    wait_failed(&w, 3).await;
    w.wait_drained(Duration::from_secs(20)).await;
    relay.stop().await;

    // The other rows flowed, with their own headers.
    let got = w.read_all(3, Duration::from_secs(10)).await;
    let mut keys: Vec<String> = got
        .iter()
        .map(|m| header(m, "outbox-aggregate-id").unwrap())
        .collect();
    keys.sort();
    assert_eq!(keys, ["good1", "good2", "good2"]);
    let good1 = got
        .iter()
        .find(|m| header(m, "outbox-aggregate-id").as_deref() == Some("good1"))
        .unwrap();
    assert_eq!(header(good1, "traceparent").as_deref(), Some("00-1-2-01"));
    assert!(got
        .iter()
        .all(|m| header(m, "Nats-Msg-Id") != Some(forged_id.to_string())));
    // The victim stream is untouched.
    assert!(
        w.js.get_stream(&victim).await.is_ok(),
        "the stream was deleted"
    );
    // Each offending row ended failed with a reason naming the field.
    let errors: HashMap<String, String> = sqlx::query_as(&w.schema.render(
        "SELECT aggregate_id, last_error FROM {schema}.outbox_parked WHERE state = 'failed'",
    ))
    .fetch_all(&w.pool)
    .await
    .unwrap()
    .into_iter()
    .collect();
    assert_eq!(errors.len(), 3, "{errors:?}");
    assert!(
        errors["api"].contains("topic") && errors["api"].contains("reserved broker space"),
        "{errors:?}"
    );
    assert!(
        errors["forged"].contains("`headers` sets `Nats-Msg-Id`"),
        "{errors:?}"
    );
    assert!(
        errors["outside"].contains("topic") && errors["outside"].contains("--allow-destinations"),
        "{errors:?}"
    );
    let s = w.stats().await;
    assert_eq!((s.failed, s.pending, s.published), (3, 0, 3));
    let _ = w.js.delete_stream(&victim).await;
    w.drop_all().await;
}

/// (key, n) of each stored envelope, in order.
fn stored_order(stored: &[outbox_core::Envelope]) -> Vec<(String, String, u64)> {
    stored
        .iter()
        .map(|e| {
            let v: serde_json::Value = serde_json::from_slice(&e.payload).unwrap();
            (e.id.to_string(), e.key.clone(), v["n"].as_u64().unwrap())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sink_that_orders_keys_gets_a_hot_key_many_at_a_time_in_order() {
    let w = World::new().await;
    let hot = vec!["hot".to_string()];
    w.store()
        .insert(&common::interleaved(&hot, 0..2000))
        .await
        .unwrap();
    let sink = Arc::new(outbox_testkit::sinks::KeyOrderingSink::default());
    let mut cfg = w.relay_config();
    cfg.batch_size = 500;
    let relay = RunningRelay::spawn(Relay::new(w.dyn_store(), sink.clone(), cfg));
    w.wait_drained(Duration::from_secs(60)).await;
    relay.stop().await;
    // One key, yet whole batches per call: not one round trip per message.
    assert!(
        sink.most_of_one_key_in_a_call() >= 100,
        "calls: {:?}",
        sink.calls()
    );
    assert!(sink.calls().len() < 100, "calls: {:?}", sink.calls());
    let got = common::assert_key_order(stored_order(&sink.stored()));
    assert_eq!(got.get("hot"), Some(&2000));
    w.drop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_inside_a_keys_run_parks_the_rest_of_the_key_whatever_the_sink_answered() {
    let w = World::new().await;
    let keys = common::keys("k", 5);
    w.store()
        .insert(&common::interleaved(&keys, 0..40))
        .await
        .unwrap();
    // Message 7 of k2 fails once; the sink answers Ok for k2's later messages of that call
    // without storing them. Trusting those answers would lose them.
    let sink = Arc::new(outbox_testkit::sinks::KeyOrderingSink::failing_once_at(
        "k2", 7,
    ));
    let relay = RunningRelay::spawn(Relay::new(w.dyn_store(), sink.clone(), w.relay_config()));
    w.wait_drained(Duration::from_secs(60)).await;
    relay.stop().await;
    assert!(sink.most_of_one_key_in_a_call() > 1);
    let got = common::assert_key_order(stored_order(&sink.stored()));
    for k in &keys {
        assert_eq!(got.get(k), Some(&40), "key {k}: {got:?}");
    }
    let s = w.stats().await;
    assert_eq!((s.failed, s.published), (0, 200));
    w.drop_all().await;
}

/// A backlog of full batches is read ahead: batches are published from reads made while the
/// one before was being published, and every message still arrives once, in key order. With
/// `read_ahead` off, no batch is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_is_read_ahead_and_still_arrives_once_in_key_order() {
    for read_ahead in [true, false] {
        let w = World::new().await;
        let (keys, per_key) = (3, 600);
        w.store().insert(&workload(keys, per_key)).await.unwrap();
        let mut cfg = w.relay_config();
        cfg.batch_size = 100;
        cfg.read_ahead = read_ahead;
        let relay = Relay::new(w.dyn_store(), Arc::new(nats().await), cfg);
        let metrics = relay.metrics();
        let relay = RunningRelay::spawn(relay);
        w.wait_drained(Duration::from_secs(60)).await;
        relay.stop().await;
        let adopted = RelayMetrics::get(&metrics.read_ahead);
        let batches = RelayMetrics::get(&metrics.batches);
        if read_ahead {
            // Most batches of a backlog follow one read ahead (not those after a window
            // closes, nor the first of each worker). The batch of 100 does not divide among the
            // keys' partitions: each claim must still come back full to count as a backlog.
            assert!(
                adopted * 2 >= batches,
                "only {adopted} of {batches} batches were read ahead"
            );
        } else {
            assert_eq!(adopted, 0, "read ahead while turned off");
        }
        let got = w.read_all(keys * per_key, Duration::from_secs(60)).await;
        assert_eq!(got.len(), keys * per_key);
        assert_complete_and_ordered(&got, keys, per_key);
        w.drop_all().await;
    }
}
