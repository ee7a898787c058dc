//! Routing: one relay serving several sinks by rules on the row's fields. A row goes to exactly
//! one sink; a sink that is down holds back only its own rows, without spending their attempts.

#![allow(clippy::unwrap_used)]

use crate::common;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{assert_key_order, deliveries, keys, PrivateNats, World};
use outbox_core::{DestinationTemplate, NewMessage, RouteMatch, RouteSpec, Sink, Store};
use outbox_relay::{Relay, Route};
use outbox_sinks::file::FileSink;
use outbox_sinks::nats::{NatsConfig, NatsSink};
use outbox_sinks::read::{read_until, Reader};
use tokio_util::sync::CancellationToken;

fn rule(text: &str) -> RouteMatch {
    RouteSpec::parse(&format!("{text}; sink=stdout:"), 1)
        .unwrap()
        .when
}

async fn nats(url: &str) -> Arc<dyn Sink> {
    Arc::new(
        NatsSink::connect(NatsConfig::from_url(&format!("{url}?ack_timeout=500ms")).unwrap())
            .await
            .unwrap(),
    )
}

/// `n` messages per key of `event_type`, interleaved across keys, payload `{"n": …}`.
fn rows(keys: &[String], event_type: &str, n: usize) -> Vec<NewMessage> {
    (0..n)
        .flat_map(|i| {
            keys.iter().map(move |k| {
                NewMessage::new(
                    "order",
                    k.clone(),
                    event_type,
                    serde_json::json!({ "n": i }),
                )
            })
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_row_goes_to_the_first_matching_route_and_only_there() {
    let w = World::new().await;
    let path = std::env::temp_dir().join(format!("{}.jsonl", w.prefix));
    let file: Arc<dyn Sink> = Arc::new(FileSink::open(&path).unwrap());
    let mut file_reader = outbox_sinks::file::FileReader::new(&path);
    let routes = vec![
        Route {
            name: "audit".into(),
            when: rule("event_type=audit.*"),
            sink: file,
            destination: Some(DestinationTemplate::parse("audit/{aggregate_id}").unwrap()),
        },
        Route {
            name: "default".into(),
            when: RouteMatch::default(),
            sink: nats(&common::nats_url()).await,
            destination: None,
        },
    ];
    let relay = Relay::with_routes(w.dyn_store(), routes, w.relay_config()).unwrap();
    let stop = CancellationToken::new();
    let h = tokio::spawn(relay.run(stop.clone()));

    let (order_keys, audit_keys) = (keys("o", 5), keys("a", 5));
    let mut all = rows(&order_keys, "order.changed", 40);
    all.extend(rows(&audit_keys, "audit.logged", 40));
    w.store().insert(&all).await.unwrap();
    w.wait_drained(Duration::from_secs(60)).await;

    let msgs = w.read_all(200, Duration::from_secs(20)).await;
    let on_nats = assert_key_order(deliveries(&msgs));
    assert_eq!(on_nats.len(), 5, "only the order keys reach NATS");
    assert!(order_keys.iter().all(|k| on_nats[k] == 40));
    let files = read_until(&mut file_reader, Duration::from_secs(10), |d| {
        d.len() >= 200
    })
    .await;
    let mut next = std::collections::HashMap::new();
    for d in &files.delivered {
        assert!(audit_keys.contains(&d.key), "{} reached the file", d.key);
        assert_eq!(d.destination, format!("audit/{}", d.key));
        let n = serde_json::from_slice::<serde_json::Value>(&d.payload).unwrap()["n"]
            .as_u64()
            .unwrap();
        let want = next.entry(d.key.clone()).or_insert(0u64);
        assert_eq!(n, *want, "key {} out of order", d.key);
        *want += 1;
    }
    assert_eq!(files.delivered.len(), 200);
    let s = w.stats().await;
    assert_eq!((s.pending, s.failed, s.published), (0, 0, 400));

    stop.cancel();
    h.await.unwrap();
    let _ = std::fs::remove_file(&path);
    w.drop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sink_that_is_down_holds_back_only_its_own_rows_without_spending_attempts() {
    let w = World::new().await;
    // The payments broker: a private NATS with its own stream, stopped before the relay starts.
    let mut private = PrivateNats::start();
    let client = async_nats::connect(private.url()).await.unwrap();
    let private_js = async_nats::jetstream::new(client);
    let private_stream = format!("{}_PAY", w.stream);
    outbox_sinks::nats::create_stream(
        &private_js,
        &private_stream,
        vec![format!("{}_pay.>", w.prefix)],
        true,
    )
    .await
    .unwrap();
    private.down();

    let routes = vec![
        Route {
            name: "payments".into(),
            when: rule("event_type=payment.*"),
            sink: nats(&private.url()).await,
            destination: Some(
                DestinationTemplate::parse(&format!("{}_pay.{{event_type}}", w.prefix)).unwrap(),
            ),
        },
        Route {
            name: "default".into(),
            when: RouteMatch::default(),
            sink: nats(&common::nats_url()).await,
            destination: None,
        },
    ];
    let mut cfg = w.relay_config();
    cfg.retry.max_attempts = 8;
    let relay = Relay::with_routes(w.dyn_store(), routes, cfg).unwrap();
    let metrics = relay.metrics();
    let stop = CancellationToken::new();
    let h = tokio::spawn(relay.run(stop.clone()));

    let (order_keys, pay_keys) = (keys("o", 4), keys("p", 4));
    let mut first = rows(&pay_keys, "payment.captured", 30);
    first.extend(rows(&order_keys, "order.changed", 30));
    w.store().insert(&first).await.unwrap();
    // The default route drains while payments wait.
    let deadline = Instant::now() + Duration::from_secs(60);
    while w.stream_count().await < 120 {
        assert!(
            Instant::now() < deadline,
            "orders held back by the payments outage"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Orders keep flowing during the outage.
    w.store()
        .insert(&rows(&order_keys, "order.changed", 60)[120..])
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while w.stream_count().await < 240 {
        assert!(
            Instant::now() < deadline,
            "new orders held back by the payments outage"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Payments are deferred, not failed, and once the circuit is open no attempt is spent.
    let deadline = Instant::now() + Duration::from_secs(30);
    while metrics.deferred.load(std::sync::atomic::Ordering::Relaxed) == 0 {
        assert!(Instant::now() < deadline, "payments were never deferred");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let attempts = || async {
        sqlx::query_scalar::<_, i64>(
            &w.schema
                .render("SELECT coalesce(sum(attempts), 0)::int8 FROM {schema}.outbox_parked"),
        )
        .fetch_one(&w.pool)
        .await
        .unwrap()
    };
    // Calls that went out before the circuit opened may still come back (each within its
    // publish deadline) and spend their attempts; give them time, then watch until the relay
    // has met the payments again (a probe of the open circuit, and deferrals behind it): those
    // encounters must spend no attempt.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let before = attempts().await;
    let deferred = || metrics.deferred.load(std::sync::atomic::Ordering::Relaxed);
    let deferred_before = deferred();
    let deadline = Instant::now() + Duration::from_secs(60);
    while deferred() == deferred_before {
        assert!(
            Instant::now() < deadline,
            "the relay never met the payments again while their sink was down"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(attempts().await, before, "deferrals spent attempts");
    let s = w.stats().await;
    assert_eq!(s.failed, 0, "an outage must not fail messages");
    assert!(s.pending >= 120, "payments wait: {s:?}");
    assert!(
        s.members.iter().any(|m| m.circuit == "open"
            && m.sink_error
                .as_deref()
                .is_some_and(|e| e.contains("payments"))),
        "status names the route that is down: {:?}",
        s.members
    );

    // The payments broker comes back: everything arrives, in key order.
    private.up();
    w.wait_drained(Duration::from_secs(90)).await;
    let mut reader = outbox_sinks::nats::NatsReader::open(private_js.clone(), &private_stream)
        .await
        .unwrap();
    let got = read_until(&mut reader, Duration::from_secs(30), |d| d.len() >= 120).await;
    let mut next = std::collections::HashMap::new();
    for d in &got.delivered {
        assert!(pay_keys.contains(&d.key));
        let n = serde_json::from_slice::<serde_json::Value>(&d.payload).unwrap()["n"]
            .as_u64()
            .unwrap();
        let want = next.entry(d.key.clone()).or_insert(0u64);
        if n < *want {
            continue; // a redelivery of an already seen message
        }
        assert_eq!(n, *want, "key {} out of order", d.key);
        *want += 1;
    }
    assert!(pay_keys.iter().all(|k| next[k] == 30), "{next:?}");
    assert_eq!(w.stats().await.failed, 0);

    stop.cancel();
    h.await.unwrap();
    reader.cleanup().await;
    w.drop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_no_route_matches_ends_failed_naming_the_routes_and_others_flow() {
    let w = World::new().await;
    let routes = vec![Route {
        name: "orders-only".into(),
        when: rule("aggregate_type=order"),
        sink: nats(&common::nats_url()).await,
        destination: None,
    }];
    let relay = Relay::with_routes(w.dyn_store(), routes, w.relay_config()).unwrap();
    let stop = CancellationToken::new();
    let h = tokio::spawn(relay.run(stop.clone()));
    let stray = NewMessage::new(
        "invoice",
        "i-1",
        "invoice.sent",
        serde_json::json!({"n": 0}),
    );
    let mut all = vec![stray];
    all.extend(rows(&keys("o", 3), "order.changed", 10));
    w.store().insert(&all).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let s = w.stats().await;
        if s.failed == 1 && s.published == 30 {
            let head = &s.blocked[0];
            assert_eq!(head.key, "i-1");
            let error = head.last_error.as_deref().unwrap_or_default();
            assert!(
                error.contains("no route matches") && error.contains("orders-only"),
                "{error}"
            );
            break;
        }
        assert!(Instant::now() < deadline, "{s:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        Relay::with_routes(w.dyn_store(), Vec::new(), w.relay_config()).is_err(),
        "a relay without any sink is a config error"
    );
    stop.cancel();
    h.await.unwrap();
    w.drop_all().await;
}
