//! Adopting a Debezium outbox table on MySQL/MariaDB: the application keeps writing Debezium's
//! documented layout (`id`, `aggregatetype`, `aggregateid`, `type`, `payload`, optional
//! `tracingspancontext`, any additional columns) with its INSERTs unchanged; an `AFTER INSERT`
//! trigger copies each row into the outbox table, in the application's transaction, where the
//! outbox's own position trigger orders it like any other insert (the same guarantees as a
//! row written to `outbox` directly). The PostgreSQL twin is `outbox_postgres::debezium`.
//!
//! `id` must hold a UUID as text (`CHAR(36)`/`VARCHAR`), as Debezium documents it; `payload`
//! JSON or JSON text (NULL becomes JSON `null`); `tracingspancontext` fills the `traceparent`
//! and `tracestate` headers; every other column becomes a header of its name (NULL leaves it
//! out).

use sqlx::MySqlPool;

use crate::error::map_sqlx_error;
use crate::schema::Schema;
use outbox_core::{Error, Result};

/// The trigger's name, in the adopted table's database.
pub const TRIGGER: &str = "outbox_relay_copy";

const REQUIRED: [&str; 5] = ["id", "aggregatetype", "aggregateid", "type", "payload"];

/// What [`adopt`] found and installed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Adopted {
    /// Whether `tracingspancontext` is copied into the trace headers.
    pub tracing: bool,
    /// Additional columns copied as headers.
    pub additional: Vec<String>,
}

/// `database.table` (or `table`, in the outbox's database), each a plain lower-case identifier.
fn split<'a>(schema: &'a Schema, table: &'a str) -> Result<(&'a str, &'a str)> {
    let (db, name) = table.split_once('.').unwrap_or((schema.as_str(), table));
    for part in [db, name] {
        if !outbox_core::identifier::is_plain(part, 64) {
            return Err(Error::config(format!(
                "debezium table `{}`: write `table` or `database.table`, each a plain lower-case \
                 identifier",
                outbox_core::redact::sanitize(table)
            )));
        }
    }
    Ok((db, name))
}

/// Installs (or replaces) the copying trigger on `table` towards `schema`'s `outbox`; refuses
/// a table without Debezium's required columns, a binary `id` or `payload`, and the outbox
/// table itself. Idempotent.
pub async fn adopt(pool: &MySqlPool, schema: &Schema, table: &str) -> Result<Adopted> {
    let (db, name) = split(schema, table)?;
    let shown = format!("{db}.{name}");
    if db == schema.as_str() && name == "outbox" {
        return Err(Error::config(format!(
            "debezium table `{shown}` is the relay's own outbox table; keep the relay's tables \
             in another database"
        )));
    }
    let columns: Vec<(String, String)> =
        sqlx::query_as(include_str!("../queries/debezium_columns.sql"))
            .bind(db)
            .bind(name)
            .fetch_all(pool)
            .await
            .map_err(|e| map_sqlx_error(&format!("reading the columns of `{shown}`"), e))?;
    if columns.is_empty() {
        return Err(Error::config(format!(
            "debezium table `{shown}` does not exist"
        )));
    }
    let ty = |c: &str| {
        columns
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(c))
            .map(|(_, t)| t.to_ascii_lowercase())
    };
    for c in REQUIRED {
        if ty(c).is_none() {
            return Err(Error::config(format!(
                "debezium table `{shown}` has no `{c}` column: Debezium's outbox layout is id, \
                 aggregatetype, aggregateid, type, payload"
            )));
        }
    }
    for c in ["id", "payload"] {
        if ty(c).is_some_and(|t| t.contains("binary") || t.contains("blob")) {
            return Err(Error::config(format!(
                "debezium table `{shown}`: a binary `{c}` cannot be adopted; the relay takes a \
                 UUID as text and a JSON payload"
            )));
        }
    }
    let tracing = ty("tracingspancontext").is_some();
    let mut pairs = Vec::new();
    if tracing {
        // MySQL 8 and MariaDB both have REGEXP_SUBSTR (the whole match): the prefix is cut off.
        pairs.push(
            "'traceparent', SUBSTRING(REGEXP_SUBSTR(NEW.tracingspancontext, \
             'traceparent=[0-9a-f-]+'), 13)"
                .to_string(),
        );
        pairs.push(
            "'tracestate', SUBSTRING(REGEXP_SUBSTR(NEW.tracingspancontext, \
             'tracestate=[^\\r\\n]*'), 12)"
                .to_string(),
        );
    }
    let mut additional = Vec::new();
    for (c, _) in &columns {
        let lower = c.to_ascii_lowercase();
        if REQUIRED.contains(&lower.as_str()) || lower == "tracingspancontext" {
            continue;
        }
        if !outbox_core::identifier::is_plain(&lower, 64) || lower != *c {
            return Err(Error::config(format!(
                "debezium table `{shown}`: the additional column `{}` is not a plain lower-case \
                 name, so it cannot be a header",
                outbox_core::redact::sanitize(c)
            )));
        }
        pairs.push(format!("'{c}', CAST(NEW.`{c}` AS CHAR)"));
        additional.push(c.clone());
    }
    // JSON_MERGE_PATCH drops the keys whose value is NULL (a NULL column is no header).
    let headers = if pairs.is_empty() {
        "JSON_OBJECT()".to_string()
    } else {
        format!(
            "JSON_MERGE_PATCH(JSON_OBJECT(), JSON_OBJECT({}))",
            pairs.join(", ")
        )
    };
    let s = schema.as_str();
    let drop = release_sql(db);
    let create = include_str!("../queries/debezium_adopt.sql")
        .replace("{schema}", s)
        .replace("{trigger}", TRIGGER)
        .replace("{db}", db)
        .replace("{table}", name)
        .replace("{headers}", &headers);
    for sql in [drop, create] {
        sqlx::raw_sql(&sql)
            .execute(pool)
            .await
            .map_err(|e| map_sqlx_error(&format!("adopting the debezium table `{shown}`"), e))?;
    }
    Ok(Adopted {
        tracing,
        additional,
    })
}

/// `debezium_release.sql` for the adopted table's database `db`.
fn release_sql(db: &str) -> String {
    include_str!("../queries/debezium_release.sql")
        .replace("{trigger}", TRIGGER)
        .replace("{db}", db)
}

/// Removes the trigger (the rollback). Idempotent.
pub async fn release(pool: &MySqlPool, schema: &Schema, table: &str) -> Result<()> {
    let (db, _) = split(schema, table)?;
    sqlx::raw_sql(&release_sql(db))
        .execute(pool)
        .await
        .map_err(|e| map_sqlx_error("releasing the debezium table", e))?;
    Ok(())
}
