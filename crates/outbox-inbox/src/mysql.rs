//! [`InboxTx`] on MySQL/MariaDB: the receiving side's statements in a caller's
//! `sqlx::Transaction<MySql>`, within what MySQL 8.0 and MariaDB 10.6+ both accept (no
//! `RETURNING`, no `LIMIT` in an `IN` subquery). Tested on MariaDB 10.11.
//!
//! Three things differ from PostgreSQL, each for a MySQL reason:
//! - **Ingest** cannot learn from one statement which ids it inserted. It reads which ids of
//!   the batch are already there, inserts the rest, and, should another transaction insert
//!   one of them in between (a duplicate-key error, which undoes that statement only), reads
//!   again with a locking read, which waits for that transaction and sees its commit.
//! - **The dedupe claim** is `INSERT IGNORE`: `ON DUPLICATE KEY UPDATE` would count a row
//!   found as affected (sqlx connects with `CLIENT_FOUND_ROWS`). `IGNORE` also turns a value
//!   too long into a warning, so lengths are checked first and refused as errors.
//! - **An idempotency key in progress** is a locked row of `idempotency_key_locks`, not an
//!   advisory lock (`GET_LOCK` belongs to the session and would outlive the transaction). A
//!   second request waits for the first to end, then replays its result; one that waits past
//!   `innodb_lock_wait_timeout` (or is chosen as a deadlock victim) is told "in progress", as
//!   on PostgreSQL. The row's `stored` flag says whether `idempotency_keys` holds the result,
//!   so that table is read only where the row exists: no locking read of a missing row, which
//!   would lock a gap under REPEATABLE READ and deadlock two new keys.
//!
//! Ids are bound as lower-case hyphenated text (the columns are `CHAR(36)`; sqlx would bind a
//! `Uuid` as 16 bytes).

use std::collections::{HashMap, HashSet};

use async_trait::async_trait;
use chrono::NaiveDateTime;
use outbox_core::{Error, ErrorKind, NewMessage, Result};
use outbox_db::{Backend, SqlxBackend};
use sqlx::{MySql, QueryBuilder, Row, Transaction};
use uuid::Uuid;

use crate::database::places;
use crate::message::InboxMessage;
use crate::tables::InboxSchema;
use crate::tx::{
    inserted_in_order, malformed, message_from_row, queue_row, text_id, InboxTx, StoredKey,
};

/// The longest source, type, key, consumer, idempotency key or source position the MySQL
/// tables hold (`VARCHAR(255)`, as the queue's columns they are copied into).
pub const MAX_NAME_CHARS: usize = 255;

/// Rows per statement: eight placeholders a row, far below MySQL's 65,535.
const ROWS_PER_STATEMENT: usize = 1000;

const CLAIM: &str = include_str!("../queries/mysql/claim.sql");
const INGEST: &str = include_str!("../queries/mysql/ingest.sql");
const EXISTING_HEAD: &str = include_str!("../queries/mysql/existing_head.sql");
const EXISTING_LOCKING_TAIL: &str = include_str!("../queries/mysql/existing_locking_tail.sql");
// Text columns are cast: sqlx reads a `utf8mb4_bin` column as binary.
const LOAD: &str = include_str!("../queries/mysql/load.sql");
// One exclusive statement: requests under a key queue on it (an `INSERT IGNORE` and then a
// `FOR UPDATE` would have two waiters each holding a shared lock and both upgrading).
const KEY_LOCK: &str = include_str!("../queries/mysql/idempotency_lock.sql");
// Locking reads: they read the latest committed rows whatever the caller's snapshot, so a
// request that waited for another under the same key sees what that one stored. The second
// runs only when the first says the row exists, so it locks that row and no gap.
const KEY_STORED: &str = include_str!("../queries/mysql/idempotency_stored.sql");
const KEY_GET: &str = include_str!("../queries/mysql/idempotency_get.sql");
const KEY_PUT: &str = include_str!("../queries/mysql/idempotency_put.sql");
const KEY_MARK: &str = include_str!("../queries/mysql/idempotency_mark.sql");

/// ER_LOCK_WAIT_TIMEOUT and ER_LOCK_DEADLOCK: another request under the key held it too long.
const LOCK_NOT_TAKEN: [u16; 2] = [1205, 1213];

/// The longest fingerprint `idempotency_keys` holds (`TEXT`, in bytes).
const MAX_FINGERPRINT_BYTES: usize = 65_535;

fn err(what: &str) -> impl Fn(sqlx::Error) -> Error + '_ {
    move |e| MySql::map_error(what, e)
}

/// Refuses `value` longer than [`MAX_NAME_CHARS`]: MySQL would cut it (under `IGNORE`) or fail
/// the whole statement, and a key cut short is another key.
fn fits(what: &str, value: &str) -> Result<()> {
    let n = value.chars().count();
    if n > MAX_NAME_CHARS {
        return Err(malformed(format!(
            "{what} has {n} characters; the inbox on MySQL keeps at most {MAX_NAME_CHARS}"
        )));
    }
    Ok(())
}

/// [`fits`], and refuses a trailing space in a name that is a primary key: the tables'
/// collation (`utf8mb4_bin`, PAD SPACE) ignores trailing spaces, so `"a "` would be `"a"`.
fn fits_as_key(what: &str, value: &str) -> Result<()> {
    fits(what, value)?;
    if value.ends_with(' ') {
        return Err(malformed(format!(
            "{what} `{value}` ends in a space, which MySQL's collation ignores (it would be \
             the same as `{}`): trim it",
            value.trim_end_matches(' ')
        )));
    }
    Ok(())
}

fn lock_not_taken(e: &sqlx::Error) -> bool {
    e.as_database_error()
        .and_then(|d| d.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>())
        .is_some_and(|d| LOCK_NOT_TAKEN.contains(&d.number()))
}

fn check_message(m: &InboxMessage) -> Result<()> {
    let id = m.id;
    fits(&format!("the source of message {id}"), &m.source)?;
    fits(&format!("the type of message {id}"), &m.message_type)?;
    fits(&format!("the key of message {id}"), &m.key)?;
    if let Some(p) = &m.source_position {
        fits(&format!("the source position of message {id}"), p)?;
    }
    Ok(())
}

/// `(?, ?, …)` for `n` values, closing an `IN (` already written.
fn push_ids<'a>(q: &mut QueryBuilder<'a, MySql>, ids: impl Iterator<Item = String>) {
    let mut each = q.separated(", ");
    for id in ids {
        each.push_bind(id);
    }
    q.push(")");
}

/// The ids of `batch` already in `inbox_messages`. `locking` reads the latest committed rows
/// (waiting for a transaction that inserted one of them to end), whatever the snapshot.
async fn existing(
    tx: &mut Transaction<'_, MySql>,
    schema: &InboxSchema,
    batch: &[&InboxMessage],
    locking: bool,
) -> Result<HashSet<Uuid>> {
    let mut q = QueryBuilder::<MySql>::new(schema.render(EXISTING_HEAD));
    push_ids(&mut q, batch.iter().map(|m| m.id.to_string()));
    if locking {
        q.push(EXISTING_LOCKING_TAIL);
    }
    let ids: Vec<String> = q
        .build_query_scalar()
        .fetch_all(&mut **tx)
        .await
        .map_err(err("reading which messages the inbox has"))?;
    Ok(ids.iter().filter_map(|id| id.parse().ok()).collect())
}

/// Inserts `batch` into `inbox_messages`, in order, in one statement.
async fn insert(
    tx: &mut Transaction<'_, MySql>,
    schema: &InboxSchema,
    batch: &[&InboxMessage],
) -> std::result::Result<(), sqlx::Error> {
    let mut q = QueryBuilder::<MySql>::new(schema.render(INGEST));
    q.push_values(batch, |mut row, m| {
        row.push_bind(m.id.to_string())
            .push_bind(m.source.as_str())
            .push_bind(m.message_type.as_str())
            .push_bind(m.key.as_str())
            .push_bind(m.payload.to_string())
            .push_bind(m.payload_format.as_str())
            .push_bind(serde_json::Value::Object(m.headers.clone()).to_string())
            .push_bind(m.source_position.as_deref());
    });
    q.build().execute(&mut **tx).await.map(drop)
}

/// Records the messages of `chunk` the inbox does not have yet; returns their ids. A
/// duplicate-key error (another transaction inserted one of them after this one looked) is
/// answered by looking again with a locking read; a third conflict in a row is returned.
async fn record_new(
    tx: &mut Transaction<'_, MySql>,
    schema: &InboxSchema,
    chunk: &[&InboxMessage],
) -> Result<Vec<Uuid>> {
    let mut todo = chunk.to_vec();
    let mut attempt = 0;
    loop {
        let have = existing(tx, schema, &todo, attempt > 0).await?;
        todo.retain(|m| !have.contains(&m.id));
        if todo.is_empty() {
            return Ok(Vec::new());
        }
        match insert(tx, schema, &todo).await {
            Ok(()) => return Ok(todo.iter().map(|m| m.id).collect()),
            Err(e) if crate::effects::is_duplicate(&e) && attempt < 2 => attempt += 1,
            Err(e) => return Err(err("recording messages in inbox_messages")(e)),
        }
    }
}

#[async_trait]
impl InboxTx for Transaction<'_, MySql> {
    async fn claim_message(
        &mut self,
        schema: &InboxSchema,
        consumer: &str,
        id: Uuid,
    ) -> Result<bool> {
        fits_as_key("a consumer name", consumer)?;
        let done = sqlx::query(&schema.render(CLAIM))
            .bind(consumer)
            .bind(id.to_string())
            .execute(&mut **self)
            .await
            .map_err(err("claiming a message in processed_messages"))?;
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
        for m in messages {
            check_message(m)?;
        }
        // First occurrence of each id: a duplicate within the batch is skipped like a
        // redelivery.
        let mut seen = HashSet::new();
        let candidates: Vec<&InboxMessage> =
            messages.iter().filter(|m| seen.insert(m.id)).collect();
        let mut inserted = HashSet::new();
        for chunk in candidates.chunks(ROWS_PER_STATEMENT) {
            inserted.extend(record_new(self, schema, chunk).await?);
        }
        let (fresh, flags) = inserted_in_order(messages, &inserted);
        if !fresh.is_empty() {
            let rows: Vec<NewMessage> = fresh.into_iter().map(queue_row).collect();
            let (_, queue) = places(Backend::Mysql, schema);
            MySql::enqueue_many(self, queue, &rows).await?;
        }
        Ok(flags)
    }

    async fn load_messages(
        &mut self,
        schema: &InboxSchema,
        ids: &[Uuid],
    ) -> Result<HashMap<Uuid, InboxMessage>> {
        let err = err("reading inbox messages");
        let mut out = HashMap::with_capacity(ids.len());
        for chunk in ids.chunks(ROWS_PER_STATEMENT) {
            let mut q = QueryBuilder::<MySql>::new(schema.render(LOAD));
            push_ids(&mut q, chunk.iter().map(Uuid::to_string));
            let rows = q.build().fetch_all(&mut **self).await.map_err(&err)?;
            for r in rows {
                let id = text_id(&r.try_get::<String, _>("id").map_err(&err)?)?;
                let received: NaiveDateTime = r.try_get("received_at").map_err(&err)?;
                out.insert(id, message_from_row(&r, id, received.and_utc(), &err)?);
            }
        }
        Ok(out)
    }

    /// Takes the key's row of `idempotency_key_locks`, making it first if needed, and keeps it
    /// locked until the transaction ends. It waits while another request under the key holds
    /// it, then answers true (the caller finds that request's stored result and replays it);
    /// past `innodb_lock_wait_timeout`, or as a deadlock's victim, it answers false ("in
    /// progress"; after a deadlock the transaction is rolled back).
    async fn lock_key(&mut self, schema: &InboxSchema, key: &str) -> Result<bool> {
        fits_as_key("an idempotency key", key)?;
        match sqlx::query(&schema.render(KEY_LOCK))
            .bind(key)
            .execute(&mut **self)
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if lock_not_taken(&e) => Ok(false),
            Err(e) => Err(err("locking an idempotency key")(e)),
        }
    }

    async fn stored_key(&mut self, schema: &InboxSchema, key: &str) -> Result<Option<StoredKey>> {
        let err = err("reading an idempotency key");
        let stored: Option<bool> = sqlx::query_scalar(&schema.render(KEY_STORED))
            .bind(key)
            .fetch_optional(&mut **self)
            .await
            .map_err(&err)?;
        if stored != Some(true) {
            return Ok(None);
        }
        let Some(r) = sqlx::query(&schema.render(KEY_GET))
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
        schema: &InboxSchema,
        key: &str,
        stored: &StoredKey,
    ) -> Result<()> {
        if stored.fingerprint.len() > MAX_FINGERPRINT_BYTES {
            return Err(malformed(format!(
                "the fingerprint of idempotency key `{key}` has {} bytes; the inbox on MySQL \
                 keeps at most {MAX_FINGERPRINT_BYTES} (store a hash of the request)",
                stored.fingerprint.len()
            )));
        }
        let events = serde_json::to_string(&stored.events)
            .map_err(|e| Error::with_source(ErrorKind::Other, "encoding event ids", e))?;
        sqlx::query(&schema.render(KEY_PUT))
            .bind(key)
            .bind(&stored.fingerprint)
            .bind(stored.result.to_string())
            .bind(events)
            .execute(&mut **self)
            .await
            .map_err(err("storing an idempotency key"))?;
        sqlx::query(&schema.render(KEY_MARK))
            .bind(key)
            .execute(&mut **self)
            .await
            .map_err(err("storing an idempotency key"))?;
        Ok(())
    }

    async fn enqueue_events(&mut self, schema: &InboxSchema, events: &[NewMessage]) -> Result<()> {
        let (tables, _) = places(Backend::Mysql, schema);
        MySql::enqueue_many(self, tables, events).await
    }
}
