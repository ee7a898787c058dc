//! The writer and migration suite: what the transactional writer and `migrate` must do on every
//! database, written once over [`WriterBackend`] and run per backend. A backend's
//! `tests/writer.rs` implements [`WriterBackend`] and expands
//! [`writer_suite!`](crate::writer_suite), and gets one `#[tokio::test]` per case.
//!
//! The cases: commit and rollback, same-key commit order, the raw four-column insert other
//! languages run, `migrate` idempotent and racing, and a dropped call leaving no transaction
//! open. What only one database does (positions, SQL-minted ids, one writer at a time) stays in
//! that backend's tests. New writer or migration behaviour goes here.

// Test code: a failed expectation should panic with its message.
#![allow(clippy::unwrap_used)]

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use outbox_core::{NewMessage, Store};
use uuid::Uuid;

use crate::conformance::{claim_all, sole_member};

/// One database as the suite drives it: a fresh, migrated, empty outbox, its transactions, the
/// writer, and its migrations.
///
/// A plain `async fn` trait rather than `#[async_trait]`: the migrations' futures are not all
/// `Send` (nor need to be), while what the cases run in tasks of their own (a transaction and
/// its writes) says `Send` in its signature.
#[allow(async_fn_in_trait)] // Implemented by the backends' tests only, which see the bounds.
pub trait WriterBackend: Send + Sync + Sized + 'static {
    /// A transaction of the database.
    type Tx: Send + 'static;

    /// Every migration version, in order: what migrating a fresh outbox applies.
    fn versions() -> Vec<i32>;

    /// A fresh, migrated, empty outbox of its own.
    async fn start() -> Self;

    /// Removes the outbox (its schema, database or file).
    async fn teardown(self);

    /// Begins a transaction the way the backend's applications do.
    fn begin(&self) -> impl Future<Output = Self::Tx> + Send;

    /// The writer's `enqueue` inside `tx`.
    fn enqueue(
        &self,
        tx: &mut Self::Tx,
        message: &NewMessage,
    ) -> impl Future<Output = outbox_core::Result<Uuid>> + Send;

    /// Commits `tx`.
    fn commit(tx: Self::Tx) -> impl Future<Output = ()> + Send;

    /// Rolls `tx` back.
    fn rollback(tx: Self::Tx) -> impl Future<Output = ()> + Send;

    /// Every row's id, in the order a relay reads one key's rows (by sequence or position).
    async fn ids(&self) -> Vec<Uuid>;

    /// Runs `sql` outside a transaction, `{schema}.` naming the outbox's schema (or nothing,
    /// where the database has none).
    async fn execute(&self, sql: &str);

    /// A store over this outbox.
    fn store(&self) -> Arc<dyn Store>;

    /// Migrates this outbox again: the versions applied.
    async fn migrate(&self) -> Vec<i32>;

    /// Two migrators at once on a fresh outbox (another name, or another file), each with its
    /// own connections: the versions each applied. Removes that outbox afterwards.
    async fn migrate_racing(&self) -> (Vec<i32>, Vec<i32>);
}

/// Expands to one `#[tokio::test]` per writer case, each on a fresh `$backend` (a
/// [`WriterBackend`]) torn down after the case; in a module `$name` when given one.
#[macro_export]
macro_rules! writer_suite {
    ($name:ident, $backend:ty) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            $crate::writer_suite!($backend);
        }
    };
    ($backend:ty) => {
        $crate::__writer_cases!($backend;
            a_rolled_back_enqueue_leaves_no_row_and_a_committed_one_stays
            same_key_transactions_get_sequences_in_commit_order
            the_plain_four_column_insert_of_another_language_is_relayed
            migrate_applies_nothing_the_second_time
            migrators_racing_on_a_fresh_outbox_apply_each_version_once
            a_dropped_call_leaves_no_transaction_open
        );
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __writer_cases {
    ($backend:ty; $($case:ident)*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                $crate::init_test_log();
                let b = ::std::sync::Arc::new(
                    <$backend as $crate::writer_suite::WriterBackend>::start().await,
                );
                $crate::writer_suite::$case(b.clone()).await;
                // Tasks of a case hold clones only while it runs.
                if let Ok(b) = ::std::sync::Arc::try_unwrap(b) {
                    $crate::writer_suite::WriterBackend::teardown(b).await;
                }
            }
        )*
    };
}

fn message(key: &str, n: u32) -> NewMessage {
    NewMessage::new("acct", key, "debited", serde_json::json!({ "n": n }))
}

/// A rolled-back transaction's message does not exist; a committed one's does.
pub async fn a_rolled_back_enqueue_leaves_no_row_and_a_committed_one_stays<B: WriterBackend>(
    b: Arc<B>,
) {
    let mut tx = b.begin().await;
    b.enqueue(&mut tx, &message("1", 1)).await.unwrap();
    B::rollback(tx).await;
    let mut tx = b.begin().await;
    let id = b.enqueue(&mut tx, &message("2", 2)).await.unwrap();
    B::commit(tx).await;
    assert_eq!(b.ids().await, vec![id]);
}

/// Two transactions writing the same key, built so that insert order and commit order would
/// differ: the first inserts (and would draw the smaller sequence), then the second inserts and
/// commits while the first is still open, and only then the first commits. The second's insert
/// must wait for the first's commit: the first raises a flag just before it commits, and the
/// second's insert must return only after that (without the wait it returns at once, and the
/// second commits first holding the larger sequence, so read order would not be commit order).
pub async fn same_key_transactions_get_sequences_in_commit_order<B: WriterBackend>(b: Arc<B>) {
    let first = message("k", 1);
    let second = message("k", 2);
    let committing = Arc::new(AtomicBool::new(false));
    let mut t1 = b.begin().await;
    b.enqueue(&mut t1, &first).await.unwrap();
    let t2 = {
        let (b, second, committing) = (b.clone(), second.clone(), committing.clone());
        tokio::spawn(async move {
            let mut t2 = b.begin().await;
            b.enqueue(&mut t2, &second).await.unwrap();
            let waited = committing.load(Ordering::SeqCst);
            B::commit(t2).await;
            waited
        })
    };
    // Room for the second transaction to go first, if anything let it.
    tokio::time::sleep(Duration::from_millis(300)).await;
    committing.store(true, Ordering::SeqCst);
    B::commit(t1).await;
    assert!(
        t2.await.unwrap(),
        "the second writer of a key waits for the first to commit"
    );
    assert_eq!(
        b.ids().await,
        vec![first.id, second.id],
        "read order must be commit order"
    );
}

/// The minimal insert any language can run (the four columns, nothing else) gets an id and a
/// partition from the database, and the relay claims it, payload as written.
pub async fn the_plain_four_column_insert_of_another_language_is_relayed<B: WriterBackend>(
    b: Arc<B>,
) {
    b.execute(
        "INSERT INTO {schema}.outbox (aggregate_type, aggregate_id, event_type, payload) \
         VALUES ('order', 'raw-1', 'order.placed', '{\"n\": 1}')",
    )
    .await;
    let ids = b.ids().await;
    assert_eq!(ids.len(), 1);
    assert!(!ids[0].is_nil());
    let store = b.store();
    let (m, parts) = sole_member(&store).await;
    let got = claim_all(&store, &m, &parts).await;
    assert_eq!(got.len(), 1, "the relay sees the raw row");
    assert_eq!(got[0].id, ids[0]);
    assert_eq!(
        (
            got[0].aggregate_type.as_str(),
            got[0].aggregate_id.as_str(),
            got[0].event_type.as_str()
        ),
        ("order", "raw-1", "order.placed")
    );
    let payload: serde_json::Value = serde_json::from_slice(&got[0].payload).unwrap();
    assert_eq!(payload, serde_json::json!({ "n": 1 }));
}

/// Migrating a migrated outbox applies nothing, however often, even two migrators at once.
pub async fn migrate_applies_nothing_the_second_time<B: WriterBackend>(b: Arc<B>) {
    assert!(b.migrate().await.is_empty());
    assert!(b.migrate().await.is_empty());
    let (x, y) = tokio::join!(b.migrate(), b.migrate());
    assert_eq!((x, y), (Vec::new(), Vec::new()), "already applied");
    // The outbox still works.
    let mut tx = b.begin().await;
    let id = b.enqueue(&mut tx, &message("k", 1)).await.unwrap();
    B::commit(tx).await;
    assert_eq!(b.ids().await, vec![id]);
}

/// Two migrators on a fresh outbox at once: one applies every version, the other waits for it
/// and finds nothing to do.
pub async fn migrators_racing_on_a_fresh_outbox_apply_each_version_once<B: WriterBackend>(
    b: Arc<B>,
) {
    let (x, y) = b.migrate_racing().await;
    let mut applied = [x, y];
    applied.sort();
    assert_eq!(applied, [Vec::new(), B::versions()]);
}

/// A transaction dropped without commit or rollback, and one dropped while its `enqueue` was
/// still running (a cancelled request, a timeout), leave no row and hold nothing: the next
/// writer of the same key goes through at once.
pub async fn a_dropped_call_leaves_no_transaction_open<B: WriterBackend>(b: Arc<B>) {
    let mut tx = b.begin().await;
    b.enqueue(&mut tx, &message("k", 1)).await.unwrap();
    drop(tx);
    let mut tx = b.begin().await;
    // Polled once (its statement sent, or about to be), then dropped with its transaction.
    let _ = tokio::time::timeout(Duration::ZERO, b.enqueue(&mut tx, &message("k", 2))).await;
    drop(tx);
    let next = message("k", 3);
    tokio::time::timeout(Duration::from_secs(10), async {
        let mut tx = b.begin().await;
        b.enqueue(&mut tx, &next).await.unwrap();
        B::commit(tx).await;
    })
    .await
    .expect("a dropped transaction must not hold its key");
    assert_eq!(b.ids().await, vec![next.id]);
}
