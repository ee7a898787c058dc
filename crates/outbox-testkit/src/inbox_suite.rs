//! The inbox backend suite: what the receiving side must do on each database it runs on,
//! written once over [`InboxBackend`] and run per database (PostgreSQL, MySQL, SQLite:
//! [`crate::inbox_backends`]). `crates/outbox-inbox/tests/backends.rs` expands
//! [`inbox_backend_suite!`](crate::inbox_backend_suite) once per backend and gets one
//! `#[tokio::test]` per case.
//!
//! The cases go through the crate's own API: a transaction of the database, the dedupe claim,
//! ingest and idempotency keys through `InboxTx`, effects written in the caller's transaction,
//! and the processor running handlers. They assert outcomes (rows, claims, states), never
//! timings. New inbox behaviour goes here, not into one database's tests.

// Test code: a failed expectation should panic with its message.
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use outbox_core::{NewMessage, RedriveScope, RetryPolicy, Store};
use outbox_inbox::source::SourceOptions;
use outbox_inbox::{
    Handler, HandlerError, Handlers, IdempotencyError, Inbox, InboxMessage, InboxProcessor,
    InboxTx, ProcessorConfig, Response,
};
use outbox_sinks::read::ScratchOptions;
use sqlx::Transaction;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

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

/// Layer 1: a message delivered three times to a consumer has its effect once; another
/// consumer has a claim of its own on the same message.
pub async fn a_message_delivered_three_times_has_its_effect_once<B: InboxBackend>(b: Arc<B>) {
    let id = Uuid::now_v7();
    let mut claims = Vec::new();
    for _ in 0..3 {
        claims.push(deliver(b.as_ref(), "billing", id).await);
    }
    assert_eq!(claims, vec![true, false, false]);
    assert_eq!(effects(b.as_ref()).await.len(), 1);
    assert!(
        deliver(b.as_ref(), "shipping", id).await,
        "claims are per consumer"
    );
}

/// Consumer A claims a message and holds its transaction open; consumer B claims the same
/// message meanwhile and is held up until A ends (on the primary key on PostgreSQL, on the
/// file's write lock on SQLite). When A commits, B's claim says "already processed"; when A
/// rolls back, B's claim is new. One effect either way.
pub async fn two_consumers_racing_on_one_message_produce_one_effect<B: InboxBackend>(b: Arc<B>) {
    for a_commits in [true, false] {
        let id = Uuid::now_v7();
        let mut a = b.begin().await;
        assert!(b.inbox().claim(&mut a, "billing", id).await.unwrap());
        effect(b.as_ref(), &mut a, id).await;
        let consumer_b = {
            let b = b.clone();
            tokio::spawn(async move { deliver(b.as_ref(), "billing", id).await })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            !consumer_b.is_finished(),
            "B finished while A held its claim open"
        );
        B::finish(a, a_commits).await;
        let b_fresh = tokio::time::timeout(WAIT, consumer_b)
            .await
            .expect("B never finished after A ended")
            .unwrap();
        assert_eq!(b_fresh, !a_commits, "A commits: {a_commits}");
        let n = effects(b.as_ref())
            .await
            .iter()
            .filter(|(m, _, _)| *m == id)
            .count();
        assert_eq!(n, 1, "one effect; A commits: {a_commits}");
    }
}

/// A consumer of a NATS JetStream source (ack wait 1 s, a real redelivery) commits the effect
/// and dies before acknowledging. The broker delivers the message again to the next consumer,
/// whose claim says it was processed: it acknowledges without applying anything, and nothing
/// is left for a third.
pub async fn a_crash_after_the_commit_and_before_the_ack_is_absorbed<B: InboxBackend>(b: Arc<B>) {
    let nats =
        std::env::var("OUTBOX_TEST_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into());
    let mut scratch = outbox_sinks::read::scratch(&nats, &ScratchOptions::new("dedupe"))
        .await
        .expect("NATS must be running (scripts/services.sh starts it)");
    // The NATS scratch captures `<prefix>.>` in the stream `<PREFIX>`.
    let prefix = scratch.destination.split('.').next().unwrap().to_string();
    let sink = outbox_sinks::connect(&nats).await.unwrap();
    let e = crate::relay::envelope(&format!("{prefix}.paid"), "k", 0);
    for r in sink.publish(std::slice::from_ref(&e)).await {
        r.unwrap();
    }
    let url = format!(
        "{nats}?stream={}&durable=billing&ack_wait=1s",
        prefix.to_uppercase()
    );
    let mut claims = Vec::new();
    for crash in [true, false] {
        let mut source = outbox_inbox::source::open(&url, &SourceOptions { batch: 1 })
            .await
            .unwrap();
        source.recover().await.unwrap();
        let got = crate::source_suite::fetch_until(source.as_mut(), 1, 1, WAIT).await;
        assert_eq!(got[0].message.id, e.id);
        claims.push(deliver(b.as_ref(), "billing", e.id).await);
        if !crash {
            let acks = got.into_iter().map(|d| d.ack).collect();
            source.ack(acks).await.unwrap();
        }
        // The crashed consumer goes away without acknowledging: the broker delivers again.
    }
    assert_eq!(claims, vec![true, false]);
    assert_eq!(effects(b.as_ref()).await.len(), 1);
    let mut source = outbox_inbox::source::open(&url, &SourceOptions { batch: 1 })
        .await
        .unwrap();
    source.recover().await.unwrap();
    assert!(
        source.fetch(1).await.unwrap().is_empty(),
        "acknowledged: nothing comes again"
    );
    scratch.reader.cleanup().await;
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

/// Ingest records a message once, also when it is delivered again or repeated within a batch,
/// and queues it once, with its source, type and key; the processor then applies every
/// message once, each key in order, and marks all processed.
pub async fn ingest_records_each_message_once_and_handlers_apply_it_once_in_key_order<
    B: InboxBackend,
>(
    b: Arc<B>,
) {
    let msgs = messages(10, 30);
    let mut first = msgs.clone();
    first.push(msgs[0].clone());
    let flags = ingest(b.as_ref(), &first).await;
    assert_eq!(flags.iter().filter(|f| **f).count(), msgs.len());
    assert!(!flags[msgs.len()], "a repeat inside the batch");
    assert!(
        ingest(b.as_ref(), &msgs).await.iter().all(|f| !f),
        "delivered again: nothing recorded"
    );
    let n = msgs.len() as i64;
    assert_eq!(
        b.scalar("SELECT count(*) FROM {schema}.inbox_messages")
            .await,
        n
    );
    assert_eq!(b.scalar("SELECT count(*) FROM {queue}").await, n);
    let m = &msgs[5];
    let row = b
        .texts(&format!(
            "SELECT source, type, key FROM {{schema}}.inbox_messages \
             WHERE CAST(id AS TEXT) = '{}'",
            m.id
        ))
        .await;
    assert_eq!(
        row[0],
        vec![
            Some("test".to_string()),
            Some("order.paid".to_string()),
            Some(m.key.clone())
        ]
    );
    let script = Arc::new(Script::default());
    let (stop, task) = spawn_processor(b.as_ref(), &script, processor_config());
    let got = wait_effects(b.as_ref(), msgs.len()).await;
    stop.cancel();
    task.await.unwrap();
    assert_once_in_order(&got, &msgs);
    assert_eq!(
        b.scalar("SELECT count(*) FROM {schema}.inbox_message_states WHERE state = 'processed'")
            .await,
        n
    );
}

/// The same with one transaction per message (no savepoints) and with one group per batch, a
/// message of the first wave failing once (undone alone; its key waits for it): the result
/// does not depend on how messages are grouped into transactions.
pub async fn handlers_apply_each_message_once_in_key_order_whatever_the_grouping<
    B: InboxBackend,
>(
    b: Arc<B>,
) {
    let mut done = 0;
    for per_tx in [1, 1000] {
        let msgs = messages(7, 20);
        ingest(b.as_ref(), &msgs).await;
        let script = Arc::new(Script::default());
        script.transient.lock().unwrap().insert(msgs[3].id, 1);
        let cfg = ProcessorConfig {
            messages_per_transaction: per_tx,
            ..processor_config()
        };
        let (stop, task) = spawn_processor(b.as_ref(), &script, cfg);
        let got = wait_effects(b.as_ref(), done + msgs.len()).await;
        stop.cancel();
        task.await.unwrap();
        assert_once_in_order(&got[done..], &msgs);
        done += msgs.len();
    }
}

/// A handler that fails transiently three times on the head of a key succeeds later; its key
/// waits for it, every message is applied once in key order, and the handler ran three times
/// more than there are messages.
pub async fn a_handler_that_fails_transiently_succeeds_later_and_its_key_waits_for_it<
    B: InboxBackend,
>(
    b: Arc<B>,
) {
    let msgs = messages(3, 5);
    let flaky = msgs[0].id; // key-0, value 0: the head of its key
    let script = Arc::new(Script::default());
    script.transient.lock().unwrap().insert(flaky, 3);
    ingest(b.as_ref(), &msgs).await;
    let (stop, task) = spawn_processor(b.as_ref(), &script, processor_config());
    let got = wait_effects(b.as_ref(), msgs.len()).await;
    stop.cancel();
    task.await.unwrap();
    assert_once_in_order(&got, &msgs);
    assert_eq!(state(b.as_ref(), flaky).await.0, "processed");
    assert_eq!(script.calls.load(Ordering::SeqCst) as usize, msgs.len() + 3);
}

/// A handler that fails permanently ends the message `failed` at its first attempt, with its
/// error, listed by the queue's `failed`; its key waits behind it while the other keys flow.
/// Redriven once the handler is fixed, it is handled and its key drains in order.
pub async fn a_handler_that_fails_permanently_ends_failed_with_its_error_and_can_be_redriven<
    B: InboxBackend,
>(
    b: Arc<B>,
) {
    let msgs = messages(3, 4);
    ingest(b.as_ref(), &msgs).await;
    let poison = msgs[3].id; // key-0, value 1: key-0 has more behind it
    let script = Arc::new(Script::default());
    script.poison.lock().unwrap().push(poison);
    script.broken.store(true, Ordering::SeqCst);
    let (stop, task) = spawn_processor(b.as_ref(), &script, processor_config());
    let others = msgs.len() - 3; // key-0 values 1, 2, 3 wait
    wait_effects(b.as_ref(), others).await;
    wait_for(WAIT, "the poison message failed", || async {
        state(b.as_ref(), poison).await.0 == "failed"
    })
    .await;
    let (_, error) = state(b.as_ref(), poison).await;
    assert!(
        error.unwrap_or_default().contains("amount is negative"),
        "the handler's error is kept"
    );
    let queue = b.queue();
    let failed = queue.failed(10).await.unwrap();
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0].id, poison);
    assert_eq!(failed[0].attempts, 1, "a permanent failure is not retried");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        effects(b.as_ref()).await.len(),
        others,
        "its key waits behind it"
    );
    // The fix ships; an operator redrives it (`outbox redrive --inbox --id …`).
    script.broken.store(false, Ordering::SeqCst);
    let redriven = queue
        .redrive(&RedriveScope::Ids(vec![poison]), "handler fixed")
        .await
        .unwrap();
    assert_eq!(redriven, 1);
    let got = wait_effects(b.as_ref(), msgs.len()).await;
    stop.cancel();
    task.await.unwrap();
    assert_once_in_order(&got, &msgs);
    assert_eq!(state(b.as_ref(), poison).await.0, "processed");
}

/// The processor died after a handler's transaction committed and before it recorded the
/// message as handled (its claim exists): the message is handed out again, the claim says it
/// was processed, and the handler is not run for it.
pub async fn a_message_whose_handler_already_committed_is_not_handled_again<B: InboxBackend>(
    b: Arc<B>,
) {
    let msgs = messages(2, 3);
    ingest(b.as_ref(), &msgs).await;
    let done = msgs[2].id;
    let mut tx = b.begin().await;
    assert!(b
        .inbox()
        .claim(&mut tx, outbox_inbox::PROCESSOR_CONSUMER, done)
        .await
        .unwrap());
    B::finish(tx, true).await;
    let script = Arc::new(Script::default());
    let (stop, task) = spawn_processor(b.as_ref(), &script, processor_config());
    let queue = b.queue();
    wait_for(WAIT, "the queue drained", || async {
        queue.stats().await.unwrap().pending == 0
    })
    .await;
    stop.cancel();
    task.await.unwrap();
    let got = effects(b.as_ref()).await;
    assert_eq!(got.len(), msgs.len() - 1);
    assert!(got.iter().all(|(id, _, _)| *id != done));
    assert_eq!(script.calls.load(Ordering::SeqCst) as usize, msgs.len() - 1);
}

/// A message whose type has no handler ends `failed` at once with an error naming the type,
/// while a closure registered for the other type handles its message.
pub async fn a_message_without_a_handler_fails_visibly_and_a_closure_can_handle_the_rest<
    B: InboxBackend,
>(
    b: Arc<B>,
) {
    let message = |ty: &str, key: &str| {
        InboxMessage::new(Uuid::now_v7(), "test", ty, key, serde_json::json!({}))
    };
    let (known, unknown) = (message("order.paid", "a"), message("order.refunded", "b"));
    ingest(b.as_ref(), &[known.clone(), unknown.clone()]).await;
    let insert = b.sql(EFFECT);
    let handlers = Handlers::<B::Db>::new().on_fn("order.paid", move |tx, m| {
        let insert = insert.clone();
        Box::pin(async move {
            B::execute(
                B::tx(tx),
                &insert,
                &[m.id.into(), m.key.clone().into(), 1.into()],
            )
            .await?;
            Ok(())
        })
    });
    let (stop, task) = spawn(b.processor(handlers, processor_config()));
    let queue = b.queue();
    wait_for(WAIT, "one handled, one failed", || async {
        let s = queue.stats().await.unwrap();
        s.failed == 1 && s.pending == 0
    })
    .await;
    stop.cancel();
    task.await.unwrap();
    assert_eq!(effects(b.as_ref()).await.len(), 1);
    let failed = queue.failed(10).await.unwrap();
    assert_eq!(failed[0].id, unknown.id);
    let error = failed[0].last_error.clone().unwrap_or_default();
    assert!(
        error.contains("no handler for message type `order.refunded`"),
        "{error}"
    );
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

/// The result an idempotent request stores.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct Receipt {
    payment: String,
    cents: i64,
}

/// What a request under an idempotency key returns.
type Answer<'a> = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<Response<Receipt>, String>> + Send + 'a>,
>;

/// A request under an idempotency key: counts its runs, pays `cents` and returns one event.
fn request<T: Send>(
    cents: i64,
    runs: Arc<AtomicU32>,
) -> impl for<'a> FnOnce(&'a mut T) -> Answer<'a> {
    move |_tx| {
        Box::pin(async move {
            runs.fetch_add(1, Ordering::SeqCst);
            let event = NewMessage::new(
                "payment",
                "p-1",
                "payment.created",
                serde_json::json!({ "cents": cents }),
            );
            Ok(Response::new(Receipt {
                payment: "p-1".into(),
                cents,
            })
            .event(event))
        })
    }
}

/// Runs `request(cents)` under `key` and `fingerprint` in a transaction of its own, committed
/// when the request succeeded.
async fn idempotent<B: InboxBackend>(
    b: &B,
    key: &str,
    fingerprint: &str,
    cents: i64,
    runs: &Arc<AtomicU32>,
) -> Result<outbox_inbox::Idempotent<Receipt>, IdempotencyError<String>> {
    let mut tx = b.begin().await;
    let answer = b
        .inbox()
        .idempotent(&mut tx, key, fingerprint, request(cents, runs.clone()))
        .await;
    B::finish(tx, answer.is_ok()).await;
    answer
}

/// Rows in the application's outbox.
async fn outbox_rows<B: InboxBackend>(b: &B) -> i64 {
    b.scalar("SELECT count(*) FROM {schema}.outbox").await
}

/// A repeat under the same key and fingerprint returns the stored result and event ids
/// (`replayed`), runs nothing and enqueues nothing: one event in the outbox, the first
/// request's. The same key with another fingerprint is a conflict, and runs nothing.
pub async fn a_repeat_returns_the_stored_result_and_enqueues_nothing<B: InboxBackend>(b: Arc<B>) {
    let runs = Arc::new(AtomicU32::new(0));
    let mut answers = Vec::new();
    for _ in 0..3 {
        answers.push(
            idempotent(b.as_ref(), "req-1", "POST /pay 42", 42, &runs)
                .await
                .unwrap(),
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let replayed: Vec<bool> = answers.iter().map(|a| a.replayed).collect();
    assert_eq!(replayed, vec![false, true, true]);
    assert!(answers
        .iter()
        .all(|a| a.result == answers[0].result && a.events == answers[0].events));
    assert_eq!(answers[0].events.len(), 1);
    assert_eq!(
        outbox_rows(b.as_ref()).await,
        1,
        "enqueued by the first only"
    );
    let stored = b
        .texts("SELECT CAST(id AS TEXT) FROM {schema}.outbox")
        .await;
    assert_eq!(stored[0][0], Some(answers[0].events[0].to_string()));
    let e = idempotent(b.as_ref(), "req-1", "POST /pay 43", 43, &runs)
        .await
        .unwrap_err();
    assert!(
        matches!(e, IdempotencyError::Conflict { ref key } if key == "req-1"),
        "{e}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// A request that fails, or whose transaction rolls back (a crash before the commit), leaves
/// no key behind: the next request under the key runs.
pub async fn a_request_that_fails_or_rolls_back_leaves_no_key_and_runs_again<B: InboxBackend>(
    b: Arc<B>,
) {
    let inbox = b.inbox();
    let mut tx = b.begin().await;
    let e = inbox
        .idempotent(&mut tx, "req-3", "f", |_tx| {
            Box::pin(async { Err::<Response<Receipt>, _>("card declined".to_string()) })
        })
        .await
        .unwrap_err();
    assert!(matches!(e, IdempotencyError::Request(ref why) if why == "card declined"));
    B::finish(tx, false).await;
    let runs = Arc::new(AtomicU32::new(0));
    let mut tx = b.begin().await;
    inbox
        .idempotent(&mut tx, "req-3", "f", request(4, runs.clone()))
        .await
        .unwrap();
    B::finish(tx, false).await; // a crash before the commit
    let d = idempotent(b.as_ref(), "req-3", "f", 5, &runs)
        .await
        .unwrap();
    assert!(!d.replayed);
    assert_eq!(d.result.cents, 5);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    assert_eq!(outbox_rows(b.as_ref()).await, 1);
}

/// A second request under a key whose first request has not committed is never run: on
/// PostgreSQL it answers `InProgress` while the first is still open; on SQLite it waits for
/// the first and replays its result. Once the first committed, a third replays it. One run,
/// one event.
pub async fn a_concurrent_request_under_the_same_key_is_not_run_twice<B: InboxBackend>(b: Arc<B>) {
    let runs = Arc::new(AtomicU32::new(0));
    let mut first = b.begin().await;
    let a = b
        .inbox()
        .idempotent(&mut first, "req-2", "f", request(1, runs.clone()))
        .await
        .unwrap();
    assert!(!a.replayed);
    let second = {
        let (b, runs) = (b.clone(), runs.clone());
        tokio::spawn(async move { idempotent(b.as_ref(), "req-2", "f", 2, &runs).await })
    };
    let second = match B::CONCURRENT_REQUEST {
        Concurrent::InProgress => {
            // It answers while the first is still open: it does not wait.
            let answer = tokio::time::timeout(WAIT, second)
                .await
                .expect("the second request waited for the first")
                .unwrap();
            B::finish(first, true).await;
            answer
        }
        Concurrent::WaitsThenReplays => {
            tokio::time::sleep(Duration::from_millis(300)).await;
            assert!(!second.is_finished(), "it waits for the first");
            B::finish(first, true).await;
            tokio::time::timeout(WAIT, second).await.unwrap().unwrap()
        }
    };
    match (B::CONCURRENT_REQUEST, second) {
        (Concurrent::InProgress, Err(IdempotencyError::InProgress { .. })) => {}
        (Concurrent::WaitsThenReplays, Ok(r)) => {
            assert!(r.replayed);
            assert_eq!(r.result.cents, 1);
        }
        (want, got) => panic!("{} ({want:?}): {got:?}", B::NAME),
    }
    let c = idempotent(b.as_ref(), "req-2", "f", 3, &runs)
        .await
        .unwrap();
    assert!(c.replayed);
    assert_eq!(c.result.cents, 1);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(outbox_rows(b.as_ref()).await, 1);
}

/// Retention: an inbox row goes once it is older than the retention *and* some consumer claimed
/// it; a claim and an idempotency key go by age alone; nothing younger goes. Times are set with
/// one literal both backends read as a time.
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
