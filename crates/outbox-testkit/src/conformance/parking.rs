//! Store conformance cases about keys held behind a retrying or failed head: parked messages
//! released in order, the skip policy, redrive, and the blocked keys listed with their error.

// Test code: a failed expectation should panic with its message.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use outbox_core::{ClaimLimits, OnFailed, Outcome, Store};

use super::{claim_all, msg, sole_member};

/// A failed head is listed with its error; a redrive gives it a fresh budget (zero attempts, due
/// now), records it in the audit table, and releases its key: the head first, then the messages
/// that waited behind it, in order. Redriving what is not failed changes nothing.
pub async fn redrive_releases_a_failed_head_and_its_key_flows_in_order(store: Arc<dyn Store>) {
    let a: Vec<_> = (0..3).map(|i| msg("a", i)).collect();
    store.insert(&a).await.unwrap();
    let (m, parts) = sole_member(&store).await;
    let got = claim_all(&store, &m, &parts).await;
    assert_eq!(got.len(), 3);
    let head = got[0].seq;
    store
        .complete(
            &m,
            &[Outcome::Failed {
                seq: head,
                error: "handler said no".into(),
            }],
        )
        .await
        .unwrap();
    // Written after the failure: it waits behind the head too.
    let later = msg("a", 3);
    store.insert(std::slice::from_ref(&later)).await.unwrap();
    assert!(claim_all(&store, &m, &parts).await.is_empty());
    let failed = store.failed(10).await.unwrap();
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0].id, a[0].id);
    assert_eq!(failed[0].aggregate_id, "a");
    assert_eq!(failed[0].attempts, 1);
    assert_eq!(failed[0].last_error.as_deref(), Some("handler said no"));
    // Ids that are not failed are ignored.
    let other = outbox_core::RedriveScope::Ids(vec![a[1].id, uuid::Uuid::now_v7()]);
    assert_eq!(store.redrive(&other, "test").await.unwrap(), 0);
    let scope = outbox_core::RedriveScope::Ids(vec![a[0].id]);
    assert_eq!(store.redrive(&scope, "fixed the handler").await.unwrap(), 1);
    assert_eq!(store.redrive(&scope, "again").await.unwrap(), 0);
    assert!(store.failed(10).await.unwrap().is_empty());
    let s = store.stats().await.unwrap();
    assert_eq!(s.failed, 0);
    let released = claim_all(&store, &m, &parts).await;
    let want: Vec<_> = a.iter().chain([&later]).map(|x| x.id).collect();
    assert_eq!(released.iter().map(|r| r.id).collect::<Vec<_>>(), want);
    assert_eq!(released[0].attempts, 0, "a fresh budget");
    let outcomes: Vec<_> = released
        .iter()
        .map(|r| Outcome::Published { seq: r.seq })
        .collect();
    assert_eq!(store.complete(&m, &outcomes).await.unwrap(), 4);
    assert!(claim_all(&store, &m, &parts).await.is_empty());
    let s = store.stats().await.unwrap();
    assert_eq!((s.pending, s.failed, s.published), (0, 0, 4));
    // `All` redrives whatever is failed: nothing now.
    assert_eq!(
        store
            .redrive(&outbox_core::RedriveScope::All, "sweep")
            .await
            .unwrap(),
        0
    );
}

/// With `OnFailed::Skip`, a failed row no longer holds back the rest of its key.
pub async fn skip_policy_lets_a_failed_keys_later_rows_flow(store: Arc<dyn Store>) {
    let (a1, a2) = (msg("a", 1), msg("a", 2));
    store.insert(&[a1.clone(), a2.clone()]).await.unwrap();
    let (m, parts) = sole_member(&store).await;
    let got = claim_all(&store, &m, &parts).await;
    store
        .complete(
            &m,
            &[Outcome::Failed {
                seq: got[0].seq,
                error: "poison".into(),
            }],
        )
        .await
        .unwrap();
    assert!(
        claim_all(&store, &m, &parts).await.is_empty(),
        "block is the default"
    );
    let skip = store
        .claim(&m, &parts, ClaimLimits::rows(100), OnFailed::Skip)
        .await
        .unwrap();
    assert_eq!(skip.iter().map(|r| r.id).collect::<Vec<_>>(), vec![a2.id]);
}

/// `stats` names blocked keys with the head message's state and error.
pub async fn blocked_keys_are_listed_with_the_heads_error(store: Arc<dyn Store>) {
    store
        .insert(&[msg("a", 1), msg("a", 2), msg("b", 1), msg("c", 1)])
        .await
        .unwrap();
    let (m, parts) = sole_member(&store).await;
    let got = claim_all(&store, &m, &parts).await;
    let seq_of = |key: &str| got.iter().find(|r| r.aggregate_id == key).unwrap().seq;
    store
        .complete(
            &m,
            &[
                Outcome::Failed {
                    seq: seq_of("a"),
                    error: "too large".into(),
                },
                Outcome::Retry {
                    seq: seq_of("b"),
                    error: "timeout".into(),
                    delay: Duration::from_secs(60),
                },
                Outcome::Published { seq: seq_of("c") },
            ],
        )
        .await
        .unwrap();
    let s = store.stats().await.unwrap();
    assert_eq!(s.blocked_keys, 2);
    let mut blocked: Vec<_> = s
        .blocked
        .iter()
        .map(|b| {
            (
                b.key.as_str(),
                b.state.as_str(),
                b.attempts,
                b.last_error.as_deref(),
            )
        })
        .collect();
    blocked.sort();
    assert_eq!(
        blocked,
        vec![
            ("a", "failed", 1, Some("too large")),
            ("b", "retrying", 1, Some("timeout"))
        ]
    );
}

/// A key whose head is retried holds its later rows (also rows written after the failure);
/// once the head succeeds they come out in order, and other keys never waited.
pub async fn parked_key_is_released_in_order_behind_its_head(store: Arc<dyn Store>) {
    let first: Vec<_> = (0..3).map(|i| msg("a", i)).collect();
    store.insert(&first).await.unwrap();
    store.insert(&[msg("b", 0)]).await.unwrap();
    let (m, parts) = sole_member(&store).await;
    let got = claim_all(&store, &m, &parts).await;
    assert_eq!(got.len(), 4);
    let head = got.iter().find(|r| r.id == first[0].id).unwrap().seq;
    let b = got.iter().find(|r| r.aggregate_id == "b").unwrap().seq;
    // Long enough for the inserts below on a busy machine (on MySQL's binlog route an insert
    // returns once the sequencer has positioned it): the head must still be waiting then.
    let delay = Duration::from_millis(2_000);
    store
        .complete(
            &m,
            &[
                Outcome::Retry {
                    seq: head,
                    error: "down".into(),
                    delay,
                },
                Outcome::Published { seq: b },
            ],
        )
        .await
        .unwrap();
    // Written after the failure: they must wait behind the head too.
    let later: Vec<_> = (3..5).map(|i| msg("a", i)).collect();
    store.insert(&later).await.unwrap();
    store.insert(&[msg("c", 0)]).await.unwrap();
    let now = claim_all(&store, &m, &parts).await;
    assert_eq!(
        now.iter()
            .map(|r| r.aggregate_id.as_str())
            .collect::<Vec<_>>(),
        vec!["c"],
        "only the other key flows while `a` waits"
    );
    let c = now[0].seq;
    store
        .complete(&m, &[Outcome::Published { seq: c }])
        .await
        .unwrap();
    tokio::time::sleep(delay + Duration::from_millis(300)).await;
    let released = claim_all(&store, &m, &parts).await;
    let want: Vec<_> = first.iter().chain(later.iter()).map(|x| x.id).collect();
    assert_eq!(released.iter().map(|r| r.id).collect::<Vec<_>>(), want);
    let outcomes: Vec<_> = released
        .iter()
        .map(|r| Outcome::Published { seq: r.seq })
        .collect();
    assert_eq!(store.complete(&m, &outcomes).await.unwrap(), 5);
    assert!(claim_all(&store, &m, &parts).await.is_empty());
    let s = store.stats().await.unwrap();
    assert_eq!(
        (s.pending, s.published, s.parked, s.blocked_keys),
        (0, 7, 0, 0)
    );
}
