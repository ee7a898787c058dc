//! Inbox backend cases about the dedupe claim: a message delivered again, two consumers racing
//! on one message, and a crash between the commit and the broker's ack all end with one effect.

// Test code: a failed expectation should panic with its message.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use outbox_inbox::source::SourceOptions;
use outbox_sinks::read::ScratchOptions;
use uuid::Uuid;

use super::{deliver, effect, effects, InboxBackend, WAIT};

/// Layer 1: a message delivered three times to a consumer has its effect once; another
/// consumer has a claim of its own on the same message.
pub async fn a_message_delivered_three_times_has_its_effect_once<B: InboxBackend>(b: Arc<B>) {
    let id = Uuid::now_v7();
    let mut claims = Vec::new();
    for _ in 0..3 {
        claims.push(deliver(b.as_ref(), "billing", id).await);
    }
    assert_eq!(claims, vec![true, false, false]);
    assert_eq!(effects(b.as_ref()).await.len(), 1);
    assert!(
        deliver(b.as_ref(), "shipping", id).await,
        "claims are per consumer"
    );
}

/// Consumer A claims a message and holds its transaction open; consumer B claims the same
/// message meanwhile and is held up until A ends (on the primary key on PostgreSQL, on the
/// file's write lock on SQLite). When A commits, B's claim says "already processed"; when A
/// rolls back, B's claim is new. One effect either way.
pub async fn two_consumers_racing_on_one_message_produce_one_effect<B: InboxBackend>(b: Arc<B>) {
    for a_commits in [true, false] {
        let id = Uuid::now_v7();
        let mut a = b.begin().await;
        assert!(b.inbox().claim(&mut a, "billing", id).await.unwrap());
        effect(b.as_ref(), &mut a, id).await;
        let consumer_b = {
            let b = b.clone();
            tokio::spawn(async move { deliver(b.as_ref(), "billing", id).await })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            !consumer_b.is_finished(),
            "B finished while A held its claim open"
        );
        B::finish(a, a_commits).await;
        let b_fresh = tokio::time::timeout(WAIT, consumer_b)
            .await
            .expect("B never finished after A ended")
            .unwrap();
        assert_eq!(b_fresh, !a_commits, "A commits: {a_commits}");
        let n = effects(b.as_ref())
            .await
            .iter()
            .filter(|(m, _, _)| *m == id)
            .count();
        assert_eq!(n, 1, "one effect; A commits: {a_commits}");
    }
}

/// A consumer of a NATS JetStream source (ack wait 1 s, a real redelivery) commits the effect
/// and dies before acknowledging. The broker delivers the message again to the next consumer,
/// whose claim says it was processed: it acknowledges without applying anything, and nothing
/// is left for a third.
pub async fn a_crash_after_the_commit_and_before_the_ack_is_absorbed<B: InboxBackend>(b: Arc<B>) {
    let nats =
        std::env::var("OUTBOX_TEST_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into());
    let mut scratch = outbox_sinks::read::scratch(&nats, &ScratchOptions::new("dedupe"))
        .await
        .expect("NATS must be running (scripts/services.sh starts it)");
    // The NATS scratch captures `<prefix>.>` in the stream `<PREFIX>`.
    let prefix = scratch.destination.split('.').next().unwrap().to_string();
    let sink = outbox_sinks::connect(&nats).await.unwrap();
    let e = crate::relay::envelope(&format!("{prefix}.paid"), "k", 0);
    for r in sink.publish(std::slice::from_ref(&e)).await {
        r.unwrap();
    }
    let url = format!(
        "{nats}?stream={}&durable=billing&ack_wait=1s",
        prefix.to_uppercase()
    );
    let mut claims = Vec::new();
    for crash in [true, false] {
        let mut source = outbox_inbox::source::open(&url, &SourceOptions { batch: 1 })
            .await
            .unwrap();
        source.recover().await.unwrap();
        let got = crate::source_suite::fetch_until(source.as_mut(), 1, 1, WAIT).await;
        assert_eq!(got[0].message.id, e.id);
        claims.push(deliver(b.as_ref(), "billing", e.id).await);
        if !crash {
            let acks = got.into_iter().map(|d| d.ack).collect();
            source.ack(acks).await.unwrap();
        }
        // The crashed consumer goes away without acknowledging: the broker delivers again.
    }
    assert_eq!(claims, vec![true, false]);
    assert_eq!(effects(b.as_ref()).await.len(), 1);
    let mut source = outbox_inbox::source::open(&url, &SourceOptions { batch: 1 })
        .await
        .unwrap();
    source.recover().await.unwrap();
    assert!(
        source.fetch(1).await.unwrap().is_empty(),
        "acknowledged: nothing comes again"
    );
    scratch.reader.cleanup().await;
}
