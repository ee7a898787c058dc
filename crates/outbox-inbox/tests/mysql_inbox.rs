//! The inbox on MariaDB where InnoDB differs from PostgreSQL.
//!
//! - **Ingest**: MySQL has no `INSERT … RETURNING`, so ingest reads which ids exist, inserts
//!   the rest, and answers a duplicate-key error (another transaction inserted one of them
//!   meanwhile) by reading again with a locking read. These cases force that race: two
//!   transactions ingesting the same id, the second while the first is open (it commits, or
//!   rolls back), and a REPEATABLE READ snapshot that cannot see a row committed after it
//!   began. Each message must be recorded and queued exactly once, and each ingest must say
//!   truly whether it inserted it.
//! - **Idempotency keys**: a request in progress is a locked row. Several requests waiting on
//!   one key all replay (none deadlocks upgrading a lock), two new keys under REPEATABLE READ
//!   both store (no gap lock between them), and a wait past `innodb_lock_wait_timeout` is told
//!   "in progress".
//! - Too long a name is refused, not cut; a key ending in a space (which the collation
//!   ignores) is refused; the state view shows a message once even when it was queued twice.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use outbox_core::ErrorKind;
use outbox_inbox::{IdempotencyError, Idempotent, Inbox, InboxMessage, Response};
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

/// A session of its own (not the pool's, which stay READ COMMITTED) at REPEATABLE READ, MySQL's
/// default and a plain application pool's, waiting `lock_wait_secs` for a row lock.
async fn repeatable_read(lock_wait_secs: u32) -> sqlx::MySqlConnection {
    use sqlx::Connection as _;
    let mut conn = sqlx::MySqlConnection::connect(&outbox_testkit::inbox_backends::mysql_url())
        .await
        .unwrap();
    sqlx::raw_sql(&format!(
        "SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ; \
         SET SESSION innodb_lock_wait_timeout = {lock_wait_secs}"
    ))
    .execute(&mut conn)
    .await
    .unwrap();
    conn
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
    let mut old = repeatable_read(5).await;
    let mut rr = sqlx::Connection::begin(&mut old).await.unwrap();
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
    drop(old);
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

/// A request under idempotency key `key` in a transaction of its own that sleeps `hold` before
/// it commits; counts its runs.
async fn request(
    b: &MysqlInbox,
    key: &str,
    cents: i64,
    hold: Duration,
    runs: Arc<AtomicU32>,
) -> Result<Idempotent<i64>, IdempotencyError<String>> {
    let mut tx = b.begin().await;
    let done = Inbox::new(b.schema.clone())
        .idempotent(&mut tx, key, "f", move |_tx| {
            Box::pin(async move {
                runs.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(hold).await;
                Ok::<_, String>(Response::new(cents))
            })
        })
        .await;
    match &done {
        Ok(_) => tx.commit().await.unwrap(),
        Err(_) => tx.rollback().await.unwrap(),
    }
    done
}

/// Three requests under one new key at once, then two repeats at once: one runs, the others
/// wait and replay its result. (With the key row taken by `INSERT IGNORE` and then `FOR
/// UPDATE`, the waiters each held a shared lock and one died in a deadlock.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_waiting_on_one_key_all_replay_without_a_deadlock() {
    let b = Arc::new(MysqlInbox::start_inbox().await);
    let runs = Arc::new(AtomicU32::new(0));
    for round in 0..2 {
        let tasks: Vec<_> = (0..3)
            .map(|i| {
                let (b, runs) = (b.clone(), runs.clone());
                tokio::spawn(async move {
                    request(&b, "req-1", 100 + i, Duration::from_millis(300), runs).await
                })
            })
            .collect();
        let mut results = Vec::new();
        for t in tasks {
            results.push(t.await.unwrap().unwrap());
        }
        let first = results.iter().find(|r| !r.replayed).map(|r| r.result);
        let ran = results.iter().filter(|r| !r.replayed).count();
        assert_eq!(ran, usize::from(round == 0), "round {round}: {results:?}");
        let cents = first.unwrap_or(results[0].result);
        assert!(
            results.iter().all(|r| r.result == cents),
            "every request answers the first's result: {results:?}"
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    Arc::try_unwrap(b).ok().unwrap().teardown().await;
}

/// Two requests under two new keys, both in progress at once under REPEATABLE READ, both
/// store their results and commit: neither locks a gap the other inserts into. (A locking read
/// of each key's missing result row locked the same gap, and the two inserts deadlocked.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_new_keys_under_repeatable_read_both_store() {
    let b = MysqlInbox::start_inbox().await;
    // Both take their keys and read, then both store.
    let mut a = repeatable_read(3).await;
    let mut c = repeatable_read(3).await;
    let mut ta = sqlx::Connection::begin(&mut a).await.unwrap();
    let mut tc = sqlx::Connection::begin(&mut c).await.unwrap();
    use outbox_inbox::{InboxTx, StoredKey};
    for (tx, key) in [(&mut ta, "req-c"), (&mut tc, "req-d")] {
        assert!(tx.lock_key(&b.schema, key).await.unwrap());
        assert_eq!(tx.stored_key(&b.schema, key).await.unwrap(), None);
    }
    let stored = StoredKey {
        fingerprint: "f".into(),
        result: serde_json::json!(1),
        events: Vec::new(),
    };
    ta.store_key(&b.schema, "req-c", &stored).await.unwrap();
    tc.store_key(&b.schema, "req-d", &stored).await.unwrap();
    ta.commit().await.unwrap();
    tc.commit().await.unwrap();
    drop((a, c));
    assert_eq!(
        b.scalar("SELECT count(*) FROM {schema}.idempotency_keys")
            .await,
        2
    );
    b.teardown().await;
}

/// A request that waits for another under its key longer than `innodb_lock_wait_timeout` is
/// told "in progress", as PostgreSQL tells it at once, and runs nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_waiting_past_the_lock_timeout_is_told_in_progress() {
    let b = Arc::new(MysqlInbox::start_inbox().await);
    let runs = Arc::new(AtomicU32::new(0));
    let first = {
        let (b, runs) = (b.clone(), runs.clone());
        tokio::spawn(async move { request(&b, "req-1", 1, Duration::from_secs(4), runs).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut conn = b.pool.acquire().await.unwrap();
    sqlx::raw_sql("SET SESSION innodb_lock_wait_timeout = 1")
        .execute(&mut *conn)
        .await
        .unwrap();
    let mut tx = sqlx::Connection::begin(&mut *conn).await.unwrap();
    let second = Inbox::new(b.schema.clone())
        .idempotent(&mut tx, "req-1", "f", |_tx| {
            Box::pin(async { Ok::<_, String>(Response::new(2_i64)) })
        })
        .await;
    tx.rollback().await.unwrap();
    drop(conn);
    assert!(
        matches!(second, Err(IdempotencyError::InProgress { .. })),
        "{second:?}"
    );
    assert!(!first.await.unwrap().unwrap().replayed);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    Arc::try_unwrap(b).ok().unwrap().teardown().await;
}

/// MySQL's collation ignores trailing spaces, so `"billing "` would share `"billing"`'s claims
/// and `"req "` its key: both are refused, naming the cause.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_ending_in_a_space_are_refused() {
    let b = MysqlInbox::start_inbox().await;
    let mut tx = b.begin().await;
    let e = outbox_inbox::claim(&mut tx, "billing ", Uuid::now_v7())
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Malformed);
    assert!(e.to_string().contains("ends in a space"), "{e}");
    let e = Inbox::new(b.schema.clone())
        .idempotent(&mut tx, "req ", "f", |_tx| {
            Box::pin(async { Ok::<_, String>(Response::new(1_i64)) })
        })
        .await
        .unwrap_err();
    assert!(e.to_string().contains("ends in a space"), "{e}");
    tx.rollback().await.unwrap();
    b.teardown().await;
}

/// A message queued twice (redelivered after the inbox's retention deleted its row, while the
/// first copy's range is still kept) shows once in `inbox_message_states`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_state_view_shows_a_message_queued_twice_once() {
    let b = MysqlInbox::start_inbox().await;
    let inbox = Inbox::new(b.schema.clone());
    let m = message("k");
    let mut tx = b.begin().await;
    assert!(inbox.ingest(&mut tx, &m).await.unwrap());
    tx.commit().await.unwrap();
    // Retention took the inbox row; the broker delivers the message again.
    let mut tx = b.begin().await;
    sqlx::query(&b.sql(&format!(
        "DELETE FROM {{schema}}.inbox_messages WHERE id = '{}'",
        m.id
    )))
    .execute(&mut *tx)
    .await
    .unwrap();
    assert!(inbox.ingest(&mut tx, &m).await.unwrap());
    tx.commit().await.unwrap();
    assert_eq!(copies(&b, m.id).await, (1, 2));
    assert_eq!(
        b.scalar(&format!(
            "SELECT count(*) FROM {{schema}}.inbox_message_states WHERE id = '{}'",
            m.id
        ))
        .await,
        1
    );
    b.teardown().await;
}

/// Retention deletes a key's lock row only after the key itself: an old key goes with its lock
/// row, a lock row whose key is still kept stays (its `stored` flag must not point at nothing),
/// and a young lock row stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_deletes_a_keys_lock_row_after_the_key() {
    let b = MysqlInbox::start_inbox().await;
    let runs = Arc::new(AtomicU32::new(0));
    for key in ["old", "lock-only-old", "young"] {
        request(&b, key, 1, Duration::ZERO, runs.clone())
            .await
            .unwrap();
    }
    let mut tx = b.begin().await;
    sqlx::raw_sql(&b.sql(
        "UPDATE {schema}.idempotency_keys SET created_at = '2000-01-01' WHERE key = 'old';
         UPDATE {schema}.idempotency_key_locks SET created_at = '2000-01-01'
         WHERE key IN ('old', 'lock-only-old')",
    ))
    .execute(&mut *tx)
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let purged = b.database().purge(Duration::from_secs(3600)).await.unwrap();
    assert_eq!(purged.idempotency_keys, 1, "{purged:?}");
    let left = "SELECT CAST(key AS TEXT) FROM {schema}.TABLE ORDER BY key";
    let some = |k: &str| vec![Some(k.to_string())];
    assert_eq!(
        b.texts(&left.replace("TABLE", "idempotency_keys")).await,
        vec![some("lock-only-old"), some("young")]
    );
    assert_eq!(
        b.texts(&left.replace("TABLE", "idempotency_key_locks"))
            .await,
        vec![some("lock-only-old"), some("young")],
        "the old key's lock row went after it; the others stay"
    );
    // The kept key still replays.
    let again = request(&b, "lock-only-old", 2, Duration::ZERO, runs.clone())
        .await
        .unwrap();
    assert!(again.replayed);
    assert_eq!(runs.load(Ordering::SeqCst), 3);
    b.teardown().await;
}
