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
use outbox_db::{Backend, Database, Param};
use serde::Serialize;

/// Rows deleted per statement, so no statement holds locks on a large range for long.
const BATCH: i64 = 10_000;

// One text for every backend: `{schema}` is the inbox tables' place and `$1` the cutoff, bound
// as each backend stores times. Each deletes at most `$2` rows.
const MESSAGES: &str = include_str!("../queries/retention_messages.sql");
const CLAIMS: &str = include_str!("../queries/retention_claims.sql");
const KEYS: &str = include_str!("../queries/retention_keys.sql");

// MySQL takes neither a LIMIT inside an IN subquery nor a subquery on the table being deleted
// from, but its single-table DELETE has a LIMIT of its own. `key` is a reserved word there.
const MYSQL_MESSAGES: &str = include_str!("../queries/mysql/retention_messages.sql");
const MYSQL_CLAIMS: &str = include_str!("../queries/mysql/retention_claims.sql");
const MYSQL_KEYS: &str = include_str!("../queries/mysql/retention_keys.sql");
// The rows a request under a key locks while it runs (MySQL only), kept as long as keys and
// deleted after them: a row whose key is still stored stays, so its `stored` flag never
// points at nothing for long and a request never stores a key twice.
const MYSQL_KEY_LOCKS: &str = include_str!("../queries/mysql/retention_key_locks.sql");

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

/// Deletes, from the inbox tables of `db`, claimed inbox rows received, claims made and
/// idempotency keys stored longer ago than `older_than`, [`BATCH`] rows per statement (on
/// MySQL also the keys' lock rows, which are not counted).
pub async fn purge(db: &Database, older_than: Duration) -> Result<Purged> {
    let mut out = Purged::default();
    // The cutoff is this process's clock, not the server's: a retention is days, clocks
    // differ by far less. A retention longer than the calendar reaches deletes nothing.
    let Some(cutoff) = chrono::Duration::from_std(older_than)
        .ok()
        .and_then(|age| Utc::now().checked_sub_signed(age))
    else {
        return Ok(out);
    };
    let mut key_locks = 0;
    let statements = match db.backend() {
        Backend::Mysql => vec![
            (MYSQL_MESSAGES, &mut out.inbox_messages),
            (MYSQL_CLAIMS, &mut out.processed_messages),
            (MYSQL_KEYS, &mut out.idempotency_keys),
            (MYSQL_KEY_LOCKS, &mut key_locks),
        ],
        _ => vec![
            (MESSAGES, &mut out.inbox_messages),
            (CLAIMS, &mut out.processed_messages),
            (KEYS, &mut out.idempotency_keys),
        ],
    };
    for (sql, slot) in statements {
        loop {
            let n = db
                .execute(sql, &[Param::Time(cutoff), Param::Int(BATCH)])
                .await?;
            *slot += n;
            if n < BATCH as u64 {
                break;
            }
        }
    }
    Ok(out)
}
