//! Least-privilege roles on PostgreSQL: `outbox migrate --grant PART=ROLE` records the grant in
//! `outbox_grants` and applies the part's privileges (`outbox_apply_grant`, migration 8), and
//! every migration applies the recorded ones again, so an upgrade never takes a privilege away.
//! What each part may do, and why, is docs/roles.md.

use outbox_core::{Error, ErrorKind, Grant, Result};
use sqlx::{PgConnection, PgPool};

use crate::error::map_sqlx_error;
use crate::schema::Schema;

const RECORD_SQL: &str = include_str!("../queries/grant_record.sql");
const APPLY_SQL: &str = include_str!("../queries/grant_apply.sql");
const APPLY_ALL_SQL: &str = include_str!("../queries/grant_apply_all.sql");

/// Records `grants` and applies each part's privileges to its role, in one transaction.
/// Returns what the caller must do by hand (a privilege this login cannot give, such as the
/// REPLICATION attribute, which needs a superuser). A role that does not exist is an error that
/// says how to create it.
pub async fn grant(pool: &PgPool, schema: &Schema, grants: &[Grant]) -> Result<Vec<String>> {
    let ctx = |g: &Grant| format!("granting {g} on schema `{}`", schema.as_str());
    let mut tx = pool
        .begin()
        .await
        .map_err(|e| map_sqlx_error("granting roles", e))?;
    let mut notes = Vec::new();
    for g in grants {
        let applied: Vec<String> = sqlx::query_scalar(&schema.render(APPLY_SQL))
            .bind(g.part.as_str())
            .bind(&g.grantee)
            .fetch_all(&mut *tx)
            .await
            .map_err(|e| grant_error(&ctx(g), e))?;
        notes.extend(applied);
        sqlx::query(&schema.render(RECORD_SQL))
            .bind(g.part.as_str())
            .bind(&g.grantee)
            .execute(&mut *tx)
            .await
            .map_err(|e| map_sqlx_error(&ctx(g), e))?;
    }
    tx.commit()
        .await
        .map_err(|e| map_sqlx_error("granting roles", e))?;
    Ok(notes)
}

/// Applies every recorded grant again, in the caller's (migration) transaction; returns what
/// could not be given.
pub(crate) async fn apply_recorded(
    conn: &mut PgConnection,
    schema: &Schema,
) -> Result<Vec<String>> {
    sqlx::query_scalar(&schema.render(APPLY_ALL_SQL))
        .fetch_all(&mut *conn)
        .await
        .map_err(|e| grant_error("applying the recorded grants", e))
}

/// A refused grant as the operator reads it: a missing role says how to create it, a missing
/// privilege of the migrating login says who can grant.
fn grant_error(ctx: &str, e: sqlx::Error) -> Error {
    if let sqlx::Error::Database(db) = &e {
        let hint = db
            .try_downcast_ref::<sqlx::postgres::PgDatabaseError>()
            .and_then(|p| p.hint().map(str::to_string));
        match (db.code().as_deref(), hint) {
            (Some("P0001"), Some(hint)) => {
                return Error::new(
                    ErrorKind::Config,
                    format!("{ctx}: {}: {hint}", db.message()),
                )
            }
            (Some("42501"), _) => {
                return Error::new(
                    ErrorKind::Config,
                    format!(
                        "{ctx}: {}: run outbox migrate --grant as the role that owns the outbox \
                         tables (or a superuser)",
                        db.message()
                    ),
                )
            }
            _ => {}
        }
    }
    map_sqlx_error(ctx, e)
}

/// Creates the login role `name` with `password`, for throw-away checks (`outbox verify`, tests)
/// that run each part as the role production gives it. The statement is built by the server
/// (`format('%I', '%L')`), so nothing of the name or password is spliced here.
pub async fn create_login(pool: &PgPool, name: &str, password: &str) -> Result<()> {
    let sql: String = sqlx::query_scalar(include_str!("../queries/login_create.sql"))
        .bind(name)
        .bind(password)
        .fetch_one(pool)
        .await
        .map_err(|e| map_sqlx_error("preparing a login", e))?;
    sqlx::raw_sql(&sql)
        .execute(pool)
        .await
        .map_err(|e| map_sqlx_error(&format!("creating the login `{name}`"), e))?;
    Ok(())
}

/// Drops the login role `name` made by [`create_login`], with the privileges it holds in this
/// database; nothing when it does not exist.
pub async fn drop_login(pool: &PgPool, name: &str) -> Result<()> {
    let sql: Option<String> = sqlx::query_scalar(include_str!("../queries/login_drop.sql"))
        .bind(name)
        .fetch_one(pool)
        .await
        .map_err(|e| map_sqlx_error("preparing to drop a login", e))?;
    if let Some(sql) = sql {
        sqlx::raw_sql(&sql)
            .execute(pool)
            .await
            .map_err(|e| map_sqlx_error(&format!("dropping the login `{name}`"), e))?;
    }
    Ok(())
}

/// Lets the login `name` own an outbox: create its schema in this database, and replicate when
/// the caller is a superuser (CDC mode's slot). For throw-away checks that migrate as an owner of
/// its own, as docs/roles.md advises.
pub async fn let_own(pool: &PgPool, name: &str) -> Result<()> {
    let sql: String = sqlx::query_scalar(include_str!("../queries/login_own.sql"))
        .bind(name)
        .fetch_one(pool)
        .await
        .map_err(|e| map_sqlx_error("preparing an owner login", e))?;
    sqlx::raw_sql(&sql)
        .execute(pool)
        .await
        .map_err(|e| map_sqlx_error(&format!("letting `{name}` own an outbox"), e))?;
    Ok(())
}
