//! [`InboxProcessor`]: runs the handler registered for each message type, once per message, in
//! per-key order, with backoff, a `failed` state and redrive.
//!
//! It is not a second queue. Ingest puts every new inbox message into the processing queue, an
//! outbox table set of its own (PostgreSQL: the insert-only engine in `<schema>_inbox`; MySQL:
//! the engine in database `<database>_inbox`; SQLite: the `inbox_queue` tables), and the processor is the relay engine (`outbox_relay::Relay`)
//! draining that queue into a [`Sink`] that calls handlers instead of a broker. So it inherits,
//! unchanged: partition leases and fencing (several processes may run it), per-key waves (a
//! key's message n+1 is handled only after n committed), parked retries with exponential
//! backoff, `failed` after `max_attempts` with the last error, `outbox redrive`, immunity to
//! long transactions (PostgreSQL: nothing is updated per message) and retention by `DROP`.
//!
//! Exactly once: each handler runs in a transaction that first claims the message in
//! `processed_messages` (consumer [`PROCESSOR_CONSUMER`]) and commits with the handler's effect.
//! If the processor dies after that commit and before it records the message as handled, the
//! message is handed out again, the claim answers "already processed", and the handler is not
//! run a second time.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::future::BoxFuture;
use futures::StreamExt;
use outbox_core::sink::{HEADER_AGGREGATE_TYPE, HEADER_EVENT_TYPE};
use outbox_core::{DestinationTemplate, Envelope, ErrorKind, RetryPolicy, Sink, SinkError};
use outbox_db::SqlxBackend;
use outbox_relay::{Relay, RelayConfig, RelayMetrics};
use sqlx::{MySql, MySqlPool, PgPool, Pool, Postgres, Sqlite, SqlitePool, Transaction};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::message::{InboxMessage, PayloadFormat};
use crate::tables::{InboxSchema, PROCESSOR_CONSUMER};
use crate::tx::InboxTx;
use crate::InboxDatabase;

/// What kind of failure a [`HandlerError`] is, which decides what happens to the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandlerErrorKind {
    /// Try again later: backoff, attempts spent, `failed` after `max_attempts`. A deadlock, a
    /// downstream service that timed out, a row that is not there yet.
    Transient,
    /// No retry can help: `failed` at once, with the error, until redriven. A message the
    /// handler cannot parse, a business rule that rejects it.
    Permanent,
    /// The database itself is unreachable: retried without blame; many in a row pause the
    /// processor (its circuit breaker) instead of spending every message's attempts.
    Unavailable,
}

/// A handler's failure: its kind and what to show (stored as the message's `last_error`, so it
/// must not hold secrets or payloads).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct HandlerError {
    /// What kind of failure.
    pub kind: HandlerErrorKind,
    /// What failed.
    pub message: String,
}

impl HandlerError {
    /// A failure worth retrying.
    pub fn transient(message: impl Into<String>) -> Self {
        Self {
            kind: HandlerErrorKind::Transient,
            message: message.into(),
        }
    }

    /// A failure no retry can fix: the message ends `failed` at once.
    pub fn permanent(message: impl Into<String>) -> Self {
        Self {
            kind: HandlerErrorKind::Permanent,
            message: message.into(),
        }
    }

    fn into_sink_error(self) -> SinkError {
        match self.kind {
            // Rejected: attempts spent, retried with backoff, never opens the circuit.
            HandlerErrorKind::Transient => SinkError::rejected(self.message),
            HandlerErrorKind::Permanent => SinkError::invalid(self.message),
            HandlerErrorKind::Unavailable => SinkError::unavailable(self.message),
        }
    }
}

impl From<sqlx::Error> for HandlerError {
    /// Lost connections and pool timeouts are the database being unavailable; anything else
    /// the database says (a deadlock, a constraint) is transient: retried within the budget.
    fn from(e: sqlx::Error) -> Self {
        let kind = match &e {
            sqlx::Error::Io(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::PoolClosed
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::WorkerCrashed => HandlerErrorKind::Unavailable,
            _ => HandlerErrorKind::Transient,
        };
        Self {
            kind,
            message: outbox_core::redact::sanitize(&e.to_string()),
        }
    }
}

impl From<outbox_core::Error> for HandlerError {
    fn from(e: outbox_core::Error) -> Self {
        let kind = match e.kind() {
            ErrorKind::Connection | ErrorKind::Timeout => HandlerErrorKind::Unavailable,
            ErrorKind::Malformed | ErrorKind::Config => HandlerErrorKind::Permanent,
            _ => HandlerErrorKind::Transient,
        };
        Self {
            kind,
            message: e.to_string(),
        }
    }
}

/// Handles messages of one type inside the processor's transaction, which also records the
/// message as processed: the handler's writes and that record commit together or not at all.
/// Write effects through `tx` only; anything done outside it (an HTTP call) may happen again
/// after a crash.
#[async_trait]
pub trait Handler<DB: sqlx::Database>: Send + Sync {
    /// Applies `message` in `tx`. An error rolls `tx` back.
    async fn handle(
        &self,
        tx: &mut Transaction<'static, DB>,
        message: &InboxMessage,
    ) -> Result<(), HandlerError>;
}

/// A [`Handler`] made of a closure (see [`Handlers::on_fn`]).
pub struct FnHandler<F>(F);

#[async_trait]
impl<DB, F> Handler<DB> for FnHandler<F>
where
    DB: sqlx::Database,
    F: for<'a> Fn(
            &'a mut Transaction<'static, DB>,
            &'a InboxMessage,
        ) -> BoxFuture<'a, Result<(), HandlerError>>
        + Send
        + Sync,
{
    async fn handle(
        &self,
        tx: &mut Transaction<'static, DB>,
        message: &InboxMessage,
    ) -> Result<(), HandlerError> {
        (self.0)(tx, message).await
    }
}

/// The handlers of a processor, by message type.
pub struct Handlers<DB: sqlx::Database> {
    by_type: HashMap<String, Arc<dyn Handler<DB>>>,
    fallback: Option<Arc<dyn Handler<DB>>>,
}

impl<DB: sqlx::Database> Default for Handlers<DB> {
    fn default() -> Self {
        Self {
            by_type: HashMap::new(),
            fallback: None,
        }
    }
}

impl<DB: sqlx::Database> Handlers<DB> {
    /// No handlers yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Handles messages whose type is `message_type` with `handler`.
    pub fn on(
        mut self,
        message_type: impl Into<String>,
        handler: impl Handler<DB> + 'static,
    ) -> Self {
        self.by_type.insert(message_type.into(), Arc::new(handler));
        self
    }

    /// Handles messages whose type is `message_type` with a closure:
    /// `|tx, message| Box::pin(async move { …; Ok(()) })`.
    pub fn on_fn<F>(self, message_type: impl Into<String>, handler: F) -> Self
    where
        F: for<'a> Fn(
                &'a mut Transaction<'static, DB>,
                &'a InboxMessage,
            ) -> BoxFuture<'a, Result<(), HandlerError>>
            + Send
            + Sync
            + 'static,
    {
        self.on(message_type, FnHandler(handler))
    }

    /// Handles messages of every type no [`Handlers::on`] names. Without it, such a message
    /// ends `failed` at once ("no handler for type …"), and is redriven once a handler exists.
    pub fn otherwise(mut self, handler: impl Handler<DB> + 'static) -> Self {
        self.fallback = Some(Arc::new(handler));
        self
    }

    fn get(&self, message_type: &str) -> Option<&Arc<dyn Handler<DB>>> {
        self.by_type.get(message_type).or(self.fallback.as_ref())
    }
}

/// What a group's transaction does around one message when it holds several.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Savepoint {
    /// Before the message: `SAVEPOINT`.
    Set,
    /// After it succeeded: `RELEASE SAVEPOINT`.
    Release,
    /// After it failed: `ROLLBACK TO SAVEPOINT` and release it, undoing its claim and effects
    /// and keeping the others'.
    Undo,
}

/// A backend the processor runs on: how it opens a handler's transaction and sets savepoints.
/// Every [`SqlxBackend`] is one (savepoints are spelled alike on each).
#[async_trait]
pub trait ProcessorBackend: SqlxBackend {
    /// Begins a transaction for a group of handlers: one that will write (SQLite: `BEGIN
    /// IMMEDIATE`, so it queues for the file's write lock at once rather than failing with
    /// `SQLITE_BUSY` half-way).
    async fn begin_handler(pool: &Pool<Self>) -> Result<Transaction<'static, Self>, sqlx::Error>;

    /// The savepoint statement `op` in `tx` (a name of its own, so a handler may use sqlx's
    /// nested transactions inside).
    async fn savepoint(
        tx: &mut Transaction<'static, Self>,
        op: Savepoint,
    ) -> Result<(), sqlx::Error>;
}

const SAVEPOINT_SET: &str = include_str!("../queries/savepoint_set.sql");
const SAVEPOINT_RELEASE: &str = include_str!("../queries/savepoint_release.sql");
const SAVEPOINT_ROLLBACK: &str = include_str!("../queries/savepoint_rollback.sql");

#[async_trait]
impl<DB> ProcessorBackend for DB
where
    DB: SqlxBackend,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'q> <DB as sqlx::Database>::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
{
    async fn begin_handler(pool: &Pool<Self>) -> Result<Transaction<'static, Self>, sqlx::Error> {
        DB::begin_writing(pool).await
    }

    async fn savepoint(
        tx: &mut Transaction<'static, Self>,
        op: Savepoint,
    ) -> Result<(), sqlx::Error> {
        let statements: &[&str] = match op {
            Savepoint::Set => &[SAVEPOINT_SET],
            Savepoint::Release => &[SAVEPOINT_RELEASE],
            Savepoint::Undo => &[SAVEPOINT_ROLLBACK, SAVEPOINT_RELEASE],
        };
        for sql in statements {
            sqlx::query(sql).execute(&mut **tx).await?;
        }
        Ok(())
    }
}

/// The relay's sink that runs handlers. A call's messages (at most one per key, handed over by
/// the relay) are split into groups of `per_transaction`, each group in one transaction, with
/// a savepoint around each message when it holds several, and up to `concurrency` groups at
/// once per call. A message's claim and effects commit together or not at all, whatever its
/// neighbours do; a group saves all but one commit per message.
///
/// The relay keeps several calls in flight per member, so the transactions of every call share
/// `workers × concurrency` slots: the pool sized for `workers × (concurrency + 2)` never runs
/// dry.
struct HandlerSink<DB: ProcessorBackend> {
    pool: Pool<DB>,
    schema: InboxSchema,
    handlers: Arc<Handlers<DB>>,
    concurrency: usize,
    per_transaction: usize,
    slots: Arc<tokio::sync::Semaphore>,
}

fn envelope_message(e: &Envelope) -> InboxMessage {
    let header = |name: &str| {
        e.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    InboxMessage {
        id: e.id,
        source: header(HEADER_AGGREGATE_TYPE),
        message_type: header(HEADER_EVENT_TYPE),
        key: e.key.clone(),
        payload: serde_json::from_slice(&e.payload).unwrap_or(serde_json::Value::Null),
        payload_format: PayloadFormat::Json,
        headers: serde_json::Map::new(),
        source_position: None,
        received_at: None,
    }
}

impl<DB: ProcessorBackend> HandlerSink<DB>
where
    for<'t> Transaction<'t, DB>: InboxTx,
{
    /// Claims and handles one message in `tx`. `Ok` also for a message handled before (its
    /// claim exists: the processor died before recording it).
    async fn handle(
        &self,
        tx: &mut Transaction<'static, DB>,
        e: &Envelope,
        rows: &mut HashMap<uuid::Uuid, InboxMessage>,
    ) -> Result<(), SinkError> {
        let fresh = tx
            .claim_message(&self.schema, PROCESSOR_CONSUMER, e.id)
            .await
            .map_err(|err| HandlerError::from(err).into_sink_error())?;
        if !fresh {
            return Ok(());
        }
        // The inbox row has the broker's headers; the queue row only what the engine needs.
        let message = rows.remove(&e.id).unwrap_or_else(|| envelope_message(e));
        let failure = |kind: &'static str| {
            metrics::counter!(crate::telemetry::HANDLER_FAILURES,
                "type" => message.message_type.clone(), "kind" => kind)
            .increment(1)
        };
        let Some(handler) = self.handlers.get(&message.message_type) else {
            failure("no_handler");
            return Err(SinkError::invalid(format!(
                "inbox: no handler for message type `{}`; register one and redrive",
                message.message_type
            )));
        };
        let started = std::time::Instant::now();
        let handled = crate::spans::process(&message, handler.handle(tx, &message)).await;
        metrics::histogram!(crate::telemetry::HANDLER_DURATION,
            "type" => message.message_type.clone())
        .record(started.elapsed().as_secs_f64());
        if let Err(e) = &handled {
            failure(match e.kind {
                HandlerErrorKind::Transient => "transient",
                HandlerErrorKind::Permanent => "permanent",
                HandlerErrorKind::Unavailable => "unavailable",
            });
        }
        handled.map_err(HandlerError::into_sink_error)
    }

    /// Handles `group` in one transaction; a result per message, final only once committed.
    async fn handle_group(&self, group: &[Envelope]) -> Vec<Result<(), SinkError>> {
        let all = |e: SinkError| group.iter().map(|_| Err(e.clone())).collect::<Vec<_>>();
        // Closed never: the semaphore lives as long as the sink.
        let Ok(_slot) = self.slots.acquire().await else {
            return all(SinkError::unavailable(
                "inbox: the processor is shutting down",
            ));
        };
        let mut tx = match DB::begin_handler(&self.pool).await {
            Ok(tx) => tx,
            Err(err) => return all(SinkError::unavailable(format!("inbox: begin: {err}"))),
        };
        let ids: Vec<uuid::Uuid> = group.iter().map(|e| e.id).collect();
        let mut rows = match tx.load_messages(&self.schema, &ids).await {
            Ok(rows) => rows,
            Err(err) => {
                let _ = tx.rollback().await;
                return all(HandlerError::from(err).into_sink_error());
            }
        };
        let savepoints = group.len() > 1;
        let mut results: Vec<Result<(), SinkError>> = Vec::with_capacity(group.len());
        for e in group {
            if savepoints {
                if let Err(err) = DB::savepoint(&mut tx, Savepoint::Set).await {
                    return all(SinkError::unavailable(format!("inbox: savepoint: {err}")));
                }
            }
            let result = self.handle(&mut tx, e, &mut rows).await;
            if savepoints {
                let op = if result.is_ok() {
                    Savepoint::Release
                } else {
                    Savepoint::Undo
                };
                if let Err(err) = DB::savepoint(&mut tx, op).await {
                    // The transaction is unusable: nothing of the group commits.
                    let _ = tx.rollback().await;
                    return all(SinkError::unavailable(format!("inbox: savepoint: {err}")));
                }
            }
            results.push(result);
        }
        if !results.iter().any(Result::is_ok) || (!savepoints && results.iter().any(Result::is_err))
        {
            let _ = tx.rollback().await;
            return results;
        }
        if let Err(err) = tx.commit().await {
            // Whether it committed is unknown: the retry's claims tell.
            let e = SinkError::unavailable(format!("inbox: commit: {err}"));
            return results.into_iter().map(|r| r.and(Err(e.clone()))).collect();
        }
        for (e, r) in group.iter().zip(&results) {
            if r.is_ok() {
                let kind = e
                    .headers
                    .iter()
                    .find(|(k, _)| k == HEADER_EVENT_TYPE)
                    .map(|(_, v)| v.clone())
                    .unwrap_or_default();
                metrics::counter!(crate::telemetry::HANDLED, "type" => kind).increment(1);
            }
        }
        results
    }
}

#[async_trait]
impl<DB: ProcessorBackend> Sink for HandlerSink<DB>
where
    for<'t> Transaction<'t, DB>: InboxTx,
{
    fn name(&self) -> &str {
        "inbox-handlers"
    }

    async fn publish(&self, batch: &[Envelope]) -> Vec<Result<(), SinkError>> {
        let groups: Vec<BoxFuture<'_, Vec<Result<(), SinkError>>>> = batch
            .chunks(self.per_transaction.max(1))
            .map(|g| Box::pin(self.handle_group(g)) as _)
            .collect();
        futures::stream::iter(groups)
            .buffered(self.concurrency.max(1))
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .flatten()
            .collect()
    }
}

/// How the processor claims, runs and retries.
#[derive(Debug, Clone)]
pub struct ProcessorConfig {
    /// Relay members in this process, each owning a share of the queue's partitions.
    pub workers: usize,
    /// Messages per claim.
    pub batch_size: usize,
    /// Transactions running at once per member (each holds a connection of the pool); the
    /// processor as a whole runs at most `workers × concurrency`.
    pub concurrency: usize,
    /// Messages handled in one transaction, each under a savepoint of its own (1: one
    /// transaction per message). A failed message is rolled back to its savepoint alone; a
    /// failed commit retries the whole group (claims absorb the ones that did commit, if the
    /// commit's fate was unknown). Fewer commits, more throughput; a group's effects become
    /// visible together.
    pub messages_per_transaction: usize,
    /// Partition lease: a dead processor's messages are taken over after it. A handler call
    /// (at most a quarter of a batch, at most one message per key) gets a third of it, then
    /// counts as failed.
    pub lease: Duration,
    /// Longest wait between polls when idle.
    pub poll_interval: Duration,
    /// Attempts and backoff per message.
    pub retry: RetryPolicy,
    /// How long the queue's passed storage, and processed inbox rows and claims, are kept.
    /// Must exceed the source's longest redelivery window (docs/consumers.md).
    pub retention: Duration,
    /// Prefix of member ids, for `outbox status`.
    pub member_prefix: String,
}

/// Default messages per handler transaction.
pub const DEFAULT_MESSAGES_PER_TRANSACTION: usize = 20;

/// Default retention of processed inbox rows and claims: 7 days.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

impl Default for ProcessorConfig {
    fn default() -> Self {
        Self {
            workers: 2,
            batch_size: 100,
            concurrency: 8,
            messages_per_transaction: DEFAULT_MESSAGES_PER_TRANSACTION,
            lease: Duration::from_secs(30),
            poll_interval: Duration::from_millis(100),
            retry: RetryPolicy::default(),
            retention: DEFAULT_RETENTION,
            member_prefix: format!("inbox-{}", std::process::id()),
        }
    }
}

impl ProcessorConfig {
    /// The handler transactions the whole processor runs at once: `concurrency` per member.
    fn transaction_slots(&self) -> Arc<tokio::sync::Semaphore> {
        Arc::new(tokio::sync::Semaphore::new(
            self.workers.max(1) * self.concurrency.max(1),
        ))
    }

    fn relay(&self) -> RelayConfig {
        RelayConfig {
            batch_size: self.batch_size.max(1),
            workers: self.workers.max(1),
            poll_interval: self.poll_interval,
            lease: self.lease,
            retry: self.retry,
            retention: self.retention,
            // Nothing is published anywhere: a fixed destination passes the relay's rules
            // whatever the message types look like.
            destination: DestinationTemplate::parse("inbox").unwrap_or_default(),
            member_prefix: self.member_prefix.clone(),
            ..RelayConfig::default()
        }
    }
}

/// Runs handlers over an inbox's processing queue. See the module documentation.
pub struct InboxProcessor {
    relay: Relay,
    /// The inbox, for the retention of its tables.
    db: InboxDatabase,
    retention: Duration,
}

impl InboxProcessor {
    /// A processor of the PostgreSQL inbox in `schema` (migrated by
    /// [`crate::migrate_postgres`]), with `pool` for the queue and the handlers' transactions
    /// (size it for `workers × (concurrency + 2)`).
    pub fn postgres(
        pool: PgPool,
        schema: InboxSchema,
        handlers: Handlers<Postgres>,
        config: ProcessorConfig,
    ) -> outbox_core::Result<Self> {
        Self::new(pool, schema, handlers, config)
    }

    /// A processor of the MySQL/MariaDB inbox in the databases of `schema` (migrated by
    /// [`crate::migrate_mysql`]), with `pool` for the queue and the handlers' transactions
    /// (size it for `workers × (concurrency + 2)`). Handlers' transactions run at the pool's
    /// isolation level; the MySQL pools `outbox-db` opens run `READ COMMITTED` sessions.
    pub fn mysql(
        pool: MySqlPool,
        schema: InboxSchema,
        handlers: Handlers<MySql>,
        config: ProcessorConfig,
    ) -> outbox_core::Result<Self> {
        Self::new(pool, schema, handlers, config)
    }

    /// A processor of the SQLite inbox in the file `pool` opened (migrated by
    /// [`crate::migrate_sqlite`]). SQLite runs one writing transaction at a time, so handlers
    /// effectively run one after another whatever `concurrency` says.
    pub fn sqlite(
        pool: SqlitePool,
        handlers: Handlers<Sqlite>,
        config: ProcessorConfig,
    ) -> outbox_core::Result<Self> {
        Self::new(pool, InboxSchema::default(), handlers, config)
    }

    /// A processor of the inbox in `schema` of the database `pool` connects to, on any
    /// backend ([`InboxProcessor::postgres`] and [`InboxProcessor::sqlite`] name theirs).
    pub fn new<DB: ProcessorBackend>(
        pool: Pool<DB>,
        schema: InboxSchema,
        handlers: Handlers<DB>,
        config: ProcessorConfig,
    ) -> outbox_core::Result<Self>
    where
        for<'t> Transaction<'t, DB>: InboxTx,
    {
        let db = InboxDatabase::from_pool(pool.clone(), schema.clone())?;
        let sink = Arc::new(HandlerSink {
            pool,
            schema,
            handlers: Arc::new(handlers),
            concurrency: config.concurrency,
            per_transaction: config.messages_per_transaction,
            slots: config.transaction_slots(),
        });
        Ok(Self {
            relay: Relay::new(db.queue(), sink, config.relay()),
            db,
            retention: config.retention,
        })
    }

    /// Counters, live while it runs: `published` counts messages handled (or found handled).
    pub fn metrics(&self) -> Arc<RelayMetrics> {
        self.relay.metrics()
    }

    /// Runs until `shutdown` is cancelled, then finishes the handlers in flight, records them
    /// and returns. Every minute it also deletes processed inbox rows and claims older than
    /// the retention.
    pub async fn run(self, shutdown: CancellationToken) {
        let retention = self.retention;
        let db = self.db;
        let stop = shutdown.clone();
        let housekeeping = tokio::spawn(async move {
            loop {
                let done = db.purge(retention).await;
                match done {
                    Ok(p) if p.total() > 0 => info!(?p, "inbox rows past retention deleted"),
                    Ok(_) => {}
                    Err(error) => warn!(%error, "inbox retention failed; will try again"),
                }
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(60)) => {}
                    _ = stop.cancelled() => return,
                }
            }
        });
        self.relay.run(shutdown).await;
        housekeeping.abort();
    }
}
