//! Ingest on MariaDB where InnoDB differs from PostgreSQL: MySQL has no `INSERT … RETURNING`,
//! so ingest reads which ids exist, inserts the rest, and answers a duplicate-key error (another
//! transaction inserted one of them meanwhile) by reading again with a locking read. These
//! cases force that race: two transactions ingesting the same id, the second while the first
//! is open (it commits, or rolls back), and a REPEATABLE READ snapshot that cannot see a row
//! committed after it began. Each message must be recorded and queued exactly once, and each
//! ingest must say truly whether it inserted it. Too long a key is refused, not cut.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use outbox_core::ErrorKind;
use outbox_inbox::{Inbox, InboxMessage};
use outbox_testkit::inbox_backends::MysqlInbox;
use outbox_testkit::inbox_suite::InboxBackend;
use uuid::Uuid;

fn message(key: &str) -> InboxMessage {
    InboxMessage::new(
        Uuid::now_v7(),
        "test",
        "order.paid",
        key,
        serde_json::json!({}),
    )
}

/// (inbox rows, queue rows) of message `id`.
async fn copies(b: &MysqlInbox, id: Uuid) -> (i64, i64) {
    let inbox = b
        .scalar(&format!(
            "SELECT count(*) FROM {{schema}}.inbox_messages WHERE id = '{id}'"
        ))
        .await;
    let queued = b
        .scalar(&format!("SELECT count(*) FROM {{queue}} WHERE id = '{id}'"))
        .await;
    (inbox, queued)
}

/// A second ingest of `[shared, own]` while the first, holding `shared`, is still open: it
/// waits for the first to end, then records `own` and, if the first committed, not `shared`.
async fn racing_ingest(first_commits: bool) {
    let b = MysqlInbox::start_inbox().await;
    let inbox = Inbox::new(b.schema.clone());
    let (shared, first_own, second_own) = (message("k"), message("k"), message("j"));
    let mut first = b.begin().await;
    assert_eq!(
        inbox
            .ingest_many(&mut first, &[shared.clone(), first_own.clone()])
            .await
            .unwrap(),
        vec![true, true]
    );
    let second = {
        let (pool, schema) = (b.pool.clone(), b.schema.clone());
        let batch = vec![shared.clone(), second_own.clone()];
        tokio::spawn(async move {
            let mut tx = pool.begin().await.unwrap();
            let flags = Inbox::new(schema)
                .ingest_many(&mut tx, &batch)
                .await
                .unwrap();
            tx.commit().await.unwrap();
            flags
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!second.is_finished(), "the second waits for the first");
    if first_commits {
        first.commit().await.unwrap();
    } else {
        first.rollback().await.unwrap();
    }
    let flags = tokio::time::timeout(Duration::from_secs(60), second)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(flags, vec![!first_commits, true]);
    assert_eq!(copies(&b, shared.id).await, (1, 1));
    assert_eq!(copies(&b, second_own.id).await, (1, 1));
    let first_own_kept = i64::from(first_commits);
    assert_eq!(
        copies(&b, first_own.id).await,
        (first_own_kept, first_own_kept)
    );
    b.teardown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_id_another_transaction_is_ingesting_is_recorded_once_when_it_commits() {
    racing_ingest(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_id_another_transaction_was_ingesting_is_recorded_when_it_rolls_back() {
    racing_ingest(false).await;
}

/// A REPEATABLE READ transaction whose snapshot predates the commit of a message ingests it
/// again: its plain read does not see the row, the insert hits the key, the locking read does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_older_than_the_row_still_sees_it_is_there() {
    let b = MysqlInbox::start_inbox().await;
    let inbox = Inbox::new(b.schema.clone());
    let m = message("k");
    let mut tx = b.begin().await;
    assert!(inbox.ingest(&mut tx, &m).await.unwrap());
    tx.commit().await.unwrap();
    let mut old = b.pool.acquire().await.unwrap();
    sqlx::raw_sql(
        "SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ; \
         SET SESSION innodb_lock_wait_timeout = 5",
    )
    .execute(&mut *old)
    .await
    .unwrap();
    let mut rr = sqlx::Connection::begin(&mut *old).await.unwrap();
    // Take the snapshot, then let another transaction commit a second message.
    let before: i64 = sqlx::query_scalar(&b.sql("SELECT count(*) FROM {schema}.inbox_messages"))
        .fetch_one(&mut *rr)
        .await
        .unwrap();
    assert_eq!(before, 1);
    let late = message("k");
    let mut tx = b.begin().await;
    assert!(inbox.ingest(&mut tx, &late).await.unwrap());
    tx.commit().await.unwrap();
    assert_eq!(
        inbox
            .ingest_many(&mut rr, &[late.clone(), m.clone()])
            .await
            .unwrap(),
        vec![false, false],
        "both are there, whatever the snapshot says"
    );
    let seen: i64 = sqlx::query_scalar(&b.sql("SELECT count(*) FROM {schema}.inbox_messages"))
        .fetch_one(&mut *rr)
        .await
        .unwrap();
    assert_eq!(seen, 1, "the snapshot predates the late message");
    rr.commit().await.unwrap();
    // The pool's sessions are READ COMMITTED; this one goes back to it that way.
    sqlx::raw_sql("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
        .execute(&mut *old)
        .await
        .unwrap();
    assert_eq!(copies(&b, late.id).await, (1, 1));
    assert_eq!(copies(&b, m.id).await, (1, 1));
    b.teardown().await;
}

/// A key longer than the column is refused as malformed, naming the message, and the batch
/// writes nothing (MySQL would cut it under `IGNORE`, and a key cut short is another key).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_longer_than_the_column_is_refused_not_cut() {
    let b = MysqlInbox::start_inbox().await;
    let inbox = Inbox::new(b.schema.clone());
    let long = message(&"k".repeat(256));
    let mut tx = b.begin().await;
    let e = inbox
        .ingest_many(&mut tx, &[message("k"), long.clone()])
        .await
        .unwrap_err();
    tx.rollback().await.unwrap();
    assert_eq!(e.kind(), ErrorKind::Malformed);
    assert!(e.to_string().contains(&long.id.to_string()), "{e}");
    assert!(e.to_string().contains("256 characters"), "{e}");
    assert_eq!(
        b.scalar("SELECT count(*) FROM {schema}.inbox_messages")
            .await,
        0
    );
    let mut tx = b.begin().await;
    let e = outbox_inbox::claim(&mut tx, &"c".repeat(300), long.id)
        .await
        .unwrap_err();
    tx.rollback().await.unwrap();
    assert_eq!(e.kind(), ErrorKind::Malformed);
    b.teardown().await;
}
