//! Adopting a Debezium outbox table: an application that writes Debezium's documented layout
//! (`id`, `aggregatetype`, `aggregateid`, `type`, `payload`, optional `tracingspancontext`,
//! any additional columns) keeps its INSERT statements, and the relay publishes them.
//!
//! How: an `AFTER INSERT` row trigger on that table copies each row into this schema's
//! `outbox` table, in the application's own transaction. So a row reaches the relay exactly
//! when the application's transaction commits, with the same guarantees as a row written to
//! `outbox` directly (atomic with the business write, ordered by `seq` per aggregate id, never
//! lost). The Debezium table itself is left as it is: an application that deletes its rows
//! right after inserting them (Debezium's advice) keeps doing so; the copy is unaffected.
//!
//! | Debezium column | `outbox` column |
//! | --- | --- |
//! | `id` (uuid) | `id` |
//! | `aggregatetype` | `aggregate_type` |
//! | `aggregateid` | `aggregate_id` |
//! | `type` | `event_type` |
//! | `payload` (jsonb, json or JSON text; NULL) | `payload` (NULL becomes JSON `null`) |
//! | `tracingspancontext` (Java properties text) | `headers.traceparent`, `headers.tracestate` |
//! | any other column | `headers.<column>`, as text (NULL leaves it out) |

use sqlx::PgPool;

use crate::error::map_sqlx_error;
use crate::schema::Schema;
use outbox_core::{Error, Result};

/// The trigger's name on the adopted table.
pub const TRIGGER: &str = "outbox_relay_copy";
/// The trigger function's name, in the outbox schema.
pub const FUNCTION: &str = "outbox_debezium_copy";

/// Columns Debezium's layout requires.
const REQUIRED: [&str; 5] = ["id", "aggregatetype", "aggregateid", "type", "payload"];

/// A table named `name` or `schema.name`, each a plain lower-case identifier.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableName {
    schema: String,
    name: String,
}

impl TableName {
    /// Parses `text` (`outbox`, `public.outbox`); the schema defaults to `public`.
    pub fn parse(text: &str) -> Result<Self> {
        let (schema, name) = match text.split_once('.') {
            Some((s, n)) => (s, n),
            None => ("public", text),
        };
        for part in [schema, name] {
            let ok = part.len() <= 63
                && part
                    .chars()
                    .next()
                    .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
                && part
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
            if !ok {
                return Err(Error::config(format!(
                    "debezium table `{}`: write `name` or `schema.name`, each a plain lower-case \
                     identifier",
                    outbox_core::redact::sanitize(text)
                )));
            }
        }
        Ok(Self {
            schema: schema.to_string(),
            name: name.to_string(),
        })
    }

    /// `schema.name`.
    pub fn qualified(&self) -> String {
        format!("{}.{}", self.schema, self.name)
    }
}

/// What [`adopt`] found and installed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Adopted {
    /// Whether `tracingspancontext` is copied into the trace headers.
    pub tracing: bool,
    /// Additional columns copied as headers.
    pub additional: Vec<String>,
}

/// Installs (or replaces) the copying trigger on `table` towards `schema`'s `outbox`. Refuses
/// a table without Debezium's required columns, a `bytea` payload (the relay publishes JSON)
/// and the outbox table itself. Idempotent.
pub async fn adopt(pool: &PgPool, schema: &Schema, table: &TableName) -> Result<Adopted> {
    let shown = table.qualified();
    if table.schema == schema.as_str() && table.name == "outbox" {
        return Err(Error::config(format!(
            "debezium table `{shown}` is the relay's own outbox table; keep the relay's tables \
             in another schema (--schema)"
        )));
    }
    let columns: Vec<(String, String)> =
        sqlx::query_as(include_str!("../queries/debezium_columns.sql"))
            .bind(&table.schema)
            .bind(&table.name)
            .fetch_all(pool)
            .await
            .map_err(|e| map_sqlx_error(&format!("reading the columns of `{shown}`"), e))?;
    if columns.is_empty() {
        return Err(Error::config(format!(
            "debezium table `{shown}` does not exist"
        )));
    }
    let ty = |name: &str| {
        columns
            .iter()
            .find(|(c, _)| c == name)
            .map(|(_, t)| t.as_str())
    };
    for c in REQUIRED {
        if ty(c).is_none() {
            return Err(Error::config(format!(
                "debezium table `{shown}` has no `{c}` column: Debezium's outbox layout is id, \
                 aggregatetype, aggregateid, type, payload"
            )));
        }
    }
    let id = match ty("id") {
        Some("uuid") => "NEW.id",
        _ => "NEW.id::text::uuid",
    };
    let payload = match ty("payload") {
        Some("jsonb") => "COALESCE(NEW.payload, 'null'::jsonb)",
        Some("bytea") => {
            return Err(Error::config(format!(
                "debezium table `{shown}`: a bytea payload cannot be adopted; the relay \
                 publishes JSON (jsonb, json or JSON text)"
            )))
        }
        _ => "COALESCE(NEW.payload::text::jsonb, 'null'::jsonb)",
    };
    let tracing = ty("tracingspancontext").is_some();
    let mut pairs = Vec::new();
    if tracing {
        pairs.push(
            "'traceparent', substring(NEW.tracingspancontext from 'traceparent=([0-9a-f-]+)')"
                .to_string(),
        );
        pairs.push(
            "'tracestate', substring(NEW.tracingspancontext from 'tracestate=([^\\r\\n]*)')"
                .to_string(),
        );
    }
    let mut additional = Vec::new();
    for (c, _) in &columns {
        if REQUIRED.contains(&c.as_str()) || c == "tracingspancontext" {
            continue;
        }
        // Column names come from the catalogue: quoted as identifiers, passed as literals.
        pairs.push(format!(
            "{}, NEW.{}::text",
            quote_literal(c),
            quote_ident(c)
        ));
        additional.push(c.clone());
    }
    let headers = if pairs.is_empty() {
        "'{}'::jsonb".to_string()
    } else {
        format!(
            "jsonb_strip_nulls(jsonb_build_object({}))",
            pairs.join(", ")
        )
    };
    // {table} last: the other expressions are ours, the table's name is quoted by `qualified`.
    let sql = schema
        .render(include_str!("../queries/debezium_adopt.sql"))
        .replace("{id}", id)
        .replace("{payload}", payload)
        .replace("{headers}", &headers)
        .replace("{table}", &table.qualified());
    let mut tx = pool
        .begin()
        .await
        .map_err(|e| map_sqlx_error("adopting the debezium table: begin", e))?;
    sqlx::raw_sql(&sql)
        .execute(&mut *tx)
        .await
        .map_err(|e| map_sqlx_error(&format!("adopting the debezium table `{shown}`"), e))?;
    tx.commit()
        .await
        .map_err(|e| map_sqlx_error("adopting the debezium table: commit", e))?;
    Ok(Adopted {
        tracing,
        additional,
    })
}

/// Removes the trigger (the rollback: the table's rows go to Debezium alone again). Idempotent.
pub async fn release(pool: &PgPool, schema: &Schema, table: &TableName) -> Result<()> {
    let sql = schema
        .render(include_str!("../queries/debezium_release.sql"))
        .replace("{table}", &table.qualified());
    sqlx::raw_sql(&sql)
        .execute(pool)
        .await
        .map_err(|e| map_sqlx_error("releasing the debezium table", e))?;
    Ok(())
}

fn quote_ident(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\"\""))
}

fn quote_literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn table_names_are_plain_identifiers() {
        assert_eq!(
            TableName::parse("outbox").unwrap().qualified(),
            "public.outbox"
        );
        assert_eq!(
            TableName::parse("app.outbox").unwrap().qualified(),
            "app.outbox"
        );
        for bad in ["", "Outbox", "a.b.c", "x;drop", "1a", ".x"] {
            assert!(TableName::parse(bad).is_err(), "{bad}");
        }
    }
}
