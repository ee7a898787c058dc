//! Idempotent, versioned migrations of one schema, serialised by an advisory lock.

use outbox_core::{Error, ErrorKind, Result};
use sqlx::{PgConnection, PgPool};

use crate::error::map_sqlx_error;
use crate::schema::Schema;

/// Every migration, in order: (version, name, SQL with `{schema}` placeholders).
pub const MIGRATIONS: &[(i32, &str, &str)] = &[
    (1, "outbox", include_str!("../migrations/0001_outbox.sql")),
    (
        2,
        "member health",
        include_str!("../migrations/0002_member_health.sql"),
    ),
    (
        3,
        "insert-only engine",
        include_str!("../migrations/0003_engine_v2.sql"),
    ),
    (
        4,
        "redrive audit",
        include_str!("../migrations/0004_redrive_audit.sql"),
    ),
    (
        5,
        "compare-and-append positions, txid probes from the cursor",
        include_str!("../migrations/0005_engine_v2_1.sql"),
    ),
    (
        6,
        "UUIDv7 default in PL/pgSQL",
        include_str!("../migrations/0006_uuid_plpgsql.sql"),
    ),
    (
        7,
        "seq drawn by a nextval default",
        include_str!("../migrations/0007_seq_default.sql"),
    ),
    (
        8,
        "grants recorded and kept",
        include_str!("../migrations/0008_grants.sql"),
    ),
];

/// The schema version this crate's relay and writer need: the last of [`MIGRATIONS`].
pub const SCHEMA_VERSION: i32 = 8;

/// Creates `schema` if needed and applies the migrations it lacks, in one transaction per run.
/// Safe to run concurrently and repeatedly. Returns the versions applied now (empty when the
/// schema was up to date).
pub async fn migrate(pool: &PgPool, schema: &Schema) -> Result<Vec<i32>> {
    let ctx = |what: &str| format!("migrating schema `{}`: {what}", schema.as_str());
    let mut tx = pool
        .begin()
        .await
        .map_err(|e| map_sqlx_error(&ctx("begin"), e))?;
    // Upgrading copies the backlog: no statement timeout for this transaction.
    sqlx::raw_sql(include_str!("../queries/no_statement_timeout.sql"))
        .execute(&mut *tx)
        .await
        .map_err(|e| map_sqlx_error(&ctx("settings"), e))?;
    sqlx::query(include_str!("../queries/advisory_xact_lock.sql"))
        .bind(format!("outbox-migrate:{}", schema.as_str()))
        .execute(&mut *tx)
        .await
        .map_err(|e| map_sqlx_error(&ctx("lock"), e))?;
    let applied = apply_pending(
        &mut tx,
        schema,
        "outbox_migrations",
        MIGRATIONS,
        |sql| schema.render(sql),
        &ctx,
    )
    .await?;
    check_sequence(&mut tx, schema).await?;
    // Every recorded grant again: a migration that recreated an object left it without them.
    for warning in crate::grants::apply_recorded(&mut tx, schema).await? {
        tracing::warn!(schema = schema.as_str(), "{warning}");
    }
    tx.commit()
        .await
        .map_err(|e| map_sqlx_error(&ctx("commit"), e))?;
    Ok(applied)
}

/// Checks that `schema` holds the outbox tables at exactly the version this crate needs, and
/// that their sequence can serve as the claims' floor; the relay runs this before it claims.
/// Errors say what to do: run `outbox migrate`, or upgrade the relay.
pub async fn check_schema(pool: &PgPool, schema: &Schema) -> Result<()> {
    let name = schema.as_str();
    let mut conn = pool
        .acquire()
        .await
        .map_err(|e| map_sqlx_error(&format!("checking schema `{name}`"), e))?;
    let ledger: Option<String> =
        sqlx::query_scalar(include_str!("../queries/migrations_table.sql"))
            .bind(name)
            .fetch_one(&mut *conn)
            .await
            .map_err(|e| map_sqlx_error(&format!("checking schema `{name}`"), e))?;
    if ledger.is_none() {
        return Err(Error::new(
            ErrorKind::Schema,
            format!("schema \"{name}\" has no outbox tables: run outbox migrate --schema {name}"),
        ));
    }
    let version: Option<i32> =
        sqlx::query_scalar(&schema.render(include_str!("../queries/schema_version.sql")))
            .fetch_one(&mut *conn)
            .await
            .map_err(|e| map_sqlx_error(&format!("checking schema `{name}`"), e))?;
    match version.unwrap_or(0) {
        v if v < SCHEMA_VERSION => Err(Error::new(
            ErrorKind::Schema,
            format!(
                "schema \"{name}\" holds outbox tables of version {v}; this relay needs version \
                 {SCHEMA_VERSION}: stop the relays of the older version, then run \
                 outbox migrate --schema {name}"
            ),
        )),
        v if v > SCHEMA_VERSION => Err(Error::new(
            ErrorKind::Schema,
            format!(
                "schema \"{name}\" holds outbox tables of version {v}, newer than this relay \
                 knows ({SCHEMA_VERSION}): run the newer relay"
            ),
        )),
        _ => check_sequence(&mut conn, schema).await,
    }
}

/// The claims' seq floor is the sequence's last value, read under its lock. That is a floor
/// only if the sequence hands out increasing values one call at a time: no per-session cache
/// (a session would hold values below the floor), increment 1, no cycle.
async fn check_sequence(conn: &mut PgConnection, schema: &Schema) -> Result<()> {
    let name = schema.as_str();
    let row: Option<(i64, i64, bool)> =
        sqlx::query_as(&schema.render(include_str!("../queries/sequence_settings.sql")))
            .fetch_optional(&mut *conn)
            .await
            .map_err(|e| map_sqlx_error(&format!("checking the sequence of schema `{name}`"), e))?;
    match row {
        Some((1, 1, false)) | None => Ok(()),
        Some((cache, increment, cycle)) => Err(Error::new(
            ErrorKind::Config,
            format!(
                "sequence {name}.outbox_seq_v2 has CACHE {cache}, INCREMENT {increment}{}: the \
                 relay reads it as the floor of its claims, which needs CACHE 1, INCREMENT 1, NO \
                 CYCLE. Run: ALTER SEQUENCE {name}.outbox_seq_v2 CACHE 1 INCREMENT 1 NO CYCLE",
                if cycle { ", CYCLE" } else { "" }
            ),
        )),
    }
}

/// Applies, in `tx`, the `migrations` that `{schema}.{ledger}` has not recorded yet, in order,
/// recording each as it goes; creates the schema and the ledger table first. The caller holds
/// the lock that serialises migrators and commits. `render` fills the SQL's placeholders;
/// `ledger` is a fixed table name of the caller's, never user input. Shared by the outbox's
/// migrations and those of other table sets kept in a schema (the inbox's).
pub async fn apply_pending(
    tx: &mut PgConnection,
    schema: &Schema,
    ledger: &str,
    migrations: &[(i32, &str, &str)],
    render: impl Fn(&str) -> String,
    ctx: &dyn Fn(&str) -> String,
) -> Result<Vec<i32>> {
    // `ledger` is the caller's fixed table name, never configuration.
    let ledger_sql = |text: &str| schema.render(text).replace("{ledger}", ledger);
    sqlx::raw_sql(&ledger_sql(include_str!(
        "../queries/migrations_ledger.sql"
    )))
    .execute(&mut *tx)
    .await
    .map_err(|e| map_sqlx_error(&ctx("creating the schema"), e))?;
    let done: Vec<i32> = sqlx::query_scalar(&ledger_sql(include_str!(
        "../queries/migrations_applied.sql"
    )))
    .fetch_all(&mut *tx)
    .await
    .map_err(|e| map_sqlx_error(&ctx("reading applied versions"), e))?;
    let mut applied = Vec::new();
    for (version, name, sql) in migrations {
        if done.contains(version) {
            continue;
        }
        sqlx::raw_sql(&render(sql))
            .execute(&mut *tx)
            .await
            .map_err(|e| map_sqlx_error(&ctx(&format!("applying {version} {name}")), e))?;
        sqlx::query(&ledger_sql(include_str!(
            "../queries/migrations_record.sql"
        )))
        .bind(version)
        .bind(name)
        .execute(&mut *tx)
        .await
        .map_err(|e| map_sqlx_error(&ctx("recording the version"), e))?;
        applied.push(*version);
    }
    Ok(applied)
}

/// Installs (`on`) or removes the opt-in NOTIFY doorbell on `schema`'s outbox. See
/// `queries/notify_on.sql` for what it costs writers.
pub async fn set_notify(pool: &PgPool, schema: &Schema, on: bool) -> Result<()> {
    let sql = if on {
        include_str!("../queries/notify_on.sql")
    } else {
        include_str!("../queries/notify_off.sql")
    };
    sqlx::raw_sql(&schema.render(sql))
        .execute(pool)
        .await
        .map_err(|e| {
            map_sqlx_error(
                &format!(
                    "setting the NOTIFY doorbell on schema `{}`",
                    schema.as_str()
                ),
                e,
            )
        })?;
    Ok(())
}

/// Whether `schema`'s outbox has the NOTIFY doorbell installed.
pub async fn notify_installed(pool: &PgPool, schema: &Schema) -> Result<bool> {
    sqlx::query_scalar(include_str!("../queries/notify_installed.sql"))
        .bind(schema.as_str())
        .fetch_one(pool)
        .await
        .map_err(|e| map_sqlx_error("reading the outbox triggers", e))
}
