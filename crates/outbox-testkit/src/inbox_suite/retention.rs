//! Inbox backend case about retention: claimed rows, claims and keys past it are deleted, and
//! nothing else.

// Test code: a failed expectation should panic with its message.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use outbox_inbox::InboxMessage;
use uuid::Uuid;

use super::{apply, deliver, ingest, run, InboxBackend};

/// Retention: an inbox row goes once it is older than the retention *and* some consumer claimed
/// it; a claim and an idempotency key go by age alone; nothing younger goes. Times are set with
/// one literal every backend reads as a time.
pub async fn retention_deletes_claimed_rows_claims_and_keys_past_it_and_nothing_else<
    B: InboxBackend,
>(
    b: Arc<B>,
) {
    let b = b.as_ref();
    let msgs: Vec<InboxMessage> = (0..3)
        .map(|i| {
            InboxMessage::new(
                Uuid::now_v7(),
                "src",
                "t",
                "k",
                serde_json::json!({ "i": i }),
            )
        })
        .collect();
    ingest(b, &msgs).await;
    let (old_claimed, new_claimed, old_unclaimed) = (msgs[0].id, msgs[1].id, msgs[2].id);
    assert!(deliver(b, "billing", old_claimed).await);
    assert!(deliver(b, "billing", new_claimed).await);
    apply(
        b,
        "INSERT INTO {schema}.idempotency_keys (key, fingerprint, result) VALUES ('old', 'f', '{}')",
        &[],
    )
    .await;
    apply(
        b,
        "INSERT INTO {schema}.idempotency_keys (key, fingerprint, result) VALUES ('new', 'f', '{}')",
        &[],
    )
    .await;
    let old = "'2000-01-01T00:00:00.000Z'";
    run(
        b,
        &format!(
            "UPDATE {{schema}}.inbox_messages SET received_at = {old} WHERE id IN ('{old_claimed}', '{old_unclaimed}');
             UPDATE {{schema}}.processed_messages SET processed_at = {old} WHERE message_id = '{old_claimed}';
             UPDATE {{schema}}.idempotency_keys SET created_at = {old} WHERE key = 'old'"
        ),
    )
    .await;

    let db = b.database();
    let purged = db.purge(Duration::from_secs(3600)).await.unwrap();
    assert_eq!(
        (
            purged.inbox_messages,
            purged.processed_messages,
            purged.idempotency_keys
        ),
        (1, 1, 1),
        "{purged:?}"
    );
    let ids = |rows: Vec<Vec<Option<String>>>| {
        let mut ids: Vec<String> = rows.into_iter().map(|r| r[0].clone().unwrap()).collect();
        ids.sort();
        ids
    };
    let mut kept = vec![new_claimed.to_string(), old_unclaimed.to_string()];
    kept.sort();
    assert_eq!(
        ids(b
            .texts("SELECT CAST(id AS TEXT) FROM {schema}.inbox_messages")
            .await),
        kept,
        "an unclaimed row stays whatever its age; a young one stays"
    );
    assert_eq!(
        ids(b
            .texts("SELECT CAST(message_id AS TEXT) FROM {schema}.processed_messages")
            .await),
        vec![new_claimed.to_string()]
    );
    assert_eq!(
        ids(b.texts("SELECT key FROM {schema}.idempotency_keys").await),
        vec!["new".to_string()]
    );
    let again = db.purge(Duration::from_secs(3600)).await.unwrap();
    assert_eq!(again.total(), 0, "{again:?}");
    db.check().await.unwrap();
}
