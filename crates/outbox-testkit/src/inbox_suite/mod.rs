//! The inbox backend suite: what the receiving side must do on each database it runs on,
//! written once over [`InboxBackend`] and run per database (PostgreSQL, MySQL, SQLite:
//! [`crate::inbox_backends`]). `crates/outbox-inbox/tests/backends.rs` expands
//! [`inbox_backend_suite!`](crate::inbox_backend_suite) once per backend and gets one
//! `#[tokio::test]` per case.
//!
//! The cases go through the crate's own API: a transaction of the database, the dedupe claim,
//! ingest and idempotency keys through `InboxTx`, effects written in the caller's transaction,
//! and the processor running handlers. They assert outcomes (rows, claims, states), never
//! timings. The cases are in one file per topic (`dedupe`, `handlers`, `effects`,
//! `idempotency`, `retention`), each reached here as `inbox_suite::<case>`; the backend trait
//! and the helpers the cases share are here. New inbox behaviour goes here, not into one
//! database's tests.

// Test code: a failed expectation should panic with its message.
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use outbox_core::{RetryPolicy, Store};
use outbox_inbox::{
    Handler, HandlerError, Handlers, Inbox, InboxMessage, InboxProcessor, InboxTx, ProcessorConfig,
};
use sqlx::Transaction;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

mod dedupe;
mod effects;
mod handlers;
mod idempotency;
mod retention;

pub use dedupe::{
    a_crash_after_the_commit_and_before_the_ack_is_absorbed,
    a_message_delivered_three_times_has_its_effect_once,
    two_consumers_racing_on_one_message_produce_one_effect,
};
pub use effects::{
    a_conditional_transition_moves_only_from_the_expected_state,
    a_ledger_entry_keyed_by_the_message_id_is_rejected_as_a_duplicate,
    an_upsert_by_business_key_sets_the_same_state_however_often_it_is_applied,
};
pub use handlers::{
    a_handler_that_fails_permanently_ends_failed_with_its_error_and_can_be_redriven,
    a_handler_that_fails_transiently_succeeds_later_and_its_key_waits_for_it,
    a_message_whose_handler_already_committed_is_not_handled_again,
    a_message_without_a_handler_fails_visibly_and_a_closure_can_handle_the_rest,
    handlers_apply_each_message_once_in_key_order_whatever_the_grouping,
    ingest_records_each_message_once_and_handlers_apply_it_once_in_key_order,
};
pub use idempotency::{
    a_concurrent_request_under_the_same_key_is_not_run_twice,
    a_repeat_returns_the_stored_result_and_enqueues_nothing,
    a_request_that_fails_or_rolls_back_leaves_no_key_and_runs_again,
};
pub use retention::retention_deletes_claimed_rows_claims_and_keys_past_it_and_nothing_else;

/// Generous limits: the cases wait for outcomes, they do not time them (SQLite's processor,
/// one writer at a time, is slow on a busy machine).
const WAIT: Duration = Duration::from_secs(180);

/// What a second request under an idempotency key gets while the first has not committed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Concurrent {
    /// `IdempotencyError::InProgress` at once, without running (PostgreSQL: an advisory lock
    /// taken without waiting).
    InProgress,
    /// It waits for the first to commit, then replays its result (SQLite: one writing
    /// transaction at a time).
    WaitsThenReplays,
}

/// A statement argument: the suite's tables hold text and integers only, so one statement
/// runs on both databases (`$1`, `$2`, … work on SQLite too).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Arg {
    /// Text (ids as lower-case hyphenated text).
    Text(String),
    /// A 64-bit integer.
    Int(i64),
}

impl From<&str> for Arg {
    fn from(v: &str) -> Self {
        Arg::Text(v.to_string())
    }
}

impl From<String> for Arg {
    fn from(v: String) -> Self {
        Arg::Text(v)
    }
}

impl From<Uuid> for Arg {
    fn from(v: Uuid) -> Self {
        Arg::Text(v.to_string())
    }
}

impl From<i64> for Arg {
    fn from(v: i64) -> Self {
        Arg::Int(v)
    }
}

/// A database the inbox runs on, as the cases need it: a fresh migrated inbox (with the
/// application's outbox and a table `effects (n, message_id, key, value)` beside it), its
/// transactions, statements in either SQL dialect's common part, and its processor.
///
/// SQL given to [`InboxBackend::sql`], [`InboxBackend::scalar`] and [`InboxBackend::texts`]
/// names tables `{schema}.name` (the inbox's schema on PostgreSQL, nothing on SQLite) and the
/// processing queue's table `{queue}`.
#[async_trait]
pub trait InboxBackend: Send + Sync + Sized + 'static {
    /// The sqlx database.
    type Db: sqlx::Database;
    /// Its transaction, `sqlx::Transaction<'static, Self::Db>`, on which the inbox works.
    type Tx: InboxTx + Send + 'static;
    /// The database's name, for messages.
    const NAME: &'static str;
    /// What a concurrent request under an idempotency key in progress gets.
    const CONCURRENT_REQUEST: Concurrent;
    /// Effect shape 1 in this database's SQL: an upsert of `accounts (account_id, balance,
    /// as_of)` from `$1`–`$3` that changes the row only for a newer `as_of`.
    const UPSERT_IF_NEWER: &'static str =
        "INSERT INTO {schema}.accounts (account_id, balance, as_of) VALUES ($1, $2, $3) \
         ON CONFLICT (account_id) DO UPDATE SET balance = EXCLUDED.balance, \
         as_of = EXCLUDED.as_of WHERE {schema}.accounts.as_of <= EXCLUDED.as_of";
    /// The rows that upsert reports when it changes nothing: 0, or 1 on MySQL (sqlx connects
    /// with `CLIENT_FOUND_ROWS`, which counts a row found).
    const UPSERT_UNCHANGED_ROWS: u64 = 0;

    /// A fresh, migrated inbox of the test's own (not `Send`: the migrations' futures are not).
    fn start() -> impl std::future::Future<Output = Self>;
    /// The inbox's tables.
    fn inbox(&self) -> Inbox;
    /// Begins a transaction that will write.
    async fn begin(&self) -> Self::Tx;
    /// Commits `tx`, or rolls it back.
    async fn finish(tx: Self::Tx, commit: bool);
    /// A handler's transaction as [`InboxBackend::Tx`] (the same type).
    fn tx<'a>(tx: &'a mut Transaction<'static, Self::Db>) -> &'a mut Self::Tx;
    /// Runs `sql` (already rendered by [`InboxBackend::sql`]) in `tx`; rows affected.
    async fn execute(tx: &mut Self::Tx, sql: &str, args: &[Arg]) -> Result<u64, sqlx::Error>;
    /// `sql` with `{schema}` and `{queue}` filled in.
    fn sql(&self, sql: &str) -> String;
    /// The one integer `sql` selects.
    async fn scalar(&self, sql: &str) -> i64;
    /// Every row `sql` selects, each column as text (select them `CAST(… AS TEXT)`).
    async fn texts(&self, sql: &str) -> Vec<Vec<Option<String>>>;
    /// The processing queue as an outbox store (`failed`, `redrive`, `stats`).
    fn queue(&self) -> Arc<dyn Store>;
    /// A processor of this inbox.
    fn processor(&self, handlers: Handlers<Self::Db>, config: ProcessorConfig) -> InboxProcessor;
    /// This inbox as the `outbox` commands open it (retention, status).
    fn database(&self) -> outbox_inbox::InboxDatabase;
    /// The flags that point `outbox inbox` at this inbox.
    fn daemon_args(&self) -> Vec<String>;
    /// Removes what [`InboxBackend::start`] made.
    async fn teardown(self);
}

/// Expands to a module `$name` with one `#[tokio::test]` per inbox backend case, each on a
/// fresh `$backend` (an [`InboxBackend`]) torn down after the case.
#[macro_export]
macro_rules! inbox_backend_suite {
    ($name:ident, $backend:ty) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            $crate::__inbox_cases!($backend;
                a_message_delivered_three_times_has_its_effect_once
                two_consumers_racing_on_one_message_produce_one_effect
                a_crash_after_the_commit_and_before_the_ack_is_absorbed
                ingest_records_each_message_once_and_handlers_apply_it_once_in_key_order
                handlers_apply_each_message_once_in_key_order_whatever_the_grouping
                a_handler_that_fails_transiently_succeeds_later_and_its_key_waits_for_it
                a_handler_that_fails_permanently_ends_failed_with_its_error_and_can_be_redriven
                a_message_whose_handler_already_committed_is_not_handled_again
                a_message_without_a_handler_fails_visibly_and_a_closure_can_handle_the_rest
                an_upsert_by_business_key_sets_the_same_state_however_often_it_is_applied
                a_conditional_transition_moves_only_from_the_expected_state
                a_ledger_entry_keyed_by_the_message_id_is_rejected_as_a_duplicate
                a_repeat_returns_the_stored_result_and_enqueues_nothing
                a_request_that_fails_or_rolls_back_leaves_no_key_and_runs_again
                a_concurrent_request_under_the_same_key_is_not_run_twice
                retention_deletes_claimed_rows_claims_and_keys_past_it_and_nothing_else
            );
        }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __inbox_cases {
    ($backend:ty; $($case:ident)*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                $crate::init_test_log();
                let b = ::std::sync::Arc::new(
                    <$backend as $crate::inbox_suite::InboxBackend>::start().await,
                );
                $crate::inbox_suite::$case(b.clone()).await;
                // Tasks of a case hold clones only while it runs.
                if let Ok(b) = ::std::sync::Arc::try_unwrap(b) {
                    $crate::inbox_suite::InboxBackend::teardown(b).await;
                }
            }
        )*
    };
}

/// The statement that writes an effect row: `(message_id, key, value)`.
const EFFECT: &str = "INSERT INTO {schema}.effects (message_id, key, value) VALUES ($1, $2, $3)";

/// `(message_id, key, value)` of every effect, in the order they were applied.
pub async fn effects<B: InboxBackend>(b: &B) -> Vec<(Uuid, String, i64)> {
    b.texts("SELECT message_id, key, CAST(value AS TEXT) FROM {schema}.effects ORDER BY n")
        .await
        .into_iter()
        .map(|r| {
            let text = |i: usize| r[i].clone().unwrap();
            (text(0).parse().unwrap(), text(1), text(2).parse().unwrap())
        })
        .collect()
}

/// Writes the effect of message `id` in `tx`.
async fn effect<B: InboxBackend>(b: &B, tx: &mut B::Tx, id: Uuid) {
    B::execute(tx, &b.sql(EFFECT), &[id.into(), "k".into(), 1.into()])
        .await
        .unwrap();
}

/// One delivery to `consumer`: claim, and apply the effect when the claim is new. Returns the
/// claim's answer.
async fn deliver<B: InboxBackend>(b: &B, consumer: &str, id: Uuid) -> bool {
    let mut tx = b.begin().await;
    let fresh = b.inbox().claim(&mut tx, consumer, id).await.unwrap();
    if fresh {
        effect(b, &mut tx, id).await;
    }
    B::finish(tx, true).await;
    fresh
}

/// How the processor runs in the cases: two members, small batches, a short lease and backoff.
fn processor_config() -> ProcessorConfig {
    ProcessorConfig {
        workers: 2,
        batch_size: 50,
        concurrency: 4,
        lease: Duration::from_secs(3),
        poll_interval: Duration::from_millis(20),
        retry: RetryPolicy {
            max_attempts: 5,
            base: Duration::from_millis(50),
            max: Duration::from_millis(200),
        },
        member_prefix: "test".into(),
        ..ProcessorConfig::default()
    }
}

/// `per_key` messages of type `order.paid` for each of `keys` keys (`key-0`, …), interleaved;
/// message i of a key has payload `{"value": i}`.
pub fn messages(keys: usize, per_key: usize) -> Vec<InboxMessage> {
    (0..per_key)
        .flat_map(|i| {
            (0..keys).map(move |k| {
                InboxMessage::new(
                    Uuid::now_v7(),
                    "test",
                    "order.paid",
                    format!("key-{k}"),
                    serde_json::json!({ "value": i }),
                )
            })
        })
        .collect()
}

/// What a handler is told to do: fail some messages a number of times, or for good.
#[derive(Default)]
pub struct Script {
    /// Transient failures left, per message id.
    pub transient: Mutex<HashMap<Uuid, u32>>,
    /// Messages that fail permanently while `broken` holds.
    pub poison: Mutex<Vec<Uuid>>,
    /// Whether the poison messages fail.
    pub broken: AtomicBool,
    /// Handler calls, all messages.
    pub calls: AtomicU32,
}

impl Script {
    /// The handler's answer for message `id` (its effect is already written).
    fn verdict(&self, id: Uuid) -> Result<(), HandlerError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if let Some(left) = self.transient.lock().unwrap().get_mut(&id) {
            if *left > 0 {
                *left -= 1;
                return Err(HandlerError::transient("the ledger service timed out"));
            }
        }
        if self.broken.load(Ordering::SeqCst) && self.poison.lock().unwrap().contains(&id) {
            return Err(HandlerError::permanent("amount is negative: rejected"));
        }
        Ok(())
    }
}

/// A handler that writes the message's effect through its transaction, then answers as
/// [`Script`] says (so a failure proves the rollback of what it wrote).
pub struct Effects<B> {
    insert: String,
    script: Arc<Script>,
    backend: PhantomData<fn() -> B>,
}

impl<B: InboxBackend> Effects<B> {
    /// Writes to `b`'s `effects` table.
    pub fn new(b: &B, script: Arc<Script>) -> Self {
        Self {
            insert: b.sql(EFFECT),
            script,
            backend: PhantomData,
        }
    }
}

#[async_trait]
impl<B: InboxBackend> Handler<B::Db> for Effects<B> {
    async fn handle(
        &self,
        tx: &mut Transaction<'static, B::Db>,
        m: &InboxMessage,
    ) -> Result<(), HandlerError> {
        let value = m.payload["value"].as_i64().unwrap_or(-1);
        B::execute(
            B::tx(tx),
            &self.insert,
            &[m.id.into(), m.key.clone().into(), value.into()],
        )
        .await?;
        self.script.verdict(m.id)
    }
}

/// `b`'s processor with the [`Effects`] handler for `order.paid`, running until the token is
/// cancelled.
fn spawn_processor<B: InboxBackend>(
    b: &B,
    script: &Arc<Script>,
    config: ProcessorConfig,
) -> (CancellationToken, tokio::task::JoinHandle<()>) {
    let handlers = Handlers::new().on("order.paid", Effects::new(b, script.clone()));
    spawn(b.processor(handlers, config))
}

fn spawn(p: InboxProcessor) -> (CancellationToken, tokio::task::JoinHandle<()>) {
    let stop = CancellationToken::new();
    (stop.clone(), tokio::spawn(p.run(stop)))
}

/// Waits until `check` holds; panics naming `what` after `limit`.
pub async fn wait_for<F, Fut>(limit: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    while !check().await {
        assert!(Instant::now() < deadline, "not within {limit:?}: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until `b` holds at least `n` effects; returns them.
async fn wait_effects<B: InboxBackend>(b: &B, n: usize) -> Vec<(Uuid, String, i64)> {
    wait_for(WAIT, &format!("{n} effects applied"), || async {
        effects(b).await.len() >= n
    })
    .await;
    effects(b).await
}

/// Every message's effect once, each key's effects in value order.
pub fn assert_once_in_order(effects: &[(Uuid, String, i64)], msgs: &[InboxMessage]) {
    let mut seen: HashMap<Uuid, usize> = HashMap::new();
    for (id, _, _) in effects {
        *seen.entry(*id).or_default() += 1;
    }
    for m in msgs {
        assert_eq!(seen.get(&m.id), Some(&1), "message {} applied", m.id);
    }
    assert_eq!(effects.len(), msgs.len());
    let mut last: HashMap<&str, i64> = HashMap::new();
    for (_, key, value) in effects {
        let prev = last.insert(key, *value);
        assert!(
            prev.is_none_or(|p| p < *value),
            "key {key}: {value} after {prev:?}"
        );
    }
}

/// Ingests `msgs` in one transaction; per message, whether it was recorded now.
pub async fn ingest<B: InboxBackend>(b: &B, msgs: &[InboxMessage]) -> Vec<bool> {
    let mut tx = b.begin().await;
    let flags = b.inbox().ingest_many(&mut tx, msgs).await.unwrap();
    B::finish(tx, true).await;
    flags
}

/// The processing state and last error of message `id` (`inbox_message_states`).
pub async fn state<B: InboxBackend>(b: &B, id: Uuid) -> (String, Option<String>) {
    let rows = b
        .texts(&format!(
            "SELECT state, last_error FROM {{schema}}.inbox_message_states \
             WHERE CAST(id AS TEXT) = '{id}'"
        ))
        .await;
    let row = rows.first().unwrap_or_else(|| panic!("no state for {id}"));
    (row[0].clone().unwrap(), row[1].clone())
}

/// Runs the `statements` (separated by `;`, rendered) in one transaction.
async fn run<B: InboxBackend>(b: &B, statements: &str) {
    let mut tx = b.begin().await;
    for sql in b
        .sql(statements)
        .split(';')
        .filter(|s| !s.trim().is_empty())
    {
        B::execute(&mut tx, sql, &[]).await.unwrap();
    }
    B::finish(tx, true).await;
}

/// Runs the rendered `sql` with `args` in a transaction of its own; rows affected.
async fn apply<B: InboxBackend>(b: &B, sql: &str, args: &[Arg]) -> u64 {
    let mut tx = b.begin().await;
    let n = B::execute(&mut tx, &b.sql(sql), args).await.unwrap();
    B::finish(tx, true).await;
    n
}
