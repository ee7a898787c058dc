//! The store conformance suite's cases about what operators read (part of
//! [`store_conformance_suite!`](crate::store_conformance_suite)): failed messages filtered,
//! counted and paged by the store itself, and the pending messages held back behind retrying or
//! failed heads.

// Test code: a failed expectation should panic with its message.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use outbox_core::{FailedFilter, FailedMessage, NewMessage, Outcome, Store};

use super::{claim_all, sole_member};

fn filter(key: Option<&str>, kind: Option<&str>, error: Option<&str>) -> FailedFilter {
    FailedFilter {
        key: key.map(str::to_string),
        kind: kind.map(str::to_string),
        error: error.map(str::to_string),
    }
}

/// Every page of `filter`, `size` at a time, following each page's last sequence.
async fn all_pages(store: &Arc<dyn Store>, f: &FailedFilter, size: usize) -> (i64, Vec<i64>) {
    let mut after = None;
    let mut seqs = Vec::new();
    let mut total = None;
    loop {
        let page = store.failed_matching(f, after, size).await.unwrap();
        assert!(page.messages.len() <= size, "a page holds at most its size");
        if let Some(t) = total {
            assert_eq!(page.total, t, "the total does not depend on the page");
        }
        total = Some(page.total);
        match page.messages.last() {
            Some(last) => after = Some(last.seq),
            None => break,
        }
        seqs.extend(page.messages.iter().map(|m| m.seq));
    }
    (total.unwrap_or(0), seqs)
}

/// The store filters failed messages (exact key; any-case part of `type/event`; any-case part
/// of the error, with `%` and `_` meaning themselves), counts all that match whatever the page
/// size, and pages them oldest first after a sequence, as [`FailedFilter::matches`] says.
pub async fn failed_messages_are_filtered_counted_and_paged_by_the_store(store: Arc<dyn Store>) {
    let messages: Vec<NewMessage> = (0..30)
        .map(|i| {
            let (ty, ev) = if i % 3 == 0 {
                ("pay", "payment.made")
            } else {
                ("order", "order.placed")
            };
            NewMessage::new(ty, format!("k-{i}"), ev, serde_json::json!({ "i": i }))
        })
        .collect();
    store.insert(&messages).await.unwrap();
    let (m, parts) = sole_member(&store).await;
    let got = claim_all(&store, &m, &parts).await;
    assert_eq!(got.len(), 30);
    let outcomes: Vec<Outcome> = got
        .iter()
        .map(|r| Outcome::Failed {
            seq: r.seq,
            error: if r.aggregate_id.ends_with('7') {
                "Broker said NO: 422 (100%_sure)".into()
            } else {
                "timed out".into()
            },
        })
        .collect();
    store.complete(&m, &outcomes).await.unwrap();
    let every: Vec<FailedMessage> = store.failed(1000).await.unwrap();
    assert_eq!(every.len(), 30);

    let cases = [
        (filter(None, None, None), 30),
        (filter(Some("k-7"), None, None), 1),
        (filter(Some("K-7"), None, None), 0),
        (filter(Some("k-"), None, None), 0),
        (filter(None, Some("ORDER/ORDER.PL"), None), 20),
        (filter(None, Some("placed"), None), 20),
        (filter(None, Some("pay/"), None), 10),
        (filter(None, Some("%"), None), 0),
        (filter(None, Some("_"), None), 0),
        (filter(None, None, Some("no: 4")), 3),
        (filter(None, None, Some("100%_SURE")), 3),
        (filter(None, None, Some("%")), 3),
        (filter(None, Some("order"), Some("said no")), 2),
        (filter(Some("k-27"), Some("pay"), Some("422")), 1),
    ];
    for (f, want) in cases {
        let expected: Vec<i64> = every
            .iter()
            .filter(|m| f.matches(m))
            .map(|m| m.seq)
            .collect();
        assert_eq!(expected.len(), want, "the rule itself, for {f:?}");
        let (total, seqs) = all_pages(&store, &f, 4).await;
        assert_eq!(total, want as i64, "count for {f:?}");
        assert_eq!(seqs, expected, "pages for {f:?}, oldest first");
    }
    let first = store
        .failed_matching(&FailedFilter::default(), None, 0)
        .await
        .unwrap();
    assert_eq!(
        (first.total, first.messages.len()),
        (30, 0),
        "an empty page still counts"
    );
}

/// `waiting` counts the pending messages held back: a head waiting for its retry, and every
/// later message of a key whose head is retrying or failed; the other pending messages flow.
pub async fn waiting_counts_the_messages_held_behind_retrying_or_failed_heads(
    store: Arc<dyn Store>,
) {
    let msg =
        |key: &str, n: u32| NewMessage::new("order", key, "placed", serde_json::json!({ "n": n }));
    let batch = [
        msg("failing", 0),
        msg("failing", 1),
        msg("failing", 2),
        msg("retrying", 0),
        msg("retrying", 1),
        msg("free", 0),
    ];
    store.insert(&batch).await.unwrap();
    let idle = store.stats().await.unwrap();
    assert_eq!((idle.pending, idle.waiting), (6, 0));
    assert_eq!(idle.oldest_waiting_age_seconds, None);
    let (m, parts) = sole_member(&store).await;
    let got = claim_all(&store, &m, &parts).await;
    let head = |key: &str| {
        got.iter()
            .filter(|r| r.aggregate_id == key)
            .map(|r| r.seq)
            .min()
            .unwrap()
    };
    store
        .complete(
            &m,
            &[
                Outcome::Failed {
                    seq: head("failing"),
                    error: "rejected".into(),
                },
                Outcome::Retry {
                    seq: head("retrying"),
                    error: "timed out".into(),
                    delay: Duration::from_secs(60),
                },
            ],
        )
        .await
        .unwrap();
    let s = store.stats().await.unwrap();
    assert_eq!(
        (s.failed, s.pending, s.waiting),
        (1, 5, 4),
        "two behind the failed head, the retrying head and one behind it; `free` flows: {s:?}"
    );
    assert!(
        s.oldest_waiting_age_seconds.is_some_and(|a| a >= 0.0),
        "{s:?}"
    );
}
