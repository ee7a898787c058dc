//! The store conformance suite: behaviour every `Store` backend must show. A backend's test
//! file expands [`store_conformance_suite!`](crate::store_conformance_suite) with a function
//! that returns a fresh, migrated, empty store, and gets one `#[tokio::test]` per case.
//!
//! The cases are in one file per topic (`claim`, `lease`, `complete`, `parking`, `inspect`,
//! `listing`), each reached here as `conformance::<case>`. New store behaviour goes here, not
//! into one backend's tests.

// Test code: a failed expectation should panic with its message.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use outbox_core::{ClaimLimits, MemberId, NewMessage, OnFailed, Store};

mod claim;
mod complete;
mod inspect;
mod lease;
mod listing;
mod parking;

pub use claim::{
    claim_reads_only_owned_partitions, claim_respects_limit,
    claim_respects_the_byte_bound_but_passes_one_oversized_row,
    claim_returns_pending_rows_in_sequence_order, insert_keeps_order_within_a_key,
    published_rows_are_not_claimed_again,
};
pub use complete::{
    a_complete_dropped_mid_way_records_when_called_again, complete_is_fenced_after_takeover,
    deferred_row_waits_in_order_without_spending_attempts,
    failed_row_blocks_its_key_and_is_counted, retry_blocks_its_key_until_due,
    stale_record_after_retaking_ones_own_partition_changes_nothing,
    stale_record_after_takeover_changes_nothing,
};
pub use inspect::{
    circuit_state_is_reported_per_member, gauges_agree_with_stats_and_the_database_answers_a_ping,
    stats_report_pending_age_failed_and_published,
};
pub use lease::{
    concurrent_rebalancing_never_gives_a_partition_two_owners, expired_lease_is_taken_over,
    members_split_partitions_without_overlap,
    members_that_join_first_each_take_a_fair_share_at_their_first_rebalance,
    release_frees_partitions_at_once,
};
pub use listing::{
    failed_messages_are_filtered_counted_and_paged_by_the_store,
    waiting_counts_the_messages_held_behind_retrying_or_failed_heads,
};
pub use parking::{
    blocked_keys_are_listed_with_the_heads_error, parked_key_is_released_in_order_behind_its_head,
    redrive_releases_a_failed_head_and_its_key_flows_in_order,
    skip_policy_lets_a_failed_keys_later_rows_flow,
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
/// fresh [`Fixture`] and tearing it down after the case. `; except [case, …]` leaves out cases
/// whose meaning differs for the store (say why beside each, as the sink suite does): a
/// misspelt exception does not compile, and an excepted case expands to nothing.
#[macro_export]
macro_rules! store_conformance_suite {
    ($factory:path $(; except [$($except:ident),* $(,)?])?) => {
        $(
            // A misspelt exception does not compile.
            $(#[allow(unused_imports)] use $crate::conformance::$except as _;)*
        )?
        $crate::__conformance_cases!([$] $factory; [$($($except)*)?];
            claim_returns_pending_rows_in_sequence_order
            published_rows_are_not_claimed_again
            claim_respects_limit
            members_split_partitions_without_overlap
            members_that_join_first_each_take_a_fair_share_at_their_first_rebalance
            claim_reads_only_owned_partitions
            retry_blocks_its_key_until_due
            deferred_row_waits_in_order_without_spending_attempts
            failed_row_blocks_its_key_and_is_counted
            complete_is_fenced_after_takeover
            expired_lease_is_taken_over
            release_frees_partitions_at_once
            stats_report_pending_age_failed_and_published
            insert_keeps_order_within_a_key
            skip_policy_lets_a_failed_keys_later_rows_flow
            blocked_keys_are_listed_with_the_heads_error
            circuit_state_is_reported_per_member
            concurrent_rebalancing_never_gives_a_partition_two_owners
            stale_record_after_takeover_changes_nothing
            stale_record_after_retaking_ones_own_partition_changes_nothing
            parked_key_is_released_in_order_behind_its_head
            claim_respects_the_byte_bound_but_passes_one_oversized_row
            a_complete_dropped_mid_way_records_when_called_again
            redrive_releases_a_failed_head_and_its_key_flows_in_order
            gauges_agree_with_stats_and_the_database_answers_a_ping
            failed_messages_are_filtered_counted_and_paged_by_the_store
            waiting_counts_the_messages_held_behind_retrying_or_failed_heads
        );
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_cases {
    ([$d:tt] $factory:path; [$($except:ident)*]; $($case:ident)*) => {
        // A macro that expands to nothing for an excepted case and to the test otherwise: its
        // rules match the excepted names literally (`$d` is a `$` passed in, so this macro can
        // declare its own metavariables).
        macro_rules! __store_case_unless_excepted {
            $( ($except) => {}; )*
            ($d case:ident) => {
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $d case() {
                    let fixture: $crate::conformance::Fixture = $factory().await;
                    $crate::conformance::$d case(fixture.store.clone()).await;
                    fixture.teardown.await;
                }
            };
        }
        $( __store_case_unless_excepted!($case); )*
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
