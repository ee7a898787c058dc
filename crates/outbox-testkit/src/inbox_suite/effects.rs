//! Inbox backend cases about effects that are idempotent by their own shape: an upsert by business
//! key, a conditional transition, and a ledger entry keyed by the message id.

// Test code: a failed expectation should panic with its message.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use uuid::Uuid;

use super::{apply, run, InboxBackend};

/// Layer 2, shape 1: an upsert by business key that sets a state (the event carries the
/// state, not a delta) leaves the same state however often it is applied, and an older event
/// delivered late does not roll it back.
pub async fn an_upsert_by_business_key_sets_the_same_state_however_often_it_is_applied<
    B: InboxBackend,
>(
    b: Arc<B>,
) {
    run(
        b.as_ref(),
        "CREATE TABLE {schema}.accounts (account_id TEXT PRIMARY KEY, balance BIGINT NOT NULL, \
         as_of BIGINT NOT NULL)",
    )
    .await;
    let upsert = B::UPSERT_IF_NEWER;
    let at = chrono::Utc::now().timestamp_millis();
    for _ in 0..3 {
        apply(b.as_ref(), upsert, &["acc-1".into(), 250.into(), at.into()]).await;
    }
    let late = apply(
        b.as_ref(),
        upsert,
        &["acc-1".into(), 100.into(), (at - 60_000).into()],
    )
    .await;
    assert_eq!(
        late,
        B::UPSERT_UNCHANGED_ROWS,
        "an older event changes nothing"
    );
    assert_eq!(b.scalar("SELECT count(*) FROM {schema}.accounts").await, 1);
    assert_eq!(b.scalar("SELECT balance FROM {schema}.accounts").await, 250);
}

/// Layer 2, shape 2: a conditional transition moves only from the expected state, so a
/// repeat matches no row and changes nothing.
pub async fn a_conditional_transition_moves_only_from_the_expected_state<B: InboxBackend>(
    b: Arc<B>,
) {
    run(
        b.as_ref(),
        "CREATE TABLE {schema}.orders (id TEXT PRIMARY KEY, status TEXT NOT NULL, \
         paid_count BIGINT NOT NULL DEFAULT 0); \
         INSERT INTO {schema}.orders (id, status) VALUES ('o-1', 'PENDING')",
    )
    .await;
    let pay = "UPDATE {schema}.orders SET status = 'PAID', paid_count = paid_count + 1 \
               WHERE id = $1 AND status = 'PENDING'";
    let mut moved = Vec::new();
    for _ in 0..3 {
        moved.push(apply(b.as_ref(), pay, &["o-1".into()]).await);
    }
    assert_eq!(moved, vec![1, 0, 0], "a repeat matches no row");
    let row = b
        .texts("SELECT status, CAST(paid_count AS TEXT) FROM {schema}.orders")
        .await;
    assert_eq!(
        row[0],
        vec![Some("PAID".to_string()), Some("1".to_string())]
    );
}

/// Layer 2, shape 3: a ledger entry keyed by the message id, inserted in a savepoint of the
/// business transaction, is rejected as a duplicate (`effects::is_duplicate`) on the second
/// and third delivery, and the transaction stays usable. For contrast, an increment applied
/// three times adds three times: it needs layer 1.
pub async fn a_ledger_entry_keyed_by_the_message_id_is_rejected_as_a_duplicate<B: InboxBackend>(
    b: Arc<B>,
) {
    run(
        b.as_ref(),
        "CREATE TABLE {schema}.ledger (message_id TEXT PRIMARY KEY, account TEXT NOT NULL, \
         cents BIGINT NOT NULL); \
         CREATE TABLE {schema}.balances (account TEXT PRIMARY KEY, cents BIGINT NOT NULL); \
         INSERT INTO {schema}.balances VALUES ('acc-1', 0)",
    )
    .await;
    let id = Uuid::now_v7();
    let insert =
        b.sql("INSERT INTO {schema}.ledger (message_id, account, cents) VALUES ($1, 'acc-1', 500)");
    let mut applied = Vec::new();
    for _ in 0..3 {
        let mut tx = b.begin().await;
        B::execute(&mut tx, "SAVEPOINT ledger", &[]).await.unwrap();
        match B::execute(&mut tx, &insert, &[id.into()]).await {
            Ok(_) => applied.push(true),
            Err(e) if outbox_inbox::effects::is_duplicate(&e) => {
                B::execute(&mut tx, "ROLLBACK TO SAVEPOINT ledger", &[])
                    .await
                    .unwrap();
                applied.push(false);
            }
            Err(e) => panic!("{e}"),
        }
        B::execute(&mut tx, "RELEASE SAVEPOINT ledger", &[])
            .await
            .unwrap();
        B::finish(tx, true).await;
    }
    assert_eq!(applied, vec![true, false, false]);
    assert_eq!(
        b.scalar("SELECT CAST(sum(cents) AS BIGINT) FROM {schema}.ledger")
            .await,
        500
    );
    for _ in 0..3 {
        apply(
            b.as_ref(),
            "UPDATE {schema}.balances SET cents = cents + 500 WHERE account = 'acc-1'",
            &[],
        )
        .await;
    }
    assert_eq!(
        b.scalar("SELECT cents FROM {schema}.balances").await,
        1500,
        "an increment is not idempotent: it needs layer 1"
    );
}
