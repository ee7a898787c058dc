//! The producers `outbox verify` adds on MySQL/MariaDB, writing as the applications there do:
//! XA transactions (a Java shop's JTA transaction manager: `XA START … XA END; XA PREPARE`, then
//! `XA COMMIT` or `XA ROLLBACK`, or `XA COMMIT … ONE PHASE`), and rows the SQL contract forbids
//! (an `id` that is not a UUID, a zero `created_at`), written with the server's checks off for
//! the statement, as a writer from before migration 4 or one that skips them would.
//!
//! Both use the writer login's connections directly (sqlx): XA has no place in the writer API's
//! transaction, and its statements go as text (the server prepares none of them).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use outbox_db::Database;
use sqlx::{MySqlPool, Row as _};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// The server's "unknown XID" (`XAER_NOTA`): no prepared transaction has that id, or the
/// session that prepared it still holds it.
const XAER_NOTA: u16 = 1397;

/// How long a prepared transaction cut off from its producer (a database restart) is tried to
/// be resolved from another connection before the producer gives up on it (the run then stalls
/// on it and says so).
const RESOLVE_LIMIT: Duration = Duration::from_secs(50);

/// Pause between two odd rows: a few dozen in a short run, each on a key of its own.
const ODD_ROW_EVERY: Duration = Duration::from_millis(700);

/// Runs `sql` with no parameters, as text (`COM_QUERY`): the server prepares no XA statement.
async fn text(conn: &mut sqlx::MySqlConnection, sql: String) -> Result<(), sqlx::Error> {
    sqlx::Executor::execute(conn, sql.as_str())
        .await
        .map(|_| ())
}

/// Whether `e` is the server's error number `number`.
fn is_error(e: &sqlx::Error, number: u16) -> bool {
    match e {
        sqlx::Error::Database(db) => db
            .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
            .is_some_and(|m| m.number() == number),
        _ => false,
    }
}

/// One XA transaction of an XA producer.
pub struct XaTransaction<'a> {
    /// The transaction's id: unique on the server (the run's tag, the producer, a count).
    pub xid: String,
    /// Its key.
    pub key: &'a str,
    /// The producer's id, for the ledger.
    pub producer: i64,
    /// The pause between the outbox insert and the commit-order witness.
    pub work: Duration,
    /// How long it stays prepared before its second phase: meanwhile other transactions
    /// commit past it, which is what a binlog reader must hold it against.
    pub prepared_for: Duration,
    /// End it with `XA ROLLBACK` after the prepare.
    pub rollback: bool,
    /// Commit in one phase (`XA COMMIT … ONE PHASE`, no prepare).
    pub one_phase: bool,
}

/// Writes one XA transaction: the plain insert (the id made here, as an application does), the
/// commit-order witness and the ledger row, all in the XA transaction, so the ledger holds it
/// exactly when it committed. Returns whether a fault cut it off after its prepare and it was
/// resolved from another connection (as a transaction manager's recovery does: MariaDB keeps a
/// prepared transaction across a disconnect and a restart, holding its locks, until someone
/// commits or rolls it back). An error means it never reached its prepare, so the server rolled
/// it back.
pub async fn xa_write(
    pool: &MySqlPool,
    schema: &str,
    xa: &XaTransaction<'_>,
) -> anyhow::Result<bool> {
    anyhow::ensure!(
        xa.xid
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'),
        "an XA id is written into the statement: `{}` must be letters, digits, - and _",
        xa.xid
    );
    let mut conn = pool.acquire().await?;
    let prepared = match first_phase(&mut conn, schema, xa).await {
        Ok(p) => p,
        Err(e) => {
            // The connection may be left in an XA state nobody else may inherit: closed, not
            // returned to the pool (here and below).
            conn.close_on_drop();
            // The prepare may have happened with its answer lost: resolved as if it had.
            if e.downcast_ref::<MaybePrepared>().is_some() {
                drop(conn);
                resolve(pool, &xa.xid, !xa.rollback).await?;
                return Ok(true);
            }
            return Err(e);
        }
    };
    if !prepared {
        return Ok(false);
    }
    tokio::time::sleep(xa.prepared_for).await;
    let second = if xa.rollback {
        format!("XA ROLLBACK '{}'", xa.xid)
    } else {
        format!("XA COMMIT '{}'", xa.xid)
    };
    match text(&mut conn, second).await {
        Ok(_) => Ok(false),
        Err(_) => {
            conn.close_on_drop();
            drop(conn);
            resolve(pool, &xa.xid, !xa.rollback).await?;
            Ok(true)
        }
    }
}

/// An error after `XA END`: whether the prepare happened is unknown.
#[derive(Debug)]
struct MaybePrepared(String);

impl std::fmt::Display for MaybePrepared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the prepare's answer was lost: {}", self.0)
    }
}

impl std::error::Error for MaybePrepared {}

/// Up to the prepare (or the one-phase commit); returns whether the transaction is prepared.
async fn first_phase(
    conn: &mut sqlx::MySqlConnection,
    schema: &str,
    xa: &XaTransaction<'_>,
) -> anyhow::Result<bool> {
    let payload = serde_json::json!({
        "key": xa.key,
        "writer": "xa",
        "producer": xa.producer,
    });
    let id = Uuid::now_v7().to_string();
    text(conn, format!("XA START '{}'", xa.xid)).await?;
    sqlx::query(&render(
        schema,
        "INSERT INTO {schema}.outbox (id, aggregate_type, aggregate_id, event_type, payload) \
         VALUES (?, 'verify', ?, 'event', ?)",
    ))
    .bind(&id)
    .bind(xa.key)
    .bind(payload.to_string())
    .execute(&mut *conn)
    .await?;
    if !xa.work.is_zero() {
        tokio::time::sleep(xa.work).await;
    }
    sqlx::query(&render(
        schema,
        "UPDATE {schema}.verify_counters SET n = LAST_INSERT_ID(n + 1) WHERE k = ?",
    ))
    .bind(xa.key)
    .execute(&mut *conn)
    .await?;
    let n: i64 = sqlx::query_scalar("SELECT CAST(LAST_INSERT_ID() AS SIGNED)")
        .fetch_one(&mut *conn)
        .await?;
    sqlx::query(&render(
        schema,
        "INSERT INTO {schema}.verify_ledger (id, k, n, writer, producer) \
         VALUES (?, ?, ?, 'xa', ?)",
    ))
    .bind(&id)
    .bind(xa.key)
    .bind(n)
    .bind(xa.producer)
    .execute(&mut *conn)
    .await?;
    text(conn, format!("XA END '{}'", xa.xid)).await?;
    if xa.one_phase {
        // No prepared state: a lost answer means committed or rolled back, and the ledger
        // says which.
        text(conn, format!("XA COMMIT '{}' ONE PHASE", xa.xid)).await?;
        return Ok(false);
    }
    text(conn, format!("XA PREPARE '{}'", xa.xid))
        .await
        .map_err(|e| MaybePrepared(e.to_string()))?;
    Ok(true)
}

/// Commits (or rolls back) prepared transaction `xid` from fresh connections until the server
/// holds no such prepared transaction, for up to [`RESOLVE_LIMIT`]. "Unknown XID" alone does
/// not settle it: the server answers that while the dead session that prepared it is not yet
/// noticed gone, so `XA RECOVER` must not list it either.
async fn resolve(pool: &MySqlPool, xid: &str, commit: bool) -> anyhow::Result<()> {
    let statement = if commit {
        format!("XA COMMIT '{xid}'")
    } else {
        format!("XA ROLLBACK '{xid}'")
    };
    let until = Instant::now() + RESOLVE_LIMIT;
    loop {
        match resolve_once(pool, &statement, xid).await {
            Ok(true) => return Ok(()),
            Ok(false) | Err(_) if Instant::now() < until => {
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Ok(false) => anyhow::bail!("prepared XA transaction {xid} is still held"),
            Err(e) => return Err(e.context(format!("resolving XA transaction {xid}"))),
        }
    }
}

/// One try of [`resolve`]: whether no prepared transaction `xid` is left.
async fn resolve_once(pool: &MySqlPool, statement: &str, xid: &str) -> anyhow::Result<bool> {
    let mut conn = pool.acquire().await?;
    match text(&mut conn, statement.to_string()).await {
        Ok(()) => return Ok(true),
        Err(e) if is_error(&e, XAER_NOTA) => {}
        Err(e) => {
            conn.close_on_drop();
            return Err(e.into());
        }
    }
    let listed = sqlx::Executor::fetch_all(&mut *conn, "XA RECOVER").await?;
    let held = listed.iter().any(|r| {
        r.try_get_unchecked::<Vec<u8>, _>(3)
            .is_ok_and(|d| d == xid.as_bytes())
    });
    Ok(!held)
}

/// A ULID-like id: 26 characters of Crockford's base 32, what an application using ULIDs
/// writes into `id` (not a UUID).
fn ulid_like() -> String {
    const ALPHABET: &[u8] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";
    (0..26)
        .map(|i| {
            // A ULID's first character is at most 7 (its 48-bit time).
            let max = if i == 0 { 8 } else { ALPHABET.len() };
            char::from(ALPHABET[fastrand::usize(..max)])
        })
        .collect()
}

/// Writes up to `rows` odd rows, one every [`ODD_ROW_EVERY`] until `stop`: in turn one whose
/// `id` is not a UUID and one whose `created_at` is a zero date, each on a key of its own
/// (`odd-…`, so the messages it holds back are none), each recorded in `verify_odd` with the
/// column at fault, in its own transaction. Migration 4's checks would refuse them: they are
/// switched off for the statement (`SET STATEMENT check_constraint_checks = 0 FOR …`), as
/// docs/engine-mysql.md says tests write such rows. A failed write is tried again later.
pub async fn write_odd_rows(db: Arc<Database>, rows: usize, stop: CancellationToken) {
    let Database::Mysql(store) = &*db else {
        return;
    };
    let mut written = 0;
    let mut attempt = 0usize;
    while written < rows && !stop.is_cancelled() {
        tokio::time::sleep(ODD_ROW_EVERY).await;
        let column = if attempt.is_multiple_of(2) {
            "id"
        } else {
            "created_at"
        };
        attempt += 1;
        let key = format!("odd-{attempt}");
        if odd_row(store.pool(), store.schema().as_str(), &key, column)
            .await
            .is_ok()
        {
            written += 1;
        }
    }
}

/// One odd row and its `verify_odd` record, in one transaction.
async fn odd_row(pool: &MySqlPool, schema: &str, key: &str, column: &str) -> anyhow::Result<()> {
    let (id, created_at) = match column {
        "id" => (ulid_like(), None),
        _ => (Uuid::now_v7().to_string(), Some("0000-00-00 00:00:00")),
    };
    let payload = serde_json::json!({"key": key, "writer": "odd"}).to_string();
    let mut tx = pool.begin().await?;
    let seq = sqlx::query(&render(
        schema,
        "SET STATEMENT check_constraint_checks = 0 FOR \
         INSERT INTO {schema}.outbox (id, aggregate_type, aggregate_id, event_type, payload, created_at) \
         VALUES (?, 'verify', ?, 'event', ?, COALESCE(?, UTC_TIMESTAMP(6)))",
    ))
    .bind(&id)
    .bind(key)
    .bind(&payload)
    .bind(created_at)
    .execute(&mut *tx)
    .await
    .context("writing an odd row")?
    .last_insert_id();
    sqlx::query(&render(
        schema,
        "INSERT INTO {schema}.verify_odd (seq, id, k, col) VALUES (?, ?, ?, ?)",
    ))
    .bind(seq)
    .bind(&id)
    .bind(key)
    .bind(column)
    .execute(&mut *tx)
    .await
    .context("recording an odd row")?;
    tx.commit().await?;
    Ok(())
}

/// `sql` with `{schema}` standing for the run's database (a name the store validated as a plain
/// identifier, so nothing else is spliced in).
fn render(schema: &str, sql: &str) -> String {
    sql.replace("{schema}", schema)
}

/// The odd rows committed: their `seq` and the column at fault.
pub async fn odd_rows(db: &Database) -> anyhow::Result<Vec<crate::checker::OddRow>> {
    let rows: Vec<(i64, String)> = db
        .fetch_all(
            "SELECT seq, CAST(col AS CHAR) FROM {schema}.verify_odd ORDER BY seq",
            &[],
        )
        .await
        .context("reading the odd rows")?;
    Ok(rows
        .into_iter()
        .map(|(seq, column)| crate::checker::OddRow { seq, column })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ulid_like_id_is_26_crockford_characters_and_no_uuid() {
        for _ in 0..100 {
            let id = ulid_like();
            assert_eq!(id.len(), 26);
            assert!(id.parse::<Uuid>().is_err());
            assert!(id
                .chars()
                .all(|c| c.is_ascii_digit() || c.is_ascii_uppercase()));
            assert!(!id.contains(['I', 'L', 'O', 'U']));
            assert!(id.as_bytes()[0] <= b'7');
        }
    }
}
