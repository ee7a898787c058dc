//! The inbox and its processor on real PostgreSQL and SQLite: ingest records a message once and
//! queues it once; handlers run once per message, in per-key order; a handler that fails
//! transiently succeeds later; one that fails permanently ends `failed` with its error and is
//! redriven; a message whose handler already committed is not handled twice.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use common::{wait_for, Lite, Pg};
use outbox_core::{RedriveScope, RetryPolicy, Store};
use outbox_inbox::{
    Handler, HandlerError, Handlers, Inbox, InboxMessage, InboxProcessor, ProcessorConfig,
};
use sqlx::{Postgres, Sqlite, Transaction};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

fn config() -> ProcessorConfig {
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

/// `n` messages of type `order.paid` over `keys` keys; message i of key k has value i.
fn messages(source: &str, keys: usize, per_key: usize) -> Vec<InboxMessage> {
    let mut out = Vec::new();
    for i in 0..per_key {
        for k in 0..keys {
            out.push(InboxMessage::new(
                Uuid::now_v7(),
                source,
                "order.paid",
                format!("key-{k}"),
                serde_json::json!({ "value": i }),
            ));
        }
    }
    out
}

/// What a handler is told to do: fail some messages a number of times, or for good.
#[derive(Default)]
struct Script {
    /// Transient failures left, per message id.
    transient: Mutex<HashMap<Uuid, u32>>,
    /// Messages that fail permanently while `broken` holds.
    poison: Mutex<Vec<Uuid>>,
    broken: AtomicBool,
    /// Handler calls, all messages.
    calls: AtomicU32,
}

impl Script {
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

struct PgEffects {
    table: String,
    script: Arc<Script>,
}

#[async_trait]
impl Handler<Postgres> for PgEffects {
    async fn handle(
        &self,
        tx: &mut Transaction<'static, Postgres>,
        m: &InboxMessage,
    ) -> Result<(), HandlerError> {
        // The effect is written first, so a failure after it proves the rollback.
        sqlx::query(&format!(
            "INSERT INTO {} (message_id, key, value) VALUES ($1, $2, $3)",
            self.table
        ))
        .bind(m.id)
        .bind(&m.key)
        .bind(m.payload["value"].as_i64().unwrap_or(-1))
        .execute(&mut **tx)
        .await?;
        self.script.verdict(m.id)
    }
}

struct LiteEffects {
    script: Arc<Script>,
}

#[async_trait]
impl Handler<Sqlite> for LiteEffects {
    async fn handle(
        &self,
        tx: &mut Transaction<'static, Sqlite>,
        m: &InboxMessage,
    ) -> Result<(), HandlerError> {
        sqlx::query("INSERT INTO effects (message_id, key, value) VALUES (?1, ?2, ?3)")
            .bind(m.id.to_string())
            .bind(&m.key)
            .bind(m.payload["value"].as_i64().unwrap_or(-1))
            .execute(&mut **tx)
            .await?;
        self.script.verdict(m.id)
    }
}

fn pg_processor(pg: &Pg, script: &Arc<Script>) -> InboxProcessor {
    let handlers = Handlers::new().on(
        "order.paid",
        PgEffects {
            table: format!("{}.effects", pg.name),
            script: script.clone(),
        },
    );
    InboxProcessor::postgres(pg.pool.clone(), pg.schema.clone(), handlers, config())
}

fn lite_processor(lite: &Lite, script: &Arc<Script>) -> InboxProcessor {
    let handlers = Handlers::new().on(
        "order.paid",
        LiteEffects {
            script: script.clone(),
        },
    );
    InboxProcessor::sqlite(lite.pool.clone(), handlers, config())
}

fn spawn(p: InboxProcessor) -> (CancellationToken, tokio::task::JoinHandle<()>) {
    let stop = CancellationToken::new();
    (stop.clone(), tokio::spawn(p.run(stop)))
}

/// Every message's effect once, each key's effects in value order.
fn assert_once_in_order(effects: &[(Uuid, String, i64)], msgs: &[InboxMessage]) {
    let mut seen = HashMap::new();
    for (id, _, _) in effects {
        *seen.entry(*id).or_insert(0) += 1;
    }
    for m in msgs {
        assert_eq!(
            seen.get(&m.id),
            Some(&1),
            "message {} applied {:?} times",
            m.id,
            seen.get(&m.id)
        );
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

async fn ingest_pg(pg: &Pg, msgs: &[InboxMessage]) -> Vec<bool> {
    let inbox = Inbox::new(pg.schema.clone());
    let mut tx = pg.pool.begin().await.unwrap();
    let flags = inbox.ingest_many(&mut tx, msgs).await.unwrap();
    tx.commit().await.unwrap();
    flags
}

async fn ingest_lite(lite: &Lite, msgs: &[InboxMessage]) -> Vec<bool> {
    let mut tx = lite.pool.begin_with("BEGIN IMMEDIATE").await.unwrap();
    let flags = Inbox::default().ingest_many(&mut tx, msgs).await.unwrap();
    tx.commit().await.unwrap();
    flags
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingest_records_each_message_once_and_handlers_apply_it_once_in_key_order_on_postgres() {
    let pg = Pg::new().await;
    let msgs = messages("test", 10, 30);
    // Delivered twice, and a repeat inside one batch: recorded once each.
    let mut first = msgs.clone();
    first.push(msgs[0].clone());
    let flags = ingest_pg(&pg, &first).await;
    assert_eq!(flags.iter().filter(|f| **f).count(), msgs.len());
    assert!(
        !flags[msgs.len()],
        "a repeat inside the batch is not recorded twice"
    );
    assert!(ingest_pg(&pg, &msgs).await.iter().all(|f| !f));
    assert_eq!(
        pg.scalar("SELECT count(*) FROM {schema}.inbox_messages")
            .await,
        300
    );
    assert_eq!(pg.scalar("SELECT count(*) FROM {queue}.outbox").await, 300);
    let m = &msgs[5];
    let (source, ty, key): (String, String, String) = sqlx::query_as(&format!(
        "SELECT source, type, key FROM {}.inbox_messages WHERE id = $1",
        pg.name
    ))
    .bind(m.id)
    .fetch_one(&pg.pool)
    .await
    .unwrap();
    assert_eq!(
        (source.as_str(), ty.as_str(), key.as_str()),
        ("test", "order.paid", m.key.as_str())
    );

    let script = Arc::new(Script::default());
    let (stop, task) = spawn(pg_processor(&pg, &script));
    wait_for(Duration::from_secs(30), "every message handled", || async {
        pg.effects().await.len() >= msgs.len()
    })
    .await;
    stop.cancel();
    task.await.unwrap();
    assert_once_in_order(&pg.effects().await, &msgs);
    assert_eq!(
        pg.scalar("SELECT count(*) FROM {schema}.inbox_message_states WHERE state = 'processed'")
            .await,
        300
    );
    pg.drop_all().await;
}

/// The same with one transaction per message (no savepoints), and with a single group per
/// batch: the result may not depend on how messages are grouped into transactions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handlers_apply_each_message_once_in_key_order_whatever_the_grouping() {
    for per_tx in [1, 1000] {
        let pg = Pg::new().await;
        let msgs = messages("test", 7, 20);
        ingest_pg(&pg, &msgs).await;
        let script = Arc::new(Script::default());
        // One message of the first wave fails once: undone alone, its key waits for it.
        script.transient.lock().unwrap().insert(msgs[3].id, 1);
        let handlers = Handlers::new().on(
            "order.paid",
            PgEffects {
                table: format!("{}.effects", pg.name),
                script: script.clone(),
            },
        );
        let cfg = ProcessorConfig {
            messages_per_transaction: per_tx,
            ..config()
        };
        let (stop, task) = spawn(InboxProcessor::postgres(
            pg.pool.clone(),
            pg.schema.clone(),
            handlers,
            cfg,
        ));
        wait_for(Duration::from_secs(30), "every message handled", || async {
            pg.effects().await.len() >= msgs.len()
        })
        .await;
        stop.cancel();
        task.await.unwrap();
        assert_once_in_order(&pg.effects().await, &msgs);
        pg.drop_all().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingest_records_each_message_once_and_handlers_apply_it_once_in_key_order_on_sqlite() {
    let lite = Lite::new().await;
    let msgs = messages("test", 10, 20);
    assert!(ingest_lite(&lite, &msgs).await.iter().all(|f| *f));
    assert!(ingest_lite(&lite, &msgs).await.iter().all(|f| !f));
    assert_eq!(
        lite.scalar("SELECT count(*) FROM inbox_messages").await,
        200
    );
    assert_eq!(lite.scalar("SELECT count(*) FROM inbox_queue").await, 200);
    let script = Arc::new(Script::default());
    let (stop, task) = spawn(lite_processor(&lite, &script));
    wait_for(Duration::from_secs(30), "every message handled", || async {
        lite.effects().await.len() >= msgs.len()
    })
    .await;
    stop.cancel();
    task.await.unwrap();
    assert_once_in_order(&lite.effects().await, &msgs);
    assert_eq!(
        lite.scalar("SELECT count(*) FROM inbox_message_states WHERE state = 'processed'")
            .await,
        200
    );
    lite.drop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_fails_transiently_succeeds_later_and_its_key_waits_for_it() {
    let pg = Pg::new().await;
    let msgs = messages("test", 3, 5);
    let flaky = msgs[0].id; // key-0, value 0: the head of its key
    let script = Arc::new(Script::default());
    script.transient.lock().unwrap().insert(flaky, 3);
    ingest_pg(&pg, &msgs).await;
    let (stop, task) = spawn(pg_processor(&pg, &script));
    wait_for(Duration::from_secs(30), "every message handled", || async {
        pg.effects().await.len() >= msgs.len()
    })
    .await;
    stop.cancel();
    task.await.unwrap();
    let effects = pg.effects().await;
    assert_once_in_order(&effects, &msgs);
    let (attempts, state): (i64, String) = sqlx::query_as(&format!(
        "SELECT attempts::int8, state FROM {}.inbox_message_states WHERE id = $1",
        pg.name
    ))
    .bind(flaky)
    .fetch_one(&pg.pool)
    .await
    .unwrap();
    assert_eq!(state, "processed");
    assert_eq!(
        attempts, 0,
        "a processed message is out of the parked table"
    );
    assert_eq!(script.calls.load(Ordering::SeqCst) as usize, msgs.len() + 3);
    pg.drop_all().await;
}

async fn poisoned_then_redriven(
    effects: impl Fn() -> futures::future::BoxFuture<'static, Vec<(Uuid, String, i64)>>,
    states: impl Fn(Uuid) -> futures::future::BoxFuture<'static, (String, Option<String>)>,
    queue: Arc<dyn Store>,
    script: Arc<Script>,
    msgs: Vec<InboxMessage>,
    processor: InboxProcessor,
) {
    let poison = msgs[3].id; // key-0, value 1: key-0 has more behind it
    script.poison.lock().unwrap().push(poison);
    script.broken.store(true, Ordering::SeqCst);
    let (stop, task) = spawn(processor);
    let others = msgs.len() - 3; // key-0 values 1, 2, 3 wait
    wait_for(Duration::from_secs(30), "the other keys handled", || {
        let f = effects();
        async move { f.await.len() >= others }
    })
    .await;
    wait_for(Duration::from_secs(30), "the poison message failed", || {
        let s = states(poison);
        async move { s.await.0 == "failed" }
    })
    .await;
    let (_, error) = states(poison).await;
    assert!(error.unwrap_or_default().contains("amount is negative"));
    let failed = queue.failed(10).await.unwrap();
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0].id, poison);
    assert_eq!(failed[0].attempts, 1, "a permanent failure is not retried");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(effects().await.len(), others, "its key waits behind it");
    // The fix ships; an operator redrives it (`outbox redrive --inbox --id …`).
    script.broken.store(false, Ordering::SeqCst);
    assert_eq!(
        queue
            .redrive(&RedriveScope::Ids(vec![poison]), "handler fixed")
            .await
            .unwrap(),
        1
    );
    wait_for(
        Duration::from_secs(30),
        "the key drained after the redrive",
        || {
            let f = effects();
            let n = msgs.len();
            async move { f.await.len() >= n }
        },
    )
    .await;
    stop.cancel();
    task.await.unwrap();
    assert_once_in_order(&effects().await, &msgs);
    assert_eq!(states(poison).await.0, "processed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_fails_permanently_ends_failed_with_its_error_and_can_be_redriven_on_postgres(
) {
    let pg = Arc::new(Pg::new().await);
    let msgs = messages("test", 3, 4);
    ingest_pg(&pg, &msgs).await;
    let script = Arc::new(Script::default());
    let queue: Arc<dyn Store> = Arc::new(outbox_postgres::PgStore::new(
        pg.pool.clone(),
        pg.schema.queue().clone(),
    ));
    let (p1, p2) = (pg.clone(), pg.clone());
    poisoned_then_redriven(
        move || {
            let p = p1.clone();
            Box::pin(async move { p.effects().await })
        },
        move |id| {
            let p = p2.clone();
            Box::pin(async move {
                sqlx::query_as(&format!(
                    "SELECT state, last_error FROM {}.inbox_message_states WHERE id = $1",
                    p.name
                ))
                .bind(id)
                .fetch_one(&p.pool)
                .await
                .unwrap()
            })
        },
        queue,
        script.clone(),
        msgs,
        pg_processor(&pg, &script),
    )
    .await;
    Arc::try_unwrap(pg).ok().unwrap().drop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_fails_permanently_ends_failed_with_its_error_and_can_be_redriven_on_sqlite()
{
    let lite = Arc::new(Lite::new().await);
    let msgs = messages("test", 3, 4);
    ingest_lite(&lite, &msgs).await;
    let script = Arc::new(Script::default());
    let queue: Arc<dyn Store> = Arc::new(outbox_sqlite::SqliteStore::with_tables(
        lite.pool.clone(),
        outbox_inbox::sqlite::queue_tables(),
    ));
    let (l1, l2) = (lite.clone(), lite.clone());
    poisoned_then_redriven(
        move || {
            let l = l1.clone();
            Box::pin(async move { l.effects().await })
        },
        move |id| {
            let l = l2.clone();
            Box::pin(async move {
                sqlx::query_as("SELECT state, last_error FROM inbox_message_states WHERE id = ?1")
                    .bind(id.to_string())
                    .fetch_one(&l.pool)
                    .await
                    .unwrap()
            })
        },
        queue,
        script.clone(),
        msgs,
        lite_processor(&lite, &script),
    )
    .await;
    Arc::try_unwrap(lite).ok().unwrap().drop_all().await;
}

/// The processor died after a handler's transaction committed and before it recorded the
/// message as handled: the message is handed out again, and its claim says it was processed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_whose_handler_already_committed_is_not_handled_again() {
    let pg = Pg::new().await;
    let msgs = messages("test", 2, 3);
    ingest_pg(&pg, &msgs).await;
    let done = msgs[2].id;
    {
        let mut tx = pg.pool.begin().await.unwrap();
        assert!(Inbox::new(pg.schema.clone())
            .claim(&mut tx, outbox_inbox::PROCESSOR_CONSUMER, done)
            .await
            .unwrap());
        tx.commit().await.unwrap();
    }
    let script = Arc::new(Script::default());
    let (stop, task) = spawn(pg_processor(&pg, &script));
    let queue = outbox_postgres::PgStore::new(pg.pool.clone(), pg.schema.queue().clone());
    wait_for(Duration::from_secs(30), "the queue drained", || async {
        queue.stats().await.unwrap().pending == 0
    })
    .await;
    stop.cancel();
    task.await.unwrap();
    let effects = pg.effects().await;
    assert_eq!(effects.len(), msgs.len() - 1);
    assert!(effects.iter().all(|(id, _, _)| *id != done));
    assert_eq!(script.calls.load(Ordering::SeqCst) as usize, msgs.len() - 1);
    pg.drop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_without_a_handler_fails_visibly_and_a_closure_can_handle_the_rest() {
    let pg = Pg::new().await;
    let known = InboxMessage::new(
        Uuid::now_v7(),
        "test",
        "order.paid",
        "a",
        serde_json::json!({"value": 1}),
    );
    let unknown = InboxMessage::new(
        Uuid::now_v7(),
        "test",
        "order.refunded",
        "b",
        serde_json::json!({}),
    );
    ingest_pg(&pg, &[known.clone(), unknown.clone()]).await;
    let table = format!("{}.effects", pg.name);
    let handlers = Handlers::<Postgres>::new().on_fn("order.paid", move |tx, m| {
        let sql = format!("INSERT INTO {table} (message_id, key, value) VALUES ($1, $2, 1)");
        Box::pin(async move {
            sqlx::query(&sql)
                .bind(m.id)
                .bind(&m.key)
                .execute(&mut **tx)
                .await?;
            Ok(())
        })
    });
    let (stop, task) = spawn(InboxProcessor::postgres(
        pg.pool.clone(),
        pg.schema.clone(),
        handlers,
        config(),
    ));
    let queue = outbox_postgres::PgStore::new(pg.pool.clone(), pg.schema.queue().clone());
    wait_for(
        Duration::from_secs(30),
        "one handled, one failed",
        || async {
            let s = queue.stats().await.unwrap();
            s.failed == 1 && s.pending == 0
        },
    )
    .await;
    stop.cancel();
    task.await.unwrap();
    assert_eq!(pg.effects().await.len(), 1);
    let failed = queue.failed(10).await.unwrap();
    assert_eq!(failed[0].id, unknown.id);
    assert!(failed[0]
        .last_error
        .as_deref()
        .unwrap_or_default()
        .contains("no handler for message type `order.refunded`"));
    pg.drop_all().await;
}
