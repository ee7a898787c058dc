//! Turning the binlog route on for an outbox (`outbox migrate --binlog`), and telling whether it
//! is on.
//!
//! On the binlog route writers run no trigger: their rows keep `part = -1`, `part_seq = 0`, and
//! the relay's sequencer ([`super::sequencer`]) gives each committed row its partition and
//! position, in commit order, from the binlog, into `outbox_sequence`. The polling engine then
//! reads `outbox_sequenced` (the messages joined to their positions) where it read `outbox`.
//! What this adds, idempotently:
//!
//! | object | what it is |
//! | --- | --- |
//! | `outbox_sequence` | `(seq, part, part_seq)` per sequenced message; in the same ranges of `seq` as `outbox`, dropped with them |
//! | `outbox_sequenced` | a view: each sequenced message with its position, as the polling engine reads it |
//! | `outbox_sequencer` | one row: the sequencer's lease and epoch, the binlog position it has sequenced through, and `sequenced_below` |
//! | `outbox_settings.binlog_route` | 1 once the route is on |
//!
//! and it takes the trigger (`outbox_position`) and the check that refused a row without a
//! position away, last, once everything the sequencer needs is in place.

use outbox_core::{Error, ErrorKind, Result};
use sqlx::MySqlPool;

use crate::error::map_sqlx_error;
use crate::ranges::{self, Range};
use crate::schema::Schema;

/// Whether `schema`'s outbox runs the binlog route. False when the outbox tables are not there
/// yet (before `outbox migrate`).
pub async fn is_on(pool: &MySqlPool, schema: &Schema) -> Result<bool> {
    let err = |e| map_sqlx_error("reading whether the binlog route is on", e);
    let tables: i64 = sqlx::query_scalar(include_str!("../../queries/route_tables_exist.sql"))
        .bind(schema.as_str())
        .fetch_one(pool)
        .await
        .map_err(err)?;
    if tables < 2 {
        return Ok(false);
    }
    let on: Option<i64> =
        sqlx::query_scalar(&schema.render(include_str!("../../queries/binlog_route_get.sql")))
            .fetch_optional(pool)
            .await
            .map_err(err)?;
    Ok(on == Some(1))
}

/// Turns the binlog route on for `schema`'s outbox (already migrated), on a server whose row
/// binlog the relay can read ([`super::server::BinlogSettings::check`], refused with what to
/// set otherwise). Safe to run again.
///
/// Messages written before (positioned by the trigger) are not lost: the sequencer's first run
/// takes every row above `passed_below` that has no entry in `outbox_sequence` from the table,
/// keeping the positions the trigger gave (see [`super::sequencer`]). Relays of the polling
/// route still running meanwhile see no message written after the switch (they wait at the
/// positions they cannot read); stop them, run this, start relays again.
pub async fn enable(pool: &MySqlPool, schema: &Schema) -> Result<()> {
    super::server::settings(pool)
        .await?
        .check()
        .map_err(|why| Error::config(format!("the binlog route cannot read this server: {why}")))?;
    let ctx = |what: &str| {
        format!(
            "turning the binlog route on in `{}`: {what}",
            schema.as_str()
        )
    };
    // The maintainer's lock: the ranges of `outbox_sequence` are laid out from `outbox`'s, which
    // a maintenance round must not change meanwhile.
    let Some(mut conn) = ranges::maintainer(pool, schema).await? else {
        return Err(Error::new(
            ErrorKind::Timeout,
            ctx("the outbox's maintenance is running; run this again in a moment"),
        ));
    };
    let done = set_up(&mut conn, schema).await;
    ranges::release(&mut conn, schema).await;
    done
}

/// What [`enable`] does under the maintainer's lock, on its connection.
async fn set_up(conn: &mut sqlx::MySqlConnection, schema: &Schema) -> Result<()> {
    let ctx = |what: &str| {
        format!(
            "turning the binlog route on in `{}`: {what}",
            schema.as_str()
        )
    };
    sqlx::raw_sql(&schema.render(SEQUENCER_SQL))
        .execute(&mut *conn)
        .await
        .map_err(|e| map_sqlx_error(&ctx("making the sequencer's table"), e))?;
    let layout = ranges::ranges(&mut *conn, schema).await?;
    sqlx::query(
        &schema.render(
            &include_str!("../../queries/sequence_create.sql")
                .replace("{partitioning}", &partition_clause(&layout)),
        ),
    )
    .execute(&mut *conn)
    .await
    .map_err(|e| map_sqlx_error(&ctx("making outbox_sequence"), e))?;
    sqlx::raw_sql(&schema.render(VIEW_SQL))
        .execute(&mut *conn)
        .await
        .map_err(|e| map_sqlx_error(&ctx("making the outbox_sequenced view"), e))?;
    // Last: from here writers' rows carry no position, and only the sequencer gives them
    // one. The check goes first, so no insert is refused in between (MySQL has no `IF EXISTS`
    // for it, hence the look first).
    let check: i64 = sqlx::query_scalar(include_str!("../../queries/route_constraint_exists.sql"))
        .bind(schema.as_str())
        .fetch_one(&mut *conn)
        .await
        .map_err(|e| map_sqlx_error(&ctx("looking for the position check"), e))?;
    if check > 0 {
        sqlx::query(&schema.render(include_str!("../../queries/route_drop_constraint.sql")))
            .execute(&mut *conn)
            .await
            .map_err(|e| {
                map_sqlx_error(
                    &ctx(
                        "dropping the position check (a transaction holding the outbox table open \
                     blocks it; run this again once it ended)",
                    ),
                    e,
                )
            })?;
    }
    // Where the sequencer starts: the binlog's end just before the trigger goes. Every row
    // written after has no position and commits after this point, so the stream gives it one
    // in commit order; the rows the trigger positioned keep theirs (the sequencer's first
    // start copies them). Kept if set already (this is run again, or the route was on).
    let start = super::server::end_position_on(&mut *conn).await?;
    sqlx::query(&schema.render(include_str!("../../queries/sequencer_start_position.sql")))
        .bind(&start.file)
        .bind(i64::try_from(start.offset).unwrap_or(i64::MAX))
        .execute(&mut *conn)
        .await
        .map_err(|e| map_sqlx_error(&ctx("recording where the sequencer starts"), e))?;
    sqlx::raw_sql(&schema.render(include_str!("../../queries/route_switch.sql")))
        .execute(&mut *conn)
        .await
        .map_err(|e| {
            map_sqlx_error(
                &ctx(
                    "taking the trigger away (a transaction holding the outbox table open blocks \
                 it; run this again once it ended)",
                ),
                e,
            )
        })?;
    Ok(())
}

/// Columns of `outbox_sequencer` added after it was first made: (name, definition). See
/// [`SEQUENCER_SQL`] for what each holds.
const SEQUENCER_COLUMNS: &[(&str, &str)] = &[
    ("server_identity", "VARCHAR(255) NULL"),
    ("advanced_at", "DATETIME(6) NULL"),
    ("reread_below", "BIGINT NULL"),
    ("binlog_gtid", "VARCHAR(1024) NULL"),
];

/// Brings the sequencer's table of an outbox switched by an older version up to this one
/// (`outbox migrate` runs it; nothing when the route is off). Idempotent.
pub async fn upgrade(pool: &MySqlPool, schema: &Schema) -> Result<()> {
    let err = |e| map_sqlx_error("upgrading the binlog sequencer's table", e);
    let have: Vec<String> = sqlx::query_scalar(include_str!("../../queries/sequencer_columns.sql"))
        .bind(schema.as_str())
        .fetch_all(pool)
        .await
        .map_err(err)?;
    if have.is_empty() {
        return Ok(());
    }
    for (name, definition) in SEQUENCER_COLUMNS {
        if have.iter().any(|c| c.eq_ignore_ascii_case(name)) {
            continue;
        }
        sqlx::query(
            &schema.render(
                &include_str!("../../queries/sequencer_add_column.sql")
                    .replace("{column}", name)
                    .replace("{definition}", definition),
            ),
        )
        .execute(pool)
        .await
        .map_err(err)?;
    }
    Ok(())
}

/// The sequencer's row: who holds the lease (and under which epoch, bumped at each new owner,
/// so a sequencer that lost it writes nothing more), how far in the binlog every outbox row is
/// sequenced, and `sequenced_below`: every row with a lower `seq` is sequenced or was rolled
/// back (raised by the seal, see the sequencer). `server_identity` names the server whose
/// binlog that position is in ([`super::server::identity`]; a position read on another server
/// means nothing), `advanced_at` is when the position last moved (how long a stuck reader
/// has been stuck: `updated_at` moves with every lease renewal), and `reread_below`, set while
/// the position stops before an XA transaction still prepared: rows below it may be carried
/// again after a restart, and are checked. `binlog_gtid` is MariaDB's GTID state at the
/// position, when known: after a failover the promoted replica's binlog is read on from it.
const SEQUENCER_SQL: &str = include_str!("../../queries/sequencer_create.sql");

/// The messages with their positions, as the polling engine reads them on this route. A
/// merged view: a read by `(part, part_seq)` runs on `outbox_sequence`'s index, then finds each
/// row by `seq`.
const VIEW_SQL: &str = include_str!("../../queries/sequenced_view.sql");

/// `PARTITION BY RANGE (seq) (…)` with the bounds of `layout` (the outbox's ranges).
pub(crate) fn partition_clause(layout: &[Range]) -> String {
    let parts: Vec<String> = layout
        .iter()
        .map(|r| match r.below {
            Some(b) => format!("PARTITION {} VALUES LESS THAN ({b})", r.name),
            None => format!("PARTITION {} VALUES LESS THAN MAXVALUE", r.name),
        })
        .collect();
    if parts.is_empty() {
        return String::new();
    }
    format!("PARTITION BY RANGE (seq) ({})", parts.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sequence_table_takes_the_outboxs_ranges() {
        let layout = vec![
            Range {
                name: "s10".into(),
                from: 0,
                below: Some(10),
            },
            Range {
                name: "s_max".into(),
                from: 10,
                below: None,
            },
        ];
        assert_eq!(
            partition_clause(&layout),
            "PARTITION BY RANGE (seq) (PARTITION s10 VALUES LESS THAN (10), \
             PARTITION s_max VALUES LESS THAN MAXVALUE)"
        );
    }
}
