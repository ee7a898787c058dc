//! [`InboxTx`]: what the receiving side does inside a caller's transaction, on PostgreSQL and on
//! SQLite (here) and on MySQL ([`crate::mysql`]). Every function of this crate that takes
//! `&mut tx` takes any `InboxTx`: an `sqlx::Transaction` of `Postgres`, `Sqlite` or `MySql`.

use std::collections::HashMap;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use outbox_core::{Error, ErrorKind, NewMessage, Result};
use outbox_db::{Backend, SqlxBackend, SqlxTransaction};
use sqlx::{Postgres, Row, Sqlite, Transaction};
use uuid::Uuid;

use crate::database::places;
use crate::message::{InboxMessage, PayloadFormat};
use crate::tables::InboxSchema;

const PG_CLAIM: &str = include_str!("../queries/postgres/claim.sql");
const PG_INGEST: &str = include_str!("../queries/postgres/ingest.sql");
const PG_LOAD: &str = include_str!("../queries/postgres/load.sql");
const PG_IDEM_LOCK: &str = include_str!("../queries/postgres/idempotency_lock.sql");
const PG_IDEM_GET: &str = include_str!("../queries/postgres/idempotency_get.sql");
const PG_IDEM_PUT: &str = include_str!("../queries/postgres/idempotency_put.sql");

const SQLITE_CLAIM: &str = include_str!("../queries/sqlite/claim.sql");
const SQLITE_INGEST: &str = include_str!("../queries/sqlite/ingest.sql");
const SQLITE_LOAD: &str = include_str!("../queries/sqlite/load.sql");
const SQLITE_IDEM_GET: &str = include_str!("../queries/sqlite/idempotency_get.sql");
const SQLITE_IDEM_PUT: &str = include_str!("../queries/sqlite/idempotency_put.sql");

/// A stored idempotency key: the first request's fingerprint, result and events.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredKey {
    /// The first request's fingerprint.
    pub fingerprint: String,
    /// Its result.
    pub result: serde_json::Value,
    /// The ids of the events it enqueued.
    pub events: Vec<Uuid>,
}

/// A database transaction the receiving side can work in: PostgreSQL's, MySQL's or SQLite's.
/// Implemented for `sqlx::Transaction<'_, Postgres>`, `sqlx::Transaction<'_, MySql>`,
/// `sqlx::Transaction<'_, Sqlite>` and [`outbox_db::Transaction`] (any, by its backend); the
/// `schema` argument names the PostgreSQL schemas or the MySQL databases (SQLite's tables
/// have fixed names and ignore it).
///
/// Callers use the functions of the crate ([`crate::claim`], [`crate::ingest`],
/// [`crate::idempotent`], or the same on [`crate::Inbox`]); these methods are their parts.
#[async_trait]
pub trait InboxTx: Send {
    /// Inserts `(consumer, id)` into `processed_messages`; true when this call inserted it.
    async fn claim_message(
        &mut self,
        schema: &InboxSchema,
        consumer: &str,
        id: Uuid,
    ) -> Result<bool>;

    /// Inserts `messages` into `inbox_messages`, skipping ids already there, and queues the
    /// inserted ones for processing, in order. Returns, per message, whether it was inserted.
    async fn ingest_messages(
        &mut self,
        schema: &InboxSchema,
        messages: &[InboxMessage],
    ) -> Result<Vec<bool>>;

    /// The inbox rows of `ids` (one statement), by id; ids without a row are left out.
    async fn load_messages(
        &mut self,
        schema: &InboxSchema,
        ids: &[Uuid],
    ) -> Result<HashMap<Uuid, InboxMessage>>;

    /// Takes the transaction-level lock of idempotency key `key`. PostgreSQL tries without
    /// waiting and answers false when another transaction holds it (a request under that key
    /// is in progress); SQLite and MySQL wait for that transaction to end and answer true.
    async fn lock_key(&mut self, schema: &InboxSchema, key: &str) -> Result<bool>;

    /// The stored result of idempotency key `key`.
    async fn stored_key(&mut self, schema: &InboxSchema, key: &str) -> Result<Option<StoredKey>>;

    /// Stores the first result of `key`.
    async fn store_key(
        &mut self,
        schema: &InboxSchema,
        key: &str,
        stored: &StoredKey,
    ) -> Result<()>;

    /// Enqueues `events` into the application's outbox through the backend's writer.
    async fn enqueue_events(&mut self, schema: &InboxSchema, events: &[NewMessage]) -> Result<()>;
}

fn pg_err(what: &str) -> impl Fn(sqlx::Error) -> Error + '_ {
    move |e| Postgres::map_error(what, e)
}

fn sqlite_err(what: &str) -> impl Fn(sqlx::Error) -> Error + '_ {
    move |e| Sqlite::map_error(what, e)
}

/// The queue row of an inbox message: an outbox message of the queue's table set, with the
/// same id, the source as aggregate type, the key as aggregate id and the type as event type.
/// Headers stay in the inbox row (a broker's headers may not pass the relay's header rules).
pub(crate) fn queue_row(m: &InboxMessage) -> NewMessage {
    NewMessage {
        id: m.id,
        aggregate_type: m.source.clone(),
        aggregate_id: m.key.clone(),
        event_type: m.message_type.clone(),
        payload: m.payload.clone(),
        headers: serde_json::Map::new(),
        topic: None,
    }
}

/// The messages of `messages` that `inserted` marks, first occurrence of each id only.
pub(crate) fn inserted_in_order<'a>(
    messages: &'a [InboxMessage],
    inserted: &std::collections::HashSet<Uuid>,
) -> (Vec<&'a InboxMessage>, Vec<bool>) {
    let mut seen = std::collections::HashSet::new();
    let mut fresh = Vec::new();
    let mut flags = Vec::with_capacity(messages.len());
    for m in messages {
        let new = inserted.contains(&m.id) && seen.insert(m.id);
        if new {
            fresh.push(m);
        }
        flags.push(new);
    }
    (fresh, flags)
}

pub(crate) fn headers_map(text: &str) -> serde_json::Map<String, serde_json::Value> {
    match serde_json::from_str(text) {
        Ok(serde_json::Value::Object(map)) => map,
        _ => serde_json::Map::new(),
    }
}

pub(crate) fn malformed(what: String) -> Error {
    Error::new(ErrorKind::Malformed, what)
}

/// An inbox message id stored as text (SQLite, MySQL).
pub(crate) fn text_id(text: &str) -> Result<Uuid> {
    text.parse()
        .map_err(|e| malformed(format!("inbox message id `{text}`: {e}")))
}

/// An inbox row as the message: the columns every backend reads alike (as text), once the
/// backend read the id and the receiving time, which each stores its own way.
pub(crate) fn message_from_row<R>(
    r: &R,
    id: Uuid,
    received_at: DateTime<Utc>,
    err: &dyn Fn(sqlx::Error) -> Error,
) -> Result<InboxMessage>
where
    R: Row,
    for<'c> &'c str: sqlx::ColumnIndex<R>,
    String: for<'r> sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    let text = |name: &str| r.try_get::<String, _>(name).map_err(err);
    let payload = text("payload")?;
    Ok(InboxMessage {
        id,
        source: text("source")?,
        message_type: text("type")?,
        key: text("key")?,
        payload: serde_json::from_str(&payload)
            .map_err(|e| malformed(format!("inbox message {id}: payload: {e}")))?,
        payload_format: PayloadFormat::parse(&text("payload_format")?),
        headers: headers_map(&text("headers")?),
        source_position: r
            .try_get::<Option<String>, _>("source_position")
            .map_err(err)?,
        received_at: Some(received_at),
    })
}

#[async_trait]
impl InboxTx for Transaction<'_, Postgres> {
    async fn claim_message(
        &mut self,
        schema: &InboxSchema,
        consumer: &str,
        id: Uuid,
    ) -> Result<bool> {
        let done = sqlx::query(&schema.render(PG_CLAIM))
            .bind(consumer)
            .bind(id)
            .execute(&mut **self)
            .await
            .map_err(pg_err("claiming a message in processed_messages"))?;
        Ok(done.rows_affected() == 1)
    }

    async fn ingest_messages(
        &mut self,
        schema: &InboxSchema,
        messages: &[InboxMessage],
    ) -> Result<Vec<bool>> {
        if messages.is_empty() {
            return Ok(Vec::new());
        }
        let n = messages.len();
        let mut cols: (Vec<Uuid>, Vec<&str>, Vec<&str>, Vec<&str>) = (
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
        );
        let mut more: (Vec<String>, Vec<&str>, Vec<String>, Vec<Option<&str>>) = (
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
        );
        for m in messages {
            cols.0.push(m.id);
            cols.1.push(&m.source);
            cols.2.push(&m.message_type);
            cols.3.push(&m.key);
            more.0.push(m.payload.to_string());
            more.1.push(m.payload_format.as_str());
            more.2
                .push(serde_json::Value::Object(m.headers.clone()).to_string());
            more.3.push(m.source_position.as_deref());
        }
        let inserted: std::collections::HashSet<Uuid> =
            sqlx::query_scalar::<_, Uuid>(&schema.render(PG_INGEST))
                .bind(&cols.0)
                .bind(&cols.1)
                .bind(&cols.2)
                .bind(&cols.3)
                .bind(&more.0)
                .bind(&more.1)
                .bind(&more.2)
                .bind(&more.3)
                .fetch_all(&mut **self)
                .await
                .map_err(pg_err("recording messages in inbox_messages"))?
                .into_iter()
                .collect();
        let (fresh, flags) = inserted_in_order(messages, &inserted);
        if !fresh.is_empty() {
            let rows: Vec<NewMessage> = fresh.into_iter().map(queue_row).collect();
            let (_, queue) = places(Backend::Postgres, schema);
            Postgres::enqueue_many(self, queue, &rows).await?;
        }
        Ok(flags)
    }

    async fn load_messages(
        &mut self,
        schema: &InboxSchema,
        ids: &[Uuid],
    ) -> Result<HashMap<Uuid, InboxMessage>> {
        let err = pg_err("reading inbox messages");
        let rows = sqlx::query(&schema.render(PG_LOAD))
            .bind(ids)
            .fetch_all(&mut **self)
            .await
            .map_err(&err)?;
        let mut out = HashMap::with_capacity(rows.len());
        for r in rows {
            let id: Uuid = r.try_get("id").map_err(&err)?;
            let received = r.try_get("received_at").map_err(&err)?;
            out.insert(id, message_from_row(&r, id, received, &err)?);
        }
        Ok(out)
    }

    async fn lock_key(&mut self, schema: &InboxSchema, key: &str) -> Result<bool> {
        sqlx::query_scalar(PG_IDEM_LOCK)
            .bind(schema.tables().as_str())
            .bind(key)
            .fetch_one(&mut **self)
            .await
            .map_err(pg_err("locking an idempotency key"))
    }

    async fn stored_key(&mut self, schema: &InboxSchema, key: &str) -> Result<Option<StoredKey>> {
        let err = pg_err("reading an idempotency key");
        let Some(r) = sqlx::query(&schema.render(PG_IDEM_GET))
            .bind(key)
            .fetch_optional(&mut **self)
            .await
            .map_err(&err)?
        else {
            return Ok(None);
        };
        let result: String = r.try_get("result").map_err(&err)?;
        Ok(Some(StoredKey {
            fingerprint: r.try_get("fingerprint").map_err(&err)?,
            result: serde_json::from_str(&result)
                .map_err(|e| malformed(format!("idempotency key result: {e}")))?,
            events: r.try_get("events").map_err(&err)?,
        }))
    }

    async fn store_key(
        &mut self,
        schema: &InboxSchema,
        key: &str,
        stored: &StoredKey,
    ) -> Result<()> {
        sqlx::query(&schema.render(PG_IDEM_PUT))
            .bind(key)
            .bind(&stored.fingerprint)
            .bind(stored.result.to_string())
            .bind(&stored.events)
            .execute(&mut **self)
            .await
            .map_err(pg_err("storing an idempotency key"))?;
        Ok(())
    }

    async fn enqueue_events(&mut self, schema: &InboxSchema, events: &[NewMessage]) -> Result<()> {
        let (tables, _) = places(Backend::Postgres, schema);
        Postgres::enqueue_many(self, tables, events).await
    }
}

/// RFC 3339 text written by SQLite's `strftime` as a time.
fn sqlite_time(text: &str) -> Result<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(text)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| malformed(format!("`{text}` is not a time: {e}")))
}

#[async_trait]
impl InboxTx for Transaction<'_, Sqlite> {
    async fn claim_message(
        &mut self,
        _schema: &InboxSchema,
        consumer: &str,
        id: Uuid,
    ) -> Result<bool> {
        let done = sqlx::query(SQLITE_CLAIM)
            .bind(consumer)
            .bind(id.to_string())
            .execute(&mut **self)
            .await
            .map_err(sqlite_err("claiming a message in processed_messages"))?;
        Ok(done.rows_affected() == 1)
    }

    async fn ingest_messages(
        &mut self,
        schema: &InboxSchema,
        messages: &[InboxMessage],
    ) -> Result<Vec<bool>> {
        if messages.is_empty() {
            return Ok(Vec::new());
        }
        let rows: Vec<_> = messages
            .iter()
            .map(|m| {
                serde_json::json!([
                    m.id.to_string(),
                    m.source,
                    m.message_type,
                    m.key,
                    m.payload.to_string(),
                    m.payload_format.as_str(),
                    serde_json::Value::Object(m.headers.clone()).to_string(),
                    m.source_position,
                ])
            })
            .collect();
        let inserted: std::collections::HashSet<Uuid> =
            sqlx::query_scalar::<_, String>(SQLITE_INGEST)
                .bind(serde_json::Value::from(rows).to_string())
                .fetch_all(&mut **self)
                .await
                .map_err(sqlite_err("recording messages in inbox_messages"))?
                .iter()
                .filter_map(|id| id.parse().ok())
                .collect();
        let (fresh, flags) = inserted_in_order(messages, &inserted);
        if !fresh.is_empty() {
            let rows: Vec<NewMessage> = fresh.into_iter().map(queue_row).collect();
            let (_, queue) = places(Backend::Sqlite, schema);
            Sqlite::enqueue_many(self, queue, &rows).await?;
        }
        Ok(flags)
    }

    async fn load_messages(
        &mut self,
        _schema: &InboxSchema,
        ids: &[Uuid],
    ) -> Result<HashMap<Uuid, InboxMessage>> {
        let err = sqlite_err("reading inbox messages");
        let list: Vec<String> = ids.iter().map(Uuid::to_string).collect();
        let rows = sqlx::query(SQLITE_LOAD)
            .bind(serde_json::Value::from(list).to_string())
            .fetch_all(&mut **self)
            .await
            .map_err(&err)?;
        let mut out = HashMap::with_capacity(rows.len());
        for r in rows {
            let id = text_id(&r.try_get::<String, _>("id").map_err(&err)?)?;
            let received = sqlite_time(&r.try_get::<String, _>("received_at").map_err(&err)?)?;
            out.insert(id, message_from_row(&r, id, received, &err)?);
        }
        Ok(out)
    }

    /// SQLite runs one writing transaction at a time, and the caller's began `IMMEDIATE` (it
    /// holds the file's write lock): no other request can be in progress inside the database.
    async fn lock_key(&mut self, _schema: &InboxSchema, _key: &str) -> Result<bool> {
        Ok(true)
    }

    async fn stored_key(&mut self, _schema: &InboxSchema, key: &str) -> Result<Option<StoredKey>> {
        let err = sqlite_err("reading an idempotency key");
        let Some(r) = sqlx::query(SQLITE_IDEM_GET)
            .bind(key)
            .fetch_optional(&mut **self)
            .await
            .map_err(&err)?
        else {
            return Ok(None);
        };
        let result: String = r.try_get("result").map_err(&err)?;
        let events: String = r.try_get("events").map_err(&err)?;
        Ok(Some(StoredKey {
            fingerprint: r.try_get("fingerprint").map_err(&err)?,
            result: serde_json::from_str(&result)
                .map_err(|e| malformed(format!("idempotency key result: {e}")))?,
            events: serde_json::from_str(&events)
                .map_err(|e| malformed(format!("idempotency key events: {e}")))?,
        }))
    }

    async fn store_key(
        &mut self,
        _schema: &InboxSchema,
        key: &str,
        stored: &StoredKey,
    ) -> Result<()> {
        let events = serde_json::to_string(&stored.events)
            .map_err(|e| Error::with_source(ErrorKind::Other, "encoding event ids", e))?;
        sqlx::query(SQLITE_IDEM_PUT)
            .bind(key)
            .bind(&stored.fingerprint)
            .bind(stored.result.to_string())
            .bind(events)
            .execute(&mut **self)
            .await
            .map_err(sqlite_err("storing an idempotency key"))?;
        Ok(())
    }

    async fn enqueue_events(&mut self, schema: &InboxSchema, events: &[NewMessage]) -> Result<()> {
        let (tables, _) = places(Backend::Sqlite, schema);
        Sqlite::enqueue_many(self, tables, events).await
    }
}

/// Whichever backend the transaction is on, through its own impl.
#[async_trait]
impl InboxTx for outbox_db::Transaction<'_> {
    async fn claim_message(
        &mut self,
        schema: &InboxSchema,
        consumer: &str,
        id: Uuid,
    ) -> Result<bool> {
        match self.sqlx() {
            SqlxTransaction::Postgres(tx) => tx.claim_message(schema, consumer, id).await,
            SqlxTransaction::Sqlite(tx) => tx.claim_message(schema, consumer, id).await,
            SqlxTransaction::Mysql(tx) => tx.claim_message(schema, consumer, id).await,
        }
    }

    async fn ingest_messages(
        &mut self,
        schema: &InboxSchema,
        messages: &[InboxMessage],
    ) -> Result<Vec<bool>> {
        match self.sqlx() {
            SqlxTransaction::Postgres(tx) => tx.ingest_messages(schema, messages).await,
            SqlxTransaction::Sqlite(tx) => tx.ingest_messages(schema, messages).await,
            SqlxTransaction::Mysql(tx) => tx.ingest_messages(schema, messages).await,
        }
    }

    async fn load_messages(
        &mut self,
        schema: &InboxSchema,
        ids: &[Uuid],
    ) -> Result<HashMap<Uuid, InboxMessage>> {
        match self.sqlx() {
            SqlxTransaction::Postgres(tx) => tx.load_messages(schema, ids).await,
            SqlxTransaction::Sqlite(tx) => tx.load_messages(schema, ids).await,
            SqlxTransaction::Mysql(tx) => tx.load_messages(schema, ids).await,
        }
    }

    async fn lock_key(&mut self, schema: &InboxSchema, key: &str) -> Result<bool> {
        match self.sqlx() {
            SqlxTransaction::Postgres(tx) => tx.lock_key(schema, key).await,
            SqlxTransaction::Sqlite(tx) => tx.lock_key(schema, key).await,
            SqlxTransaction::Mysql(tx) => tx.lock_key(schema, key).await,
        }
    }

    async fn stored_key(&mut self, schema: &InboxSchema, key: &str) -> Result<Option<StoredKey>> {
        match self.sqlx() {
            SqlxTransaction::Postgres(tx) => tx.stored_key(schema, key).await,
            SqlxTransaction::Sqlite(tx) => tx.stored_key(schema, key).await,
            SqlxTransaction::Mysql(tx) => tx.stored_key(schema, key).await,
        }
    }

    async fn store_key(
        &mut self,
        schema: &InboxSchema,
        key: &str,
        stored: &StoredKey,
    ) -> Result<()> {
        match self.sqlx() {
            SqlxTransaction::Postgres(tx) => tx.store_key(schema, key, stored).await,
            SqlxTransaction::Sqlite(tx) => tx.store_key(schema, key, stored).await,
            SqlxTransaction::Mysql(tx) => tx.store_key(schema, key, stored).await,
        }
    }

    async fn enqueue_events(&mut self, schema: &InboxSchema, events: &[NewMessage]) -> Result<()> {
        match self.sqlx() {
            SqlxTransaction::Postgres(tx) => tx.enqueue_events(schema, events).await,
            SqlxTransaction::Sqlite(tx) => tx.enqueue_events(schema, events).await,
            SqlxTransaction::Mysql(tx) => tx.enqueue_events(schema, events).await,
        }
    }
}
