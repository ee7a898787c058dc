//! Store conformance cases about membership and leases: partitions split without overlap and
//! fairly, an expired lease taken over, a release freeing partitions at once, and concurrent
//! rebalancing never giving a partition two owners.

// Test code: a failed expectation should panic with its message.
#![allow(clippy::unwrap_used)]

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use outbox_core::{MemberId, Store};

use super::{sole_member, LEASE};

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
