//! Inside a batch the relay keeps several publish calls in flight, one message per key at a
//! time: a key whose message is slow to be acknowledged holds back only itself.

#![allow(clippy::unwrap_used)]

use crate::common;
use std::sync::Arc;
use std::time::Duration;

use common::World;
use outbox_core::{NewMessage, Store};
use outbox_relay::Relay;
use outbox_testkit::sinks::{MemorySink, Seen, SlowKeySink};
use tokio_util::sync::CancellationToken;

fn msg(key: &str, n: u64) -> NewMessage {
    NewMessage::new("order", key, "placed", serde_json::json!({ "n": n }))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_key_holds_back_only_itself_and_no_key_has_two_messages_in_flight() {
    let w = World::new().await;
    // One batch, in seq order: the slow key's message first, then three of key `a` and three
    // of key `b`. Published round by round (every key's first message, then every key's
    // second...), `a`'s second message would wait for the slow one.
    let mut rows = vec![msg("slow", 0)];
    for n in 0..3 {
        rows.push(msg("a", n));
        rows.push(msg("b", n));
    }
    w.store().insert(&rows).await.unwrap();
    let sink = Arc::new(SlowKeySink::new(
        MemorySink::default(),
        "slow",
        // Well inside the publish deadline (a third of the test's 3 s lease).
        Duration::from_millis(600),
    ));
    let mut cfg = w.relay_config();
    cfg.workers = 1;
    cfg.batch_size = 100;
    let stop = CancellationToken::new();
    let h = tokio::spawn(Relay::new(w.dyn_store(), sink.clone(), cfg).run(stop.clone()));
    w.wait_drained(Duration::from_secs(30)).await;
    stop.cancel();
    h.await.unwrap();

    let log = sink.log();
    let at = |seen: Seen| log.iter().position(|s| *s == seen).unwrap();
    let slow_answered = at(Seen::Answered("slow".into(), 0));
    for key in ["a", "b"] {
        assert!(
            at(Seen::Answered(key.into(), 2)) < slow_answered,
            "every message of `{key}` was answered while the slow key's call was out: {log:?}"
        );
        for n in 1..3 {
            assert!(
                at(Seen::Answered(key.into(), n - 1)) < at(Seen::Sent(key.into(), n)),
                "`{key}` {n} went out only after {} was answered: {log:?}",
                n - 1
            );
        }
    }
    assert_eq!(sink.most_of_one_key_in_flight(), 1, "{log:?}");
    assert_eq!(w.stats().await.published, 7);
    w.drop_all().await;
}
