//! Request idempotency keys on real PostgreSQL and SQLite: a repeat returns the stored result
//! and enqueues nothing; the same key with another fingerprint is a conflict; a request in
//! progress answers "in progress" and is not run twice; a request that rolled back leaves no
//! key behind.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{Lite, Pg};
use outbox_core::NewMessage;
use outbox_inbox::{IdempotencyError, Inbox, Response};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Receipt {
    payment: String,
    cents: i64,
}

fn payment_event(cents: i64) -> NewMessage {
    NewMessage::new(
        "payment",
        "p-1",
        "payment.created",
        serde_json::json!({ "cents": cents }),
    )
}

async fn outbox_rows_pg(pg: &Pg) -> i64 {
    pg.scalar("SELECT count(*) FROM {schema}.outbox").await
}

#[tokio::test]
async fn a_repeat_returns_the_stored_result_and_enqueues_nothing_on_postgres() {
    let pg = Pg::new().await;
    // The application's outbox beside the inbox tables.
    outbox_postgres::migrate(&pg.pool, pg.schema.tables())
        .await
        .unwrap();
    let inbox = Inbox::new(pg.schema.clone());
    let runs = Arc::new(AtomicU32::new(0));
    let mut answers = Vec::new();
    for _ in 0..3 {
        let mut tx = pg.pool.begin().await.unwrap();
        let r = runs.clone();
        let a = inbox
            .idempotent(&mut tx, "req-1", "POST /pay 42", move |_tx| {
                Box::pin(async move {
                    r.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, std::convert::Infallible>(
                        Response::new(Receipt {
                            payment: "p-1".into(),
                            cents: 42,
                        })
                        .event(payment_event(42)),
                    )
                })
            })
            .await
            .unwrap();
        tx.commit().await.unwrap();
        answers.push(a);
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert!(!answers[0].replayed && answers[1].replayed && answers[2].replayed);
    assert!(answers
        .iter()
        .all(|a| a.result == answers[0].result && a.events == answers[0].events));
    assert_eq!(answers[0].events.len(), 1);
    assert_eq!(
        outbox_rows_pg(&pg).await,
        1,
        "one event, enqueued by the first request only"
    );
    let stored: uuid::Uuid = sqlx::query_scalar(&format!("SELECT id FROM {}.outbox", pg.name))
        .fetch_one(&pg.pool)
        .await
        .unwrap();
    assert_eq!(stored, answers[0].events[0]);

    // Same key, different request: a conflict, and nothing runs.
    let mut tx = pg.pool.begin().await.unwrap();
    let r = runs.clone();
    let e = inbox
        .idempotent(&mut tx, "req-1", "POST /pay 43", move |_tx| {
            Box::pin(async move {
                r.fetch_add(1, Ordering::SeqCst);
                Ok::<_, std::convert::Infallible>(Response::new(Receipt {
                    payment: "p-2".into(),
                    cents: 43,
                }))
            })
        })
        .await
        .unwrap_err();
    tx.rollback().await.unwrap();
    assert!(
        matches!(e, IdempotencyError::Conflict { ref key } if key == "req-1"),
        "{e}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let _ = sqlx::raw_sql(&format!("DROP SCHEMA {} CASCADE", pg.name))
        .execute(&pg.pool)
        .await;
    pg.drop_all().await;
}

/// A request that counts its runs and pays `cents`.
fn request(
    cents: i64,
    runs: Arc<AtomicU32>,
) -> impl for<'a> FnOnce(
    &'a mut sqlx::Transaction<'static, sqlx::Postgres>,
) -> futures::future::BoxFuture<'a, Result<Response<Receipt>, String>> {
    move |_tx| {
        Box::pin(async move {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok(Response::new(Receipt {
                payment: "p".into(),
                cents,
            })
            .event(payment_event(cents)))
        })
    }
}

/// The first request holds its transaction open; a second one under the same key answers "in
/// progress" at once, without running; after the first commits, a third replays its result.
/// A request that fails rolls back, key and all: the next one runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_in_progress_answers_in_progress_and_is_not_run_twice_on_postgres() {
    let pg = Pg::new().await;
    outbox_postgres::migrate(&pg.pool, pg.schema.tables())
        .await
        .unwrap();
    let inbox = Inbox::new(pg.schema.clone());
    let runs = Arc::new(AtomicU32::new(0));
    let mut first = pg.pool.begin().await.unwrap();
    let a = inbox
        .idempotent(&mut first, "req-2", "f", request(1, runs.clone()))
        .await
        .unwrap();
    assert!(!a.replayed);
    let mut second = pg.pool.begin().await.unwrap();
    let started = std::time::Instant::now();
    let e = inbox
        .idempotent(&mut second, "req-2", "f", request(2, runs.clone()))
        .await
        .unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "it must not wait"
    );
    assert!(matches!(e, IdempotencyError::InProgress { .. }), "{e}");
    second.rollback().await.unwrap();
    first.commit().await.unwrap();
    let mut third = pg.pool.begin().await.unwrap();
    let c = inbox
        .idempotent(&mut third, "req-2", "f", request(3, runs.clone()))
        .await
        .unwrap();
    third.commit().await.unwrap();
    assert!(c.replayed);
    assert_eq!(c.result.cents, 1);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(outbox_rows_pg(&pg).await, 1);

    // A request that fails, or whose transaction rolls back, leaves no key: it runs again.
    let mut tx = pg.pool.begin().await.unwrap();
    let e = inbox
        .idempotent(&mut tx, "req-3", "f", |_tx| {
            Box::pin(async { Err::<Response<Receipt>, _>("card declined".to_string()) })
        })
        .await
        .unwrap_err();
    assert!(matches!(e, IdempotencyError::Request(ref why) if why == "card declined"));
    tx.rollback().await.unwrap();
    let mut tx = pg.pool.begin().await.unwrap();
    inbox
        .idempotent(&mut tx, "req-3", "f", request(4, runs.clone()))
        .await
        .unwrap();
    tx.rollback().await.unwrap(); // a crash before the commit
    let mut tx = pg.pool.begin().await.unwrap();
    let d = inbox
        .idempotent(&mut tx, "req-3", "f", request(5, runs.clone()))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert!(!d.replayed);
    assert_eq!(d.result.cents, 5);
    assert_eq!(runs.load(Ordering::SeqCst), 3);
    let _ = sqlx::raw_sql(&format!("DROP SCHEMA {} CASCADE", pg.name))
        .execute(&pg.pool)
        .await;
    pg.drop_all().await;
}

/// On SQLite a second request waits for the first (one writer at a time), then replays its
/// result: it never runs twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeat_replays_and_a_concurrent_one_waits_then_replays_on_sqlite() {
    let lite = Arc::new(Lite::new().await);
    outbox_sqlite::migrate(&lite.pool).await.unwrap();
    let runs = Arc::new(AtomicU32::new(0));
    let calls: Vec<_> = (0..3)
        .map(|i| {
            let (lite, runs) = (lite.clone(), runs.clone());
            tokio::spawn(async move {
                let mut tx = lite.pool.begin_with("BEGIN IMMEDIATE").await.unwrap();
                let a = outbox_inbox::idempotent(&mut tx, "req-1", "f", move |_tx| {
                    Box::pin(async move {
                        runs.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        Ok::<_, std::convert::Infallible>(
                            Response::new(Receipt {
                                payment: format!("p-{i}"),
                                cents: 7,
                            })
                            .event(payment_event(7)),
                        )
                    })
                })
                .await
                .unwrap();
                tx.commit().await.unwrap();
                a
            })
        })
        .collect();
    let mut answers = Vec::new();
    for c in calls {
        answers.push(c.await.unwrap());
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(answers.iter().filter(|a| !a.replayed).count(), 1);
    assert!(answers.iter().all(|a| a.result == answers[0].result));
    assert_eq!(lite.scalar("SELECT count(*) FROM outbox").await, 1);
    let mut tx = lite.pool.begin_with("BEGIN IMMEDIATE").await.unwrap();
    let e = outbox_inbox::idempotent(&mut tx, "req-1", "other", |_tx| {
        Box::pin(async {
            Ok::<_, std::convert::Infallible>(Response::new(Receipt {
                payment: "x".into(),
                cents: 0,
            }))
        })
    })
    .await
    .unwrap_err();
    assert!(matches!(e, IdempotencyError::Conflict { .. }));
    tx.rollback().await.unwrap();
    Arc::try_unwrap(lite).ok().unwrap().drop_all().await;
}
