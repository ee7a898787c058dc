//! Store conformance cases about what the store reports: stats, each member's circuit state,
//! and gauges that agree with the stats.

// Test code: a failed expectation should panic with its message.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use outbox_core::{Outcome, Store};

use super::{claim_all, msg, sole_member};

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
