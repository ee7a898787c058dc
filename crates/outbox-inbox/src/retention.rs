//! Retention of the inbox tables: processed inbox rows, dedupe claims and idempotency keys
//! older than the retention are deleted in batches.
//!
//! These rows are the memory of the receiving side: a message redelivered after its inbox row
//! and its claims were deleted is taken for a new one and processed again. The retention must
//! therefore exceed the longest time a source may redeliver a message (docs/consumers.md);
//! `outbox inbox` warns at start-up when the source says it keeps messages longer. An inbox
//! row is deleted only once some consumer has claimed it (a message still waiting or `failed`
//! stays), and never by age alone. The processing queue's own storage is retained by the
//! engine (segments dropped whole on PostgreSQL).
//!
//! Deleting leaves dead rows for VACUUM, in these tables only; they are not on any claim's path
//! (the processing queue is the insert-only engine).

use std::time::Duration;

use chrono::Utc;
use outbox_core::Result;
use serde::Serialize;
use sqlx::{PgPool, SqlitePool};

use crate::tables::InboxSchema;

/// Rows deleted per statement, so no statement holds locks on a large range for long.
const BATCH: i64 = 10_000;

const PG_MESSAGES: &str = "
    DELETE FROM {schema}.inbox_messages
    WHERE id IN (SELECT m.id FROM {schema}.inbox_messages AS m
                 WHERE m.received_at < now() - make_interval(secs => $1)
                   AND EXISTS (SELECT 1 FROM {schema}.processed_messages AS p
                               WHERE p.message_id = m.id)
                 LIMIT $2)";
const PG_CLAIMS: &str = "
    DELETE FROM {schema}.processed_messages
    WHERE (consumer, message_id) IN (SELECT consumer, message_id FROM {schema}.processed_messages
                                     WHERE processed_at < now() - make_interval(secs => $1)
                                     LIMIT $2)";
const PG_KEYS: &str = "
    DELETE FROM {schema}.idempotency_keys
    WHERE key IN (SELECT key FROM {schema}.idempotency_keys
                  WHERE created_at < now() - make_interval(secs => $1)
                  LIMIT $2)";

const SQLITE_MESSAGES: &str = "
    DELETE FROM inbox_messages
    WHERE seq IN (SELECT m.seq FROM inbox_messages AS m
                  WHERE m.received_at < ?1
                    AND EXISTS (SELECT 1 FROM processed_messages AS p WHERE p.message_id = m.id)
                  LIMIT ?2)";
const SQLITE_CLAIMS: &str = "
    DELETE FROM processed_messages
    WHERE rowid IN (SELECT rowid FROM processed_messages WHERE processed_at < ?1 LIMIT ?2)";
const SQLITE_KEYS: &str = "
    DELETE FROM idempotency_keys
    WHERE key IN (SELECT key FROM idempotency_keys WHERE created_at < ?1 LIMIT ?2)";

/// What a purge deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Purged {
    /// Inbox rows (each claimed by some consumer).
    pub inbox_messages: u64,
    /// Dedupe claims.
    pub processed_messages: u64,
    /// Idempotency keys.
    pub idempotency_keys: u64,
}

impl Purged {
    /// Rows deleted in all.
    pub fn total(&self) -> u64 {
        self.inbox_messages + self.processed_messages + self.idempotency_keys
    }
}

/// Deletes, from the PostgreSQL inbox in `schema`, claimed inbox rows received, claims made
/// and idempotency keys stored longer ago than `older_than`.
pub async fn purge_postgres(
    pool: &PgPool,
    schema: &InboxSchema,
    older_than: Duration,
) -> Result<Purged> {
    let secs = older_than.as_secs_f64();
    let mut out = Purged::default();
    for (sql, slot) in [
        (PG_MESSAGES, &mut out.inbox_messages),
        (PG_CLAIMS, &mut out.processed_messages),
        (PG_KEYS, &mut out.idempotency_keys),
    ] {
        let sql = schema.render(sql);
        loop {
            let n = sqlx::query(&sql)
                .bind(secs)
                .bind(BATCH)
                .execute(pool)
                .await
                .map_err(|e| outbox_postgres::map_sqlx_error("inbox retention", e))?
                .rows_affected();
            *slot += n;
            if n < BATCH as u64 {
                break;
            }
        }
    }
    Ok(out)
}

/// [`purge_postgres`] for the SQLite inbox in the file `pool` opened.
pub async fn purge_sqlite(pool: &SqlitePool, older_than: Duration) -> Result<Purged> {
    let cutoff =
        Utc::now() - chrono::Duration::from_std(older_than).unwrap_or(chrono::Duration::MAX / 2);
    let cutoff = cutoff.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let mut out = Purged::default();
    for (sql, slot) in [
        (SQLITE_MESSAGES, &mut out.inbox_messages),
        (SQLITE_CLAIMS, &mut out.processed_messages),
        (SQLITE_KEYS, &mut out.idempotency_keys),
    ] {
        loop {
            let n = sqlx::query(sql)
                .bind(&cutoff)
                .bind(BATCH)
                .execute(pool)
                .await
                .map_err(|e| outbox_sqlite::map_sqlx_error("inbox retention", e))?
                .rows_affected();
            *slot += n;
            if n < BATCH as u64 {
                break;
            }
        }
    }
    Ok(out)
}
