//! Inbox backend cases about idempotency keys on requests: a repeat returns the stored result, a
//! failed or rolled-back request leaves no key, and concurrent requests under one key run once.

// Test code: a failed expectation should panic with its message.
#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use outbox_core::NewMessage;
use outbox_inbox::{IdempotencyError, Response};

use super::{Concurrent, InboxBackend, WAIT};

/// The result an idempotent request stores.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct Receipt {
    payment: String,
    cents: i64,
}

/// What a request under an idempotency key returns.
type Answer<'a> = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<Response<Receipt>, String>> + Send + 'a>,
>;

/// A request under an idempotency key: counts its runs, pays `cents` and returns one event.
fn request<T: Send>(
    cents: i64,
    runs: Arc<AtomicU32>,
) -> impl for<'a> FnOnce(&'a mut T) -> Answer<'a> {
    move |_tx| {
        Box::pin(async move {
            runs.fetch_add(1, Ordering::SeqCst);
            let event = NewMessage::new(
                "payment",
                "p-1",
                "payment.created",
                serde_json::json!({ "cents": cents }),
            );
            Ok(Response::new(Receipt {
                payment: "p-1".into(),
                cents,
            })
            .event(event))
        })
    }
}

/// Runs `request(cents)` under `key` and `fingerprint` in a transaction of its own, committed
/// when the request succeeded.
async fn idempotent<B: InboxBackend>(
    b: &B,
    key: &str,
    fingerprint: &str,
    cents: i64,
    runs: &Arc<AtomicU32>,
) -> Result<outbox_inbox::Idempotent<Receipt>, IdempotencyError<String>> {
    let mut tx = b.begin().await;
    let answer = b
        .inbox()
        .idempotent(&mut tx, key, fingerprint, request(cents, runs.clone()))
        .await;
    B::finish(tx, answer.is_ok()).await;
    answer
}

/// Rows in the application's outbox.
async fn outbox_rows<B: InboxBackend>(b: &B) -> i64 {
    b.scalar("SELECT count(*) FROM {schema}.outbox").await
}

/// A repeat under the same key and fingerprint returns the stored result and event ids
/// (`replayed`), runs nothing and enqueues nothing: one event in the outbox, the first
/// request's. The same key with another fingerprint is a conflict, and runs nothing.
pub async fn a_repeat_returns_the_stored_result_and_enqueues_nothing<B: InboxBackend>(b: Arc<B>) {
    let runs = Arc::new(AtomicU32::new(0));
    let mut answers = Vec::new();
    for _ in 0..3 {
        answers.push(
            idempotent(b.as_ref(), "req-1", "POST /pay 42", 42, &runs)
                .await
                .unwrap(),
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let replayed: Vec<bool> = answers.iter().map(|a| a.replayed).collect();
    assert_eq!(replayed, vec![false, true, true]);
    assert!(answers
        .iter()
        .all(|a| a.result == answers[0].result && a.events == answers[0].events));
    assert_eq!(answers[0].events.len(), 1);
    assert_eq!(
        outbox_rows(b.as_ref()).await,
        1,
        "enqueued by the first only"
    );
    let stored = b
        .texts("SELECT CAST(id AS TEXT) FROM {schema}.outbox")
        .await;
    assert_eq!(stored[0][0], Some(answers[0].events[0].to_string()));
    let e = idempotent(b.as_ref(), "req-1", "POST /pay 43", 43, &runs)
        .await
        .unwrap_err();
    assert!(
        matches!(e, IdempotencyError::Conflict { ref key } if key == "req-1"),
        "{e}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// A request that fails, or whose transaction rolls back (a crash before the commit), leaves
/// no key behind: the next request under the key runs.
pub async fn a_request_that_fails_or_rolls_back_leaves_no_key_and_runs_again<B: InboxBackend>(
    b: Arc<B>,
) {
    let inbox = b.inbox();
    let mut tx = b.begin().await;
    let e = inbox
        .idempotent(&mut tx, "req-3", "f", |_tx| {
            Box::pin(async { Err::<Response<Receipt>, _>("card declined".to_string()) })
        })
        .await
        .unwrap_err();
    assert!(matches!(e, IdempotencyError::Request(ref why) if why == "card declined"));
    B::finish(tx, false).await;
    let runs = Arc::new(AtomicU32::new(0));
    let mut tx = b.begin().await;
    inbox
        .idempotent(&mut tx, "req-3", "f", request(4, runs.clone()))
        .await
        .unwrap();
    B::finish(tx, false).await; // a crash before the commit
    let d = idempotent(b.as_ref(), "req-3", "f", 5, &runs)
        .await
        .unwrap();
    assert!(!d.replayed);
    assert_eq!(d.result.cents, 5);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    assert_eq!(outbox_rows(b.as_ref()).await, 1);
}

/// A second request under a key whose first request has not committed is never run: on
/// PostgreSQL it answers `InProgress` while the first is still open; on SQLite it waits for
/// the first and replays its result. Once the first committed, a third replays it. One run,
/// one event.
pub async fn a_concurrent_request_under_the_same_key_is_not_run_twice<B: InboxBackend>(b: Arc<B>) {
    let runs = Arc::new(AtomicU32::new(0));
    let mut first = b.begin().await;
    let a = b
        .inbox()
        .idempotent(&mut first, "req-2", "f", request(1, runs.clone()))
        .await
        .unwrap();
    assert!(!a.replayed);
    let second = {
        let (b, runs) = (b.clone(), runs.clone());
        tokio::spawn(async move { idempotent(b.as_ref(), "req-2", "f", 2, &runs).await })
    };
    let second = match B::CONCURRENT_REQUEST {
        Concurrent::InProgress => {
            // It answers while the first is still open: it does not wait.
            let answer = tokio::time::timeout(WAIT, second)
                .await
                .expect("the second request waited for the first")
                .unwrap();
            B::finish(first, true).await;
            answer
        }
        Concurrent::WaitsThenReplays => {
            tokio::time::sleep(Duration::from_millis(300)).await;
            assert!(!second.is_finished(), "it waits for the first");
            B::finish(first, true).await;
            tokio::time::timeout(WAIT, second).await.unwrap().unwrap()
        }
    };
    match (B::CONCURRENT_REQUEST, second) {
        (Concurrent::InProgress, Err(IdempotencyError::InProgress { .. })) => {}
        (Concurrent::WaitsThenReplays, Ok(r)) => {
            assert!(r.replayed);
            assert_eq!(r.result.cents, 1);
        }
        (want, got) => panic!("{} ({want:?}): {got:?}", B::NAME),
    }
    let c = idempotent(b.as_ref(), "req-2", "f", 3, &runs)
        .await
        .unwrap();
    assert!(c.replayed);
    assert_eq!(c.result.cents, 1);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(outbox_rows(b.as_ref()).await, 1);
}
