//! Statements that run on any of the three databases: one SQL text, parameters bound as each wants.
//!
//! The text uses `$1`, `$2`, … for parameters (PostgreSQL's syntax, which sqlx also accepts for
//! SQLite) and `{schema}` for the schema holding the outbox: the validated schema name on
//! PostgreSQL, `main` (the file's own schema) on SQLite, the outbox's database on MySQL. So
//! `{schema}.outbox` names the outbox table on each. MySQL takes `?` only: [`render_mysql`]
//! rewrites each `$n` to `?` and binds the parameters in the order they appear.

use chrono::{DateTime, Utc};
use outbox_core::{Error, ErrorKind, Result};
use sqlx::mysql::{MySqlArguments, MySqlRow};
use sqlx::postgres::{PgArguments, PgRow};
use sqlx::sqlite::{SqliteArguments, SqliteRow};
use sqlx::{Arguments, FromRow};
use uuid::Uuid;

/// A value bound to a statement parameter, encoded the way each backend stores it.
#[derive(Debug, Clone, PartialEq)]
pub enum Param {
    /// Text.
    Text(String),
    /// A 64-bit integer (`bigint` / `INTEGER`).
    Int(i64),
    /// A UUID: `uuid` on PostgreSQL, lower-case hyphenated text on SQLite (the form the SQLite
    /// outbox stores ids in).
    Uuid(Uuid),
    /// JSON: `jsonb` on PostgreSQL, JSON text on SQLite.
    Json(serde_json::Value),
    /// A point in time: `timestamptz` on PostgreSQL; on SQLite, RFC 3339 text in UTC with
    /// milliseconds (`2026-12-04T10:00:00.000Z`), the form the SQLite tables' defaults write,
    /// so comparing stored times with it compares times; on MySQL a UTC `DATETIME(6)`.
    Time(DateTime<Utc>),
}

impl From<&str> for Param {
    fn from(v: &str) -> Self {
        Self::Text(v.to_string())
    }
}

impl From<String> for Param {
    fn from(v: String) -> Self {
        Self::Text(v)
    }
}

impl From<i64> for Param {
    fn from(v: i64) -> Self {
        Self::Int(v)
    }
}

impl From<Uuid> for Param {
    fn from(v: Uuid) -> Self {
        Self::Uuid(v)
    }
}

impl From<DateTime<Utc>> for Param {
    fn from(v: DateTime<Utc>) -> Self {
        Self::Time(v)
    }
}

impl From<serde_json::Value> for Param {
    fn from(v: serde_json::Value) -> Self {
        Self::Json(v)
    }
}

/// A row type every backend can decode, e.g. `(String, i64)`. Select UUIDs as
/// `CAST(id AS TEXT)` to read them the same way from PostgreSQL and SQLite (MySQL spells it
/// `CAST(id AS CHAR)`).
pub trait Row:
    for<'r> FromRow<'r, PgRow>
    + for<'r> FromRow<'r, SqliteRow>
    + for<'r> FromRow<'r, MySqlRow>
    + Send
    + Unpin
{
}

impl<T> Row for T where
    T: for<'r> FromRow<'r, PgRow>
        + for<'r> FromRow<'r, SqliteRow>
        + for<'r> FromRow<'r, MySqlRow>
        + Send
        + Unpin
{
}

/// SQLite's name for the schema of the opened file.
pub(crate) const SQLITE_SCHEMA: &str = "main";

/// `sql` for SQLite: `{schema}` is `main`.
pub(crate) fn render_sqlite(sql: &str) -> String {
    sql.replace("{schema}", SQLITE_SCHEMA)
}

fn encoding_error(e: sqlx::error::BoxDynError) -> Error {
    Error::new(
        ErrorKind::Other,
        format!("encoding a statement parameter: {e}"),
    )
}

/// `t` as the SQLite tables store times.
fn sqlite_time(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// `params` as PostgreSQL arguments.
pub(crate) fn pg_arguments(params: &[Param]) -> Result<PgArguments> {
    let mut args = PgArguments::default();
    for p in params {
        match p {
            Param::Text(v) => args.add(v.clone()),
            Param::Int(v) => args.add(*v),
            Param::Uuid(v) => args.add(*v),
            Param::Json(v) => args.add(sqlx::types::Json(v.clone())),
            Param::Time(v) => args.add(*v),
        }
        .map_err(encoding_error)?;
    }
    Ok(args)
}

/// `params` as SQLite arguments.
pub(crate) fn sqlite_arguments(params: &[Param]) -> Result<SqliteArguments<'static>> {
    let mut args = SqliteArguments::default();
    for p in params {
        match p {
            Param::Text(v) => args.add(v.clone()),
            Param::Int(v) => args.add(*v),
            // `Uuid::to_string` is the lower-case hyphenated form; sqlx would bind a blob.
            Param::Uuid(v) => args.add(v.to_string()),
            Param::Json(v) => args.add(v.to_string()),
            Param::Time(v) => args.add(sqlite_time(*v)),
        }
        .map_err(encoding_error)?;
    }
    Ok(args)
}

/// `sql` for MySQL: `{schema}` is the outbox's database, and each `$n` outside quotes becomes
/// `?`. Returns the text and the parameter numbers (1-based) in the order the `?` appear, so a
/// parameter used twice is bound twice.
pub(crate) fn render_mysql(sql: &str, schema: &str) -> (String, Vec<usize>) {
    let sql = sql.replace("{schema}", schema);
    let mut out = String::with_capacity(sql.len());
    let mut order = Vec::new();
    let mut quote: Option<char> = None;
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        match (quote, c) {
            (Some(q), c) if c == q => {
                quote = None;
                out.push(c);
            }
            (Some(_), c) => out.push(c),
            (None, '\'' | '"' | '`') => {
                quote = Some(c);
                out.push(c);
            }
            (None, '$') if chars.peek().is_some_and(char::is_ascii_digit) => {
                let mut n = 0usize;
                while let Some(d) = chars.peek().and_then(|d| d.to_digit(10)) {
                    n = n * 10 + d as usize;
                    chars.next();
                }
                order.push(n);
                out.push('?');
            }
            (None, c) => out.push(c),
        }
    }
    (out, order)
}

/// `params` as MySQL arguments, in `order` (from [`render_mysql`]).
pub(crate) fn mysql_arguments(params: &[Param], order: &[usize]) -> Result<MySqlArguments> {
    let mut args = MySqlArguments::default();
    for &n in order {
        let p = n
            .checked_sub(1)
            .and_then(|i| params.get(i))
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::Other,
                    format!(
                        "the statement names ${n}, but {} parameters were given",
                        params.len()
                    ),
                )
            })?;
        match p {
            Param::Text(v) => args.add(v.clone()),
            Param::Int(v) => args.add(*v),
            Param::Uuid(v) => args.add(v.to_string()),
            Param::Json(v) => args.add(v.to_string()),
            Param::Time(v) => args.add(v.naive_utc()),
        }
        .map_err(encoding_error)?;
    }
    Ok(args)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_placeholder_is_main_on_sqlite() {
        assert_eq!(
            render_sqlite("INSERT INTO {schema}.outbox (id) VALUES ($1)"),
            "INSERT INTO main.outbox (id) VALUES ($1)"
        );
    }

    #[test]
    fn times_bind_on_sqlite_as_the_tables_write_them() {
        let t = DateTime::parse_from_rfc3339("2026-12-04T10:00:00.5+01:00")
            .map(|t| t.with_timezone(&Utc))
            .ok();
        assert_eq!(
            t.map(sqlite_time).as_deref(),
            Some("2026-12-04T09:00:00.500Z")
        );
    }

    #[test]
    fn every_parameter_kind_encodes_on_both_backends() {
        let params = [
            Param::from("t"),
            Param::from(7i64),
            Param::from(Uuid::nil()),
            Param::from(serde_json::json!({ "a": 1 })),
            Param::from(DateTime::<Utc>::UNIX_EPOCH),
        ];
        assert!(pg_arguments(&params).is_ok());
        assert!(sqlite_arguments(&params).is_ok());
        assert!(mysql_arguments(&params, &[1, 2, 3, 4, 5]).is_ok());
        assert!(mysql_arguments(&params, &[6]).is_err());
    }

    #[test]
    fn mysql_gets_question_marks_in_the_order_the_parameters_appear() {
        let (sql, order) = render_mysql(
            "UPDATE {schema}.t SET a = $2, b = '$1', c = $10 WHERE d = $1 OR e = $2",
            "shop",
        );
        assert_eq!(
            sql,
            "UPDATE shop.t SET a = ?, b = '$1', c = ? WHERE d = ? OR e = ?"
        );
        assert_eq!(order, vec![2, 10, 1, 2]);
    }
}
