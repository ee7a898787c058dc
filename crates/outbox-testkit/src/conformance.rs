//! The store conformance suite: behaviour every `Store` backend must show. A backend's test
//! file expands [`store_conformance_suite!`](crate::store_conformance_suite) with a function
//! that returns a fresh, migrated, empty store, and gets one `#[tokio::test]` per case.
//!
//! New store behaviour goes here, not into one backend's tests.

// Test code: a failed expectation should panic with its message.
#![allow(clippy::unwrap_used)]

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use outbox_core::{ClaimLimits, MemberId, NewMessage, OnFailed, Outcome, Store};

pub use crate::conformance_listing::{
    failed_messages_are_filtered_counted_and_paged_by_the_store,
    waiting_counts_the_messages_held_behind_retrying_or_failed_heads,
};

/// A fresh, migrated, empty store for one case, and what removes it afterwards (a schema to
/// drop, a file to delete), so the suite leaves nothing behind.
pub struct Fixture {
    /// The store under test.
    pub store: Arc<dyn Store>,
    /// Run after the case passed.
    pub teardown: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>,
}

/// Expands to one `#[tokio::test]` per conformance case, each calling `$factory().await` for a
/// fresh [`Fixture`] and tearing it down after the case.
#[macro_export]
macro_rules! store_conformance_suite {
    ($factory:path) => {
        $crate::__conformance_cases!($factory;
            claim_returns_pending_rows_in_sequence_order,
            published_rows_are_not_claimed_again,
            claim_respects_limit,
            members_split_partitions_without_overlap,
            members_that_join_first_each_take_a_fair_share_at_their_first_rebalance,
            claim_reads_only_owned_partitions,
            retry_blocks_its_key_until_due,
            deferred_row_waits_in_order_without_spending_attempts,
            failed_row_blocks_its_key_and_is_counted,
            complete_is_fenced_after_takeover,
            expired_lease_is_taken_over,
            release_frees_partitions_at_once,
            stats_report_pending_age_failed_and_published,
            insert_keeps_order_within_a_key,
            skip_policy_lets_a_failed_keys_later_rows_flow,
            blocked_keys_are_listed_with_the_heads_error,
            circuit_state_is_reported_per_member,
            concurrent_rebalancing_never_gives_a_partition_two_owners,
            stale_record_after_takeover_changes_nothing,
            stale_record_after_retaking_ones_own_partition_changes_nothing,
            parked_key_is_released_in_order_behind_its_head,
            claim_respects_the_byte_bound_but_passes_one_oversized_row,
            a_complete_dropped_mid_way_records_when_called_again,
            redrive_releases_a_failed_head_and_its_key_flows_in_order,
            gauges_agree_with_stats_and_the_database_answers_a_ping,
            failed_messages_are_filtered_counted_and_paged_by_the_store,
            waiting_counts_the_messages_held_behind_retrying_or_failed_heads
        );
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_cases {
    ($factory:path; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let fixture: $crate::conformance::Fixture = $factory().await;
                $crate::conformance::$case(fixture.store.clone()).await;
                fixture.teardown.await;
            }
        )*
    };
}

const LEASE: Duration = Duration::from_secs(30);

fn msg(key: &str, n: u32) -> NewMessage {
    NewMessage::new("order", key, "placed", serde_json::json!({ "n": n }))
}

/// A lone member of `store` and the partitions it took.
pub async fn sole_member(store: &Arc<dyn Store>) -> (MemberId, Vec<i32>) {
    let m = MemberId::random("conformance");
    let parts = store.rebalance(&m, LEASE).await.unwrap();
    assert!(!parts.is_empty(), "a lone member must own partitions");
    (m, parts)
}

/// Everything `m` can claim now from `parts`.
pub async fn claim_all(
    store: &Arc<dyn Store>,
    m: &MemberId,
    parts: &[i32],
) -> Vec<outbox_core::Message> {
    store
        .claim(m, parts, ClaimLimits::rows(10_000), OnFailed::Block)
        .await
        .unwrap()
}

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

/// Members converge to disjoint, fair shares that cover every partition.
pub async fn members_split_partitions_without_overlap(store: Arc<dyn Store>) {
    let members: Vec<_> = (0..3).map(|i| MemberId::random(&format!("m{i}"))).collect();
    let mut owned = vec![Vec::new(); 3];
    // Round 1 registers everyone; later rounds give back and take over.
    for _ in 0..4 {
        for (i, m) in members.iter().enumerate() {
            owned[i] = store.rebalance(m, LEASE).await.unwrap();
        }
    }
    let all: Vec<i32> = owned.iter().flatten().copied().collect();
    let distinct: HashSet<i32> = all.iter().copied().collect();
    assert_eq!(
        all.len(),
        distinct.len(),
        "a partition has two owners: {owned:?}"
    );
    let total = distinct.len();
    let fair = total.div_ceil(3);
    for o in &owned {
        assert!(
            !o.is_empty() && o.len() <= fair,
            "unfair split {:?}",
            owned.iter().map(Vec::len).collect::<Vec<_>>()
        );
    }
    // A lone member afterwards owns exactly this many partitions.
    let store2 = store.clone();
    for m in &members {
        store2.release(m).await.unwrap();
    }
    let (_, parts) = sole_member(&store).await;
    assert_eq!(parts.len(), total);
}

/// Members registered with `join` before any of them rebalances count each other at once: the
/// first to rebalance takes only its share, and one round covers every partition disjointly.
pub async fn members_that_join_first_each_take_a_fair_share_at_their_first_rebalance(
    store: Arc<dyn Store>,
) {
    let members: Vec<_> = (0..3).map(|i| MemberId::random(&format!("j{i}"))).collect();
    // The total, as a lone member sees it, then given back.
    let (lone, parts) = sole_member(&store).await;
    let total = parts.len();
    store.release(&lone).await.unwrap();
    for m in &members {
        store.join(m).await.unwrap();
    }
    let mut owned = Vec::new();
    for m in &members {
        owned.push(store.rebalance(m, LEASE).await.unwrap());
    }
    let fair = total.div_ceil(3);
    let sizes: Vec<usize> = owned.iter().map(Vec::len).collect();
    assert!(
        sizes.iter().all(|&n| n == fair || n == total - 2 * fair),
        "one round of rebalancing after joining gave {sizes:?} of {total} (fair share {fair})"
    );
    let distinct: HashSet<i32> = owned.iter().flatten().copied().collect();
    assert_eq!(
        (sizes.iter().sum::<usize>(), distinct.len()),
        (total, total),
        "every partition is owned once: {owned:?}"
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

/// Partitions whose lease expired go to another member; unexpired ones do not.
pub async fn expired_lease_is_taken_over(store: Arc<dyn Store>) {
    let a = MemberId::random("a");
    let b = MemberId::random("b");
    let short = Duration::from_millis(800);
    let pa = store.rebalance(&a, short).await.unwrap();
    let pb = store.rebalance(&b, short).await.unwrap();
    // b sees two members but a still holds everything under a live lease.
    assert!(pb.is_empty(), "b took partitions still leased to a: {pb:?}");
    tokio::time::sleep(short + Duration::from_millis(400)).await;
    let pb = store.rebalance(&b, short).await.unwrap();
    assert_eq!(
        pb.len(),
        pa.len(),
        "b must take over every expired partition"
    );
}

/// A graceful release lets another member take over without waiting for the lease.
pub async fn release_frees_partitions_at_once(store: Arc<dyn Store>) {
    let a = MemberId::random("a");
    let pa = store.rebalance(&a, LEASE).await.unwrap();
    store.release(&a).await.unwrap();
    let b = MemberId::random("b");
    let pb = store.rebalance(&b, LEASE).await.unwrap();
    assert_eq!(pb.len(), pa.len());
    assert_eq!(store.renew(&a, LEASE).await.unwrap(), 0);
    assert_eq!(store.renew(&b, LEASE).await.unwrap(), pb.len());
}

/// `stats` counts states and measures the oldest pending row's age.
pub async fn stats_report_pending_age_failed_and_published(store: Arc<dyn Store>) {
    let empty = store.stats().await.unwrap();
    assert_eq!((empty.pending, empty.failed, empty.published), (0, 0, 0));
    assert_eq!(empty.oldest_pending_age_seconds, None);
    store
        .insert(&[msg("a", 1), msg("b", 1), msg("c", 1)])
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let (m, parts) = sole_member(&store).await;
    let got = claim_all(&store, &m, &parts).await;
    store
        .complete(
            &m,
            &[
                Outcome::Published { seq: got[0].seq },
                Outcome::Failed {
                    seq: got[1].seq,
                    error: "nope".into(),
                },
            ],
        )
        .await
        .unwrap();
    let s = store.stats().await.unwrap();
    assert_eq!((s.pending, s.failed, s.published), (1, 1, 1));
    let age = s.oldest_pending_age_seconds.unwrap();
    assert!((1.0..60.0).contains(&age), "age {age}");
    assert_eq!(s.members.len(), 1);
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

/// A member's circuit breaker state shows in `stats`.
pub async fn circuit_state_is_reported_per_member(store: Arc<dyn Store>) {
    let (m, _) = sole_member(&store).await;
    assert_eq!(store.stats().await.unwrap().members[0].circuit, "closed");
    store
        .report_health(&m, "open", Some("nats: connection lost"))
        .await
        .unwrap();
    let s = store.stats().await.unwrap();
    assert_eq!(s.members[0].circuit, "open");
    assert_eq!(
        s.members[0].sink_error.as_deref(),
        Some("nats: connection lost")
    );
    store.report_health(&m, "closed", None).await.unwrap();
    assert_eq!(store.stats().await.unwrap().members[0].sink_error, None);
}

/// Members rebalancing at the same time (the acquire step skips rows another member is taking)
/// still never share a partition, and together cover all of them.
pub async fn concurrent_rebalancing_never_gives_a_partition_two_owners(store: Arc<dyn Store>) {
    let members: Vec<_> = (0..4).map(|i| MemberId::random(&format!("c{i}"))).collect();
    let mut last = vec![Vec::new(); members.len()];
    for _ in 0..5 {
        let rounds = members.iter().map(|m| {
            let store = store.clone();
            let m = m.clone();
            tokio::spawn(async move { store.rebalance(&m, LEASE).await.unwrap() })
        });
        let results = futures_join_all(rounds).await;
        let all: Vec<i32> = results.iter().flatten().copied().collect();
        let distinct: HashSet<i32> = all.iter().copied().collect();
        assert_eq!(all.len(), distinct.len(), "two owners: {results:?}");
        last = results;
    }
    let covered: HashSet<i32> = last.iter().flatten().copied().collect();
    assert!(
        !covered.is_empty() && last.iter().all(|o| !o.is_empty()),
        "every member ends with a share: {:?}",
        last.iter().map(Vec::len).collect::<Vec<_>>()
    );
}

async fn futures_join_all(
    handles: impl Iterator<Item = tokio::task::JoinHandle<Vec<i32>>>,
) -> Vec<Vec<i32>> {
    let mut out = Vec::new();
    for h in handles.collect::<Vec<_>>() {
        out.push(h.await.unwrap());
    }
    out
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

/// `gauges` (what a metrics scrape reads, in one cheap statement) agrees with `stats` on every
/// figure both give: pending (waiting for a retry included, failed excluded), retrying, parked,
/// failed, and whether anything is pending at all; `ping` answers.
pub async fn gauges_agree_with_stats_and_the_database_answers_a_ping(store: Arc<dyn Store>) {
    store.ping().await.unwrap();
    let empty = store.gauges().await.unwrap();
    assert_eq!(
        (empty.pending, empty.retrying, empty.parked, empty.failed),
        (0, 0, 0, 0)
    );
    assert_eq!(empty.oldest_pending_age_seconds, None);
    assert!(!empty.pending_capped);
    store
        .insert(&[msg("a", 1), msg("b", 1), msg("c", 1), msg("d", 1)])
        .await
        .unwrap();
    let (m, parts) = sole_member(&store).await;
    let got = claim_all(&store, &m, &parts).await;
    assert_eq!(got.len(), 4);
    store
        .complete(
            &m,
            &[
                Outcome::Published { seq: got[0].seq },
                Outcome::Retry {
                    seq: got[1].seq,
                    error: "later".into(),
                    delay: Duration::from_secs(3600),
                },
                Outcome::Failed {
                    seq: got[2].seq,
                    error: "nope".into(),
                },
                Outcome::Published { seq: got[3].seq },
            ],
        )
        .await
        .unwrap();
    store.insert(&[msg("e", 1), msg("e", 2)]).await.unwrap();
    let s = store.stats().await.unwrap();
    let g = store.gauges().await.unwrap();
    assert_eq!(
        (g.pending, g.retrying, g.parked, g.failed),
        (s.pending, s.retrying, s.parked, s.failed),
        "gauges {g:?} against stats {s:?}"
    );
    assert_eq!((g.pending, g.retrying, g.failed), (3, 1, 1), "{g:?}");
    // A running total of what was published, where the store keeps one.
    assert!(matches!(g.published, None | Some(2)), "{g:?}");
    let age = g.oldest_pending_age_seconds.expect("something is pending");
    assert!((0.0..3600.0).contains(&age), "age {age}");
    assert!(!g.pending_capped);
    assert!(g.retention_pins.iter().all(|p| p.age_seconds >= 0.0));
}
