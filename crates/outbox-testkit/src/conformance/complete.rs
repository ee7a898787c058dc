//! Store conformance cases about completing a publish ([`Store::complete`]): retries, deferrals
//! and failures holding their key, fencing after a takeover, and a dropped call completed again.

// Test code: a failed expectation should panic with its message.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use outbox_core::{ClaimLimits, MemberId, OnFailed, Outcome, Store};

use super::{claim_all, msg, sole_member, LEASE};

/// A row waiting for a retry holds back the later rows of its key, and only of its key.
pub async fn retry_blocks_its_key_until_due(store: Arc<dyn Store>) {
    let (a1, a2, b1) = (msg("a", 1), msg("a", 2), msg("b", 1));
    store
        .insert(&[a1.clone(), a2.clone(), b1.clone()])
        .await
        .unwrap();
    let (m, parts) = sole_member(&store).await;
    let got = claim_all(&store, &m, &parts).await;
    let seq_a1 = got.iter().find(|r| r.id == a1.id).unwrap().seq;
    let delay = Duration::from_millis(1500);
    let n = store
        .complete(
            &m,
            &[Outcome::Retry {
                seq: seq_a1,
                error: "broker down".into(),
                delay,
            }],
        )
        .await
        .unwrap();
    assert_eq!(n, 1);
    let now: Vec<_> = claim_all(&store, &m, &parts)
        .await
        .into_iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(now, vec![b1.id], "key `a` must wait for its head's retry");
    tokio::time::sleep(delay + Duration::from_millis(300)).await;
    let later = claim_all(&store, &m, &parts).await;
    assert_eq!(
        later.iter().map(|r| r.id).collect::<Vec<_>>(),
        vec![a1.id, a2.id, b1.id]
    );
    assert_eq!(later[0].attempts, 1);
    let s = store.stats().await.unwrap();
    assert_eq!(s.retrying, 1);
}

/// A row deferred because its sink's circuit is open waits, with the later rows of its key,
/// like a retry, but spends no attempt: neither from the message table nor once parked. Other
/// keys flow.
pub async fn deferred_row_waits_in_order_without_spending_attempts(store: Arc<dyn Store>) {
    let (a1, a2, b1) = (msg("a", 1), msg("a", 2), msg("b", 1));
    store
        .insert(&[a1.clone(), a2.clone(), b1.clone()])
        .await
        .unwrap();
    let (m, parts) = sole_member(&store).await;
    let got = claim_all(&store, &m, &parts).await;
    let seq = |id| got.iter().find(|r| r.id == id).unwrap().seq;
    let delay = Duration::from_millis(800);
    let deferred = |seq| Outcome::Deferred {
        seq,
        error: "sink `kafka` unavailable (circuit open)".into(),
        delay,
    };
    store
        .complete(
            &m,
            &[deferred(seq(a1.id)), Outcome::Published { seq: seq(b1.id) }],
        )
        .await
        .unwrap();
    assert!(
        claim_all(&store, &m, &parts).await.is_empty(),
        "key `a` waits for its deferred head, `b` is done"
    );
    tokio::time::sleep(delay + Duration::from_millis(300)).await;
    let later = claim_all(&store, &m, &parts).await;
    assert_eq!(
        later.iter().map(|r| r.id).collect::<Vec<_>>(),
        vec![a1.id, a2.id]
    );
    assert_eq!(later[0].attempts, 0, "a deferral is not an attempt");
    // Deferred again from wherever the store keeps it now: still no attempt spent.
    store.complete(&m, &[deferred(later[0].seq)]).await.unwrap();
    tokio::time::sleep(delay + Duration::from_millis(300)).await;
    let again = claim_all(&store, &m, &parts).await;
    assert_eq!(
        again.iter().map(|r| r.id).collect::<Vec<_>>(),
        vec![a1.id, a2.id]
    );
    assert_eq!(again[0].attempts, 0);
    store
        .complete(
            &m,
            &[
                Outcome::Published { seq: again[0].seq },
                Outcome::Published { seq: again[1].seq },
            ],
        )
        .await
        .unwrap();
    assert!(claim_all(&store, &m, &parts).await.is_empty());
    let s = store.stats().await.unwrap();
    assert_eq!((s.pending, s.retrying, s.failed), (0, 0, 0));
}

/// A failed row stays visible with its error and blocks its key (ordered mode).
pub async fn failed_row_blocks_its_key_and_is_counted(store: Arc<dyn Store>) {
    let (a1, a2, b1) = (msg("a", 1), msg("a", 2), msg("b", 1));
    store
        .insert(&[a1.clone(), a2.clone(), b1.clone()])
        .await
        .unwrap();
    let (m, parts) = sole_member(&store).await;
    let got = claim_all(&store, &m, &parts).await;
    let seq_a1 = got.iter().find(|r| r.id == a1.id).unwrap().seq;
    store
        .complete(
            &m,
            &[Outcome::Failed {
                seq: seq_a1,
                error: "payload too large".into(),
            }],
        )
        .await
        .unwrap();
    let now: Vec<_> = claim_all(&store, &m, &parts)
        .await
        .into_iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(now, vec![b1.id]);
    let s = store.stats().await.unwrap();
    assert_eq!((s.failed, s.pending, s.blocked_keys), (1, 2, 1));
}

/// A member that lost its partitions cannot record results for them.
pub async fn complete_is_fenced_after_takeover(store: Arc<dyn Store>) {
    store.insert(&[msg("a", 1)]).await.unwrap();
    let old = MemberId::random("old");
    let short = Duration::from_millis(800);
    let parts = store.rebalance(&old, short).await.unwrap();
    let got = store
        .claim(&old, &parts, ClaimLimits::rows(10), OnFailed::Block)
        .await
        .unwrap();
    assert_eq!(got.len(), 1);
    tokio::time::sleep(short + Duration::from_millis(400)).await;
    let new = MemberId::random("new");
    let new_parts = store.rebalance(&new, short).await.unwrap();
    assert_eq!(
        new_parts.len(),
        parts.len(),
        "the new member must take over every expired partition"
    );
    let changed = store
        .complete(&old, &[Outcome::Published { seq: got[0].seq }])
        .await
        .unwrap();
    assert_eq!(changed, 0, "a fenced member's result must not be recorded");
    let again = store
        .claim(&new, &new_parts, ClaimLimits::rows(10), OnFailed::Block)
        .await
        .unwrap();
    assert_eq!(
        again.iter().map(|r| r.id).collect::<Vec<_>>(),
        vec![got[0].id]
    );
}

/// A member that lost its partition to another records nothing: neither a retry, nor a
/// failure, nor progress. The new owner gets the rows as if the old one never touched them.
pub async fn stale_record_after_takeover_changes_nothing(store: Arc<dyn Store>) {
    store.insert(&[msg("a", 1), msg("b", 1)]).await.unwrap();
    let old = MemberId::random("old");
    let short = Duration::from_millis(800);
    let parts = store.rebalance(&old, short).await.unwrap();
    let got = store
        .claim(&old, &parts, ClaimLimits::rows(10), OnFailed::Block)
        .await
        .unwrap();
    assert_eq!(got.len(), 2);
    tokio::time::sleep(short + Duration::from_millis(400)).await;
    let new = MemberId::random("new");
    let new_parts = store.rebalance(&new, short).await.unwrap();
    assert_eq!(new_parts.len(), parts.len());
    let stale = [
        Outcome::Retry {
            seq: got[0].seq,
            error: "stale".into(),
            delay: Duration::from_secs(60),
        },
        Outcome::Failed {
            seq: got[1].seq,
            error: "stale".into(),
        },
    ];
    assert_eq!(store.complete(&old, &stale).await.unwrap(), 0);
    let s = store.stats().await.unwrap();
    assert_eq!(
        (s.pending, s.failed, s.retrying, s.blocked_keys),
        (2, 0, 0, 0)
    );
    let again = claim_all(&store, &new, &new_parts).await;
    assert_eq!(
        again.iter().map(|m| m.id).collect::<Vec<_>>(),
        got.iter().map(|m| m.id).collect::<Vec<_>>()
    );
    assert!(again.iter().all(|m| m.attempts == 0));
}

/// A member whose lease expired and who took its partitions back is a new owner: results of
/// its claim from before (under the old lease) are not recorded either.
pub async fn stale_record_after_retaking_ones_own_partition_changes_nothing(store: Arc<dyn Store>) {
    store.insert(&[msg("a", 1)]).await.unwrap();
    let m = MemberId::random("self");
    let short = Duration::from_millis(800);
    let parts = store.rebalance(&m, short).await.unwrap();
    let got = store
        .claim(&m, &parts, ClaimLimits::rows(10), OnFailed::Block)
        .await
        .unwrap();
    assert_eq!(got.len(), 1);
    // Someone else takes over while `m` is paused, then gives everything back.
    tokio::time::sleep(short + Duration::from_millis(400)).await;
    let other = MemberId::random("other");
    assert_eq!(
        store.rebalance(&other, short).await.unwrap().len(),
        parts.len()
    );
    store.release(&other).await.unwrap();
    // `m` wakes up and re-takes its partitions.
    let back = store.rebalance(&m, LEASE).await.unwrap();
    assert_eq!(back.len(), parts.len());
    let changed = store
        .complete(&m, &[Outcome::Published { seq: got[0].seq }])
        .await
        .unwrap();
    assert_eq!(
        changed, 0,
        "a result claimed under an older lease must not count"
    );
    let again = claim_all(&store, &m, &back).await;
    assert_eq!(
        again.iter().map(|r| r.id).collect::<Vec<_>>(),
        vec![got[0].id]
    );
}

/// The relay drops a store call that outlives its deadline. A `complete` dropped mid-way must
/// record the batch when called again with the same outcomes, not forget it.
pub async fn a_complete_dropped_mid_way_records_when_called_again(store: Arc<dyn Store>) {
    store.insert(&[msg("a", 1), msg("b", 2)]).await.unwrap();
    let (m, parts) = sole_member(&store).await;
    let got = claim_all(&store, &m, &parts).await;
    let outcomes: Vec<_> = got
        .iter()
        .map(|r| Outcome::Published { seq: r.seq })
        .collect();
    // A zero deadline: the call is polled once, then dropped wherever it stands. Its statement
    // may still run (SQLite's driver finishes it on its own thread): then the retry finds
    // nothing left to change, which is fine. What must not happen is that neither records it.
    let _ = tokio::time::timeout(Duration::ZERO, store.complete(&m, &outcomes)).await;
    store.complete(&m, &outcomes).await.unwrap();
    assert!(
        claim_all(&store, &m, &parts).await.is_empty(),
        "the batch must be recorded by the dropped call or its retry"
    );
    assert_eq!(store.stats().await.unwrap().published, 2);
}
