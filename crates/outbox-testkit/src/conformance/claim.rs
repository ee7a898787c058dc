//! Store conformance cases about claiming: what a claim returns, in which order, within which
//! limits (rows, bytes), from which partitions; and the order inserts keep within a key.

// Test code: a failed expectation should panic with its message.
#![allow(clippy::unwrap_used)]

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use outbox_core::{ClaimLimits, MemberId, NewMessage, OnFailed, Outcome, Store};

use super::{claim_all, msg, sole_member, LEASE};

/// Rows come back in the order they were inserted.
pub async fn claim_returns_pending_rows_in_sequence_order(store: Arc<dyn Store>) {
    let msgs: Vec<_> = (0..20).map(|i| msg(&format!("k{}", i % 3), i)).collect();
    store.insert(&msgs).await.unwrap();
    let (m, parts) = sole_member(&store).await;
    let got = claim_all(&store, &m, &parts).await;
    assert_eq!(
        got.iter().map(|r| r.id).collect::<Vec<_>>(),
        msgs.iter().map(|x| x.id).collect::<Vec<_>>()
    );
    assert!(got.windows(2).all(|w| w[0].seq < w[1].seq));
    assert!(got.iter().all(|r| r.attempts == 0));
}

/// A published row is never handed out again.
pub async fn published_rows_are_not_claimed_again(store: Arc<dyn Store>) {
    store.insert(&[msg("a", 1), msg("b", 2)]).await.unwrap();
    let (m, parts) = sole_member(&store).await;
    let got = claim_all(&store, &m, &parts).await;
    let outcomes: Vec<_> = got
        .iter()
        .map(|r| Outcome::Published { seq: r.seq })
        .collect();
    assert_eq!(store.complete(&m, &outcomes).await.unwrap(), 2);
    assert!(claim_all(&store, &m, &parts).await.is_empty());
    // Completing twice changes nothing.
    assert_eq!(store.complete(&m, &outcomes).await.unwrap(), 0);
    let s = store.stats().await.unwrap();
    assert_eq!((s.pending, s.published), (0, 2));
}

/// `limit` bounds a claim.
pub async fn claim_respects_limit(store: Arc<dyn Store>) {
    let msgs: Vec<_> = (0..50).map(|i| msg(&format!("k{i}"), i)).collect();
    store.insert(&msgs).await.unwrap();
    let (m, parts) = sole_member(&store).await;
    assert_eq!(
        store
            .claim(&m, &parts, ClaimLimits::rows(7), OnFailed::Block)
            .await
            .unwrap()
            .len(),
        7
    );
}

/// A member reads only its own partitions; together the members read every row once.
pub async fn claim_reads_only_owned_partitions(store: Arc<dyn Store>) {
    let msgs: Vec<_> = (0..200).map(|i| msg(&format!("key-{i}"), i)).collect();
    store.insert(&msgs).await.unwrap();
    let a = MemberId::random("a");
    let b = MemberId::random("b");
    store.rebalance(&a, LEASE).await.unwrap();
    store.rebalance(&b, LEASE).await.unwrap();
    let pa = store.rebalance(&a, LEASE).await.unwrap();
    let pb = store.rebalance(&b, LEASE).await.unwrap();
    assert!(!pa.is_empty() && !pb.is_empty());
    let ga = claim_all(&store, &a, &pa).await;
    let gb = claim_all(&store, &b, &pb).await;
    // Asking for another member's partitions yields nothing.
    assert!(store
        .claim(&a, &pb, ClaimLimits::rows(1000), OnFailed::Block)
        .await
        .unwrap()
        .is_empty());
    let ids_a: HashSet<_> = ga.iter().map(|r| r.id).collect();
    let ids_b: HashSet<_> = gb.iter().map(|r| r.id).collect();
    assert!(ids_a.is_disjoint(&ids_b));
    assert_eq!(ids_a.len() + ids_b.len(), 200);
    // A key lives in exactly one partition, so in exactly one member's claims.
    let keys_a: HashSet<_> = ga.iter().map(|r| r.aggregate_id.clone()).collect();
    assert!(gb.iter().all(|r| !keys_a.contains(&r.aggregate_id)));
}

/// Messages of one key inserted in one call keep their order.
pub async fn insert_keeps_order_within_a_key(store: Arc<dyn Store>) {
    let msgs: Vec<_> = (0..100).map(|i| msg("same", i)).collect();
    store.insert(&msgs).await.unwrap();
    let (m, parts) = sole_member(&store).await;
    let got = claim_all(&store, &m, &parts).await;
    let ns: Vec<u64> = got
        .iter()
        .map(|r| {
            serde_json::from_slice::<serde_json::Value>(&r.payload).unwrap()["n"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert_eq!(ns, (0..100).collect::<Vec<u64>>());
}

/// A claim hands out at most `limits.bytes` of payloads, a prefix in seq order, with a retried
/// message counted like any other; what it leaves out is handed out by later claims (never lost,
/// never out of order), and a payload larger than the bound goes through alone.
pub async fn claim_respects_the_byte_bound_but_passes_one_oversized_row(store: Arc<dyn Store>) {
    let doc = |key: String, n: usize, pad: usize| {
        NewMessage::new(
            "doc",
            key,
            "stored",
            serde_json::json!({ "n": n, "pad": "x".repeat(pad) }),
        )
    };
    let big = doc("big".into(), 0, 5_000);
    // About 1 KB each, one key each: only the byte bound can split them.
    let small: Vec<_> = (0..7).map(|i| doc(format!("s{i}"), i, 1_000)).collect();
    store.insert(std::slice::from_ref(&big)).await.unwrap();
    store.insert(&small).await.unwrap();
    let (m, parts) = sole_member(&store).await;
    let limits = ClaimLimits {
        rows: 100,
        bytes: 3_500,
    };
    let bytes = |b: &[outbox_core::Message]| b.iter().map(|r| r.payload.len()).sum::<usize>();

    let first = store
        .claim(&m, &parts, limits, OnFailed::Block)
        .await
        .unwrap();
    assert_eq!(
        first.iter().map(|r| r.id).collect::<Vec<_>>(),
        vec![big.id],
        "the oversized payload goes alone"
    );
    assert!(first[0].payload.len() > limits.bytes);
    store
        .complete(&m, &[Outcome::Published { seq: first[0].seq }])
        .await
        .unwrap();

    // Three of the small payloads fit in 3,500 bytes, a fourth would not.
    let second = store
        .claim(&m, &parts, limits, OnFailed::Block)
        .await
        .unwrap();
    assert_eq!(
        second.iter().map(|r| r.id).collect::<Vec<_>>(),
        small[..3].iter().map(|x| x.id).collect::<Vec<_>>()
    );
    assert!(bytes(&second) <= limits.bytes);
    // The third is retried at once: it comes back, and the bound counts it.
    store
        .complete(
            &m,
            &[
                Outcome::Published { seq: second[0].seq },
                Outcome::Published { seq: second[1].seq },
                Outcome::Retry {
                    seq: second[2].seq,
                    error: "try again".into(),
                    delay: Duration::ZERO,
                },
            ],
        )
        .await
        .unwrap();
    let mut delivered: Vec<uuid::Uuid> = vec![big.id, second[0].id, second[1].id];
    for _ in 0..10 {
        let got = store
            .claim(&m, &parts, limits, OnFailed::Block)
            .await
            .unwrap();
        if got.is_empty() {
            break;
        }
        assert!(
            bytes(&got) <= limits.bytes,
            "{} bytes handed out in {} messages",
            bytes(&got),
            got.len()
        );
        assert!(got.windows(2).all(|w| w[0].seq < w[1].seq));
        let outcomes: Vec<_> = got
            .iter()
            .map(|r| Outcome::Published { seq: r.seq })
            .collect();
        store.complete(&m, &outcomes).await.unwrap();
        delivered.extend(got.iter().map(|r| r.id));
    }
    let mut want: Vec<_> = std::iter::once(big.id)
        .chain(small.iter().map(|x| x.id))
        .collect();
    want.sort();
    delivered.sort();
    assert_eq!(delivered, want, "every message once, none lost");
    let s = store.stats().await.unwrap();
    assert_eq!((s.pending, s.published), (0, 8));
}
