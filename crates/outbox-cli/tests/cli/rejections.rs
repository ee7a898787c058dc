//! A subject the relay may not publish to, on a private nats-server with permissions: NATS's
//! own way of refusing (no answer at all), which the sink must still class as a rejection.
//! The rejection every sink shows (no stream captures the subject) is the conformance suite's
//! (`outbox-sinks/tests/conformance.rs`, `nats::rejection_does_not_open_the_circuit`).

#![allow(clippy::unwrap_used)]

use crate::common;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use common::World;
use outbox_core::{NewMessage, Store};
use outbox_relay::CircuitState;
use outbox_testkit::relay::RunningRelay;

/// NATS never answers a publish it denies: it sends an asynchronous permissions error and drops
/// the message, so the acknowledgement can only time out. That timeout is a rejection of the
/// message, not an outage: the message ends `failed` with the reason, the circuit stays closed,
/// and subjects the relay may publish to keep flowing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subject_the_relay_may_not_publish_to_ends_failed_and_never_opens_the_circuit() {
    let w = World::with_stream(false).await;
    // Its only user may publish anywhere except `<prefix>.denied.>` (and JetStream's API,
    // which it needs, stays allowed).
    let deny = format!("{}.denied.>", w.prefix);
    let nats = tokio::task::block_in_place(|| {
        outbox_testkit::brokers::nats_with_config(
            "nats://relay:relaypw@127.0.0.1:{port}",
            move |port, dir| {
                format!(
                    "listen: 127.0.0.1:{port}\n\
                     jetstream {{ store_dir: \"{}\" }}\n\
                     authorization {{ users = [ {{ user: relay, password: relaypw, \
                     permissions: {{ publish: {{ allow: \">\", deny: \"{deny}\" }}, subscribe: \">\" }} }} ] }}\n",
                    dir.join("js").display()
                )
            },
        )
    });
    let client = async_nats::connect_with_options(
        format!("nats://127.0.0.1:{}", nats.port()),
        async_nats::ConnectOptions::with_user_and_password("relay".into(), "relaypw".into()),
    )
    .await
    .unwrap();
    let js = jetstream::new(client);
    // The stream captures both subjects: only the permission keeps `denied` out.
    outbox_sinks::nats::create_stream(&js, &w.stream, vec![format!("{}.>", w.prefix)], false)
        .await
        .unwrap();
    let sink = common::nats_sink(&nats.url()).await;
    let mut cfg = w.relay_config();
    cfg.workers = 1;
    cfg.retry.max_attempts = 5;
    cfg.breaker_threshold = 2;
    let relay = RunningRelay::start(w.dyn_store(), Arc::new(sink), cfg);
    let breaker = relay.breaker.clone();

    let denied = NewMessage::new(
        "denied",
        "denied-key",
        "placed",
        serde_json::json!({ "n": 0 }),
    );
    w.store()
        .insert(std::slice::from_ref(&denied))
        .await
        .unwrap();
    let mut good = 0i64;
    let mut left_closed = false;
    let deadline = Instant::now() + Duration::from_secs(30);
    let error = loop {
        if breaker.snapshot().0 != CircuitState::Closed {
            left_closed = true;
        }
        if good < 10 {
            let m = NewMessage::new(
                "good",
                "good-key",
                "placed",
                serde_json::json!({ "n": good }),
            );
            w.store().insert(&[m]).await.unwrap();
            good += 1;
        }
        let row: Option<(String, i32, Option<String>)> = sqlx::query_as(&w.schema.render(
            "SELECT state, attempts, last_error FROM {schema}.outbox_parked WHERE id = $1",
        ))
        .bind(denied.id)
        .fetch_optional(&w.pool)
        .await
        .unwrap();
        if let Some(("failed", attempts, error)) =
            row.as_ref().map(|(s, a, e)| (s.as_str(), *a, e.clone()))
        {
            assert_eq!(attempts, 5, "failed after exactly its budget");
            break error.unwrap_or_default();
        }
        assert!(
            Instant::now() < deadline,
            "the denied message did not end failed: {row:?}, circuit {:?}",
            breaker.snapshot()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert!(error.contains("permission"), "{error}");
    assert!(
        error.contains(&format!("{}.denied.placed", w.prefix)),
        "{error}"
    );
    assert!(!left_closed, "a denied subject must never open the circuit");
    let deadline = Instant::now() + Duration::from_secs(10);
    while w.stats().await.published < good {
        assert!(Instant::now() < deadline, "the allowed subject stalled");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    relay.stop().await;
    drop(nats);
    w.drop_all().await;
}
