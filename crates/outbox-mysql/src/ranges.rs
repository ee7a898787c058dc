//! Retention on MySQL: the messages live in ranges of `seq` (table partitions). Maintenance
//! keeps ranges ready ahead of the writers and drops a range whole once no writer can add to
//! it, every partition's position has passed it, nothing parked lies in it, and retention has
//! run out since its last row was written. No row is ever deleted.
//!
//! Why "no writer can add to it" needs a lock: `seq` is drawn at insert, not at commit, so a
//! range whose rows all look passed may still receive a row from a transaction in progress,
//! invisible to any read. Every such transaction holds its partition's counter row
//! (`outbox_part_seq`) until it ends, so maintenance locks all 64 counters for a moment: once
//! it holds them no transaction with an outbox row is in progress, and every later row gets a
//! seq above the highest one it then reads (the seal).

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{LazyLock, Mutex};
use std::time::{Duration, Instant};

use outbox_core::{Error, ErrorKind, Maintenance, Result};
use sqlx::pool::PoolConnection;
use sqlx::{MySql, MySqlPool, Row as _};

use crate::error::map_sqlx_error;
use crate::schema::Schema;

/// Ranges kept ready beyond the last seq, in range widths: writers never reach the catch-all.
pub const LOOKAHEAD_RANGES: i64 = 2;

/// The catch-all range: seqs past the last range land here, so a writer never fails for want
/// of a range. Maintenance cuts new ranges out of it while it is empty.
const CATCH_ALL: &str = "s_max";

/// `range_cut.sql` for `table` (`outbox` or `outbox_sequence`): the catch-all cut into
/// `parts` (partition definitions built from bounds, and the catch-all again last).
fn cut(table: &str, parts: &[String]) -> String {
    include_str!("../queries/range_cut.sql")
        .replace("{table}", table)
        .replace("{catch_all}", CATCH_ALL)
        .replace("{ranges}", &parts.join(", "))
}

/// `range_drop.sql` for `table` (`outbox` or `outbox_sequence`) and a range name read from
/// the server's own partition list.
fn drop_range(table: &str, range: &str) -> String {
    include_str!("../queries/range_drop.sql")
        .replace("{table}", table)
        .replace("{range}", range)
}

/// How long maintenance waits for a lock before it gives up until its next round, in seconds:
/// the counters (writers of a partition queue behind them meanwhile) and the table's metadata
/// lock, which a range's creation or drop needs, and which waits for every transaction that has
/// touched the table, a forgotten `REPEATABLE READ` session included. Writers queue behind a
/// waiting DDL, so the wait is kept short.
const LOCK_WAIT_SECS: u32 = 2;

/// A transaction open this long (60 s) may be a session left open on the message table,
/// holding its metadata lock: each try to change the table's ranges would then hold writers and
/// relays for [`LOCK_WAIT_SECS`] and give up.
static OLD_TRANSACTION_SECS: AtomicI64 = AtomicI64::new(60);

/// Sets [`OLD_TRANSACTION_SECS`] for this process (tests, which cannot wait a minute).
#[doc(hidden)]
pub fn set_old_transaction_secs(secs: i64) {
    OLD_TRANSACTION_SECS.store(secs, Ordering::Relaxed);
}

/// While a transaction older than [`OLD_TRANSACTION_SECS`] is open on the server, a database's
/// ranges are changed at most this often (ranges cut ahead only when writers come within one
/// width of the last range, no seal taken, none dropped); at once again when none is.
const TRY_PAST_OLD_TRANSACTIONS: Duration = Duration::from_secs(300);

/// Per database: when a round last tried to change its ranges while an old transaction was open.
static TRIED_PAST_OLD: LazyLock<Mutex<HashMap<String, Instant>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// One range of the message table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Range {
    /// The partition's name: `s` and its upper bound, or [`CATCH_ALL`].
    pub name: String,
    /// The lowest seq it can hold.
    pub from: i64,
    /// One past the highest seq it can hold; `None` for the catch-all.
    pub below: Option<i64>,
}

/// The ranges of `schema`'s message table, lowest first. Fails with the advice to migrate when
/// the table is not split into ranges (an outbox below version 3).
pub async fn ranges(conn: &mut sqlx::MySqlConnection, schema: &Schema) -> Result<Vec<Range>> {
    ranges_of(conn, schema, "outbox").await
}

/// The ranges of `table` (`outbox`, or `outbox_sequence` on the binlog route), lowest first.
async fn ranges_of(
    conn: &mut sqlx::MySqlConnection,
    schema: &Schema,
    table: &str,
) -> Result<Vec<Range>> {
    let rows = sqlx::query(include_str!("../queries/ranges_list.sql"))
        .bind(schema.as_str())
        .bind(table)
        .fetch_all(&mut *conn)
        .await
        .map_err(|e| map_sqlx_error("reading the outbox's ranges", e))?;
    let mut out = Vec::with_capacity(rows.len());
    let mut from = 0;
    for r in rows {
        let name: Option<String> = r.try_get("name").ok().flatten();
        let below: Option<String> = r.try_get("below").ok().flatten();
        let (Some(name), Some(below)) = (name, below) else {
            return Err(Error::new(
                ErrorKind::Schema,
                format!(
                    "database `{}`: the table `{table}` is not split into ranges; run `outbox \
                     migrate` for this database",
                    schema.as_str()
                ),
            ));
        };
        let below = if below == "MAXVALUE" {
            None
        } else {
            Some(below.parse::<i64>().map_err(|_| {
                Error::new(
                    ErrorKind::Schema,
                    format!("range `{name}` of the outbox has an unexpected bound `{below}`"),
                )
            })?)
        };
        out.push(Range { name, from, below });
        from = below.unwrap_or(i64::MAX);
    }
    Ok(out)
}

/// Makes ranges ahead of the writers, then drops those retention no longer needs (see the
/// module's docs); one maintainer at a time per database (`GET_LOCK`), a second caller returns
/// at once with nothing done. A lock not granted within [`LOCK_WAIT_SECS`] ends the round early
/// with a warning and what was done so far: the next round tries again. While a transaction
/// older than [`OLD_TRANSACTION_SECS`] is open, rounds that change the ranges come at most every
/// [`TRY_PAST_OLD_TRANSACTIONS`] (the others only cut a range the writers are about to need).
pub async fn maintain(
    pool: &MySqlPool,
    schema: &Schema,
    retention: Duration,
) -> Result<Maintenance> {
    let Some(mut conn) = maintainer(pool, schema).await? else {
        return Ok(Maintenance::default());
    };
    let mut report = Maintenance::default();
    let done = match restraint(&mut conn, schema).await {
        Ok(restrained) => run(&mut conn, schema, retention, restrained, &mut report).await,
        Err(e) => Err(e),
    };
    release(&mut conn, schema).await;
    match done {
        Err(e) if e.kind() == ErrorKind::Timeout => {
            tracing::warn!(
                database = schema.as_str(),
                error = %e,
                "outbox retention gave up this round: a transaction held a lock it needs for \
                 over {LOCK_WAIT_SECS} s (a long writer transaction, or a session left open \
                 on the outbox table); it tries again next round, or while a transaction open \
                 for over a minute is there, in five minutes (at once if writers near the last \
                 range)"
            );
            Ok(report)
        }
        other => other.map(|()| report),
    }
}

/// Whether this round leaves the ranges alone unless the writers are about to need one: an old
/// transaction is open (see [`OLD_TRANSACTION_SECS`]) and a round tried past one less than
/// [`TRY_PAST_OLD_TRANSACTIONS`] ago. Records the try when it does not. The age is read from
/// `information_schema.INNODB_TRX`, server-wide: a long transaction in another database holds
/// these rounds back too, which only defers drops and keeps a range cut ahead in reserve.
pub async fn restraint(conn: &mut sqlx::MySqlConnection, schema: &Schema) -> Result<bool> {
    let oldest: Option<i64> =
        sqlx::query_scalar(include_str!("../queries/oldest_transaction_age.sql"))
            .fetch_one(&mut *conn)
            .await
            .map_err(|e| map_sqlx_error("looking for transactions left open", e))?;
    let mut tried = TRIED_PAST_OLD
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if oldest.unwrap_or(0) < OLD_TRANSACTION_SECS.load(Ordering::Relaxed) {
        tried.remove(schema.as_str());
        return Ok(false);
    }
    if tried
        .get(schema.as_str())
        .is_some_and(|t| t.elapsed() < TRY_PAST_OLD_TRANSACTIONS)
    {
        return Ok(true);
    }
    tried.insert(schema.as_str().to_string(), Instant::now());
    Ok(false)
}

/// Makes ranges ahead of the writers only (what `outbox migrate` does after its migrations).
pub async fn lay_ahead(pool: &MySqlPool, schema: &Schema) -> Result<u64> {
    let Some(mut conn) = maintainer(pool, schema).await? else {
        return Ok(0);
    };
    let made = async {
        let made = ensure_ahead(&mut conn, schema, false).await?.made;
        if binlog_route(&mut conn, schema).await? {
            mirror_ranges(&mut conn, schema).await?;
        }
        Ok(made)
    }
    .await;
    release(&mut conn, schema).await;
    made
}

/// Sets how many seqs a range spans (`outbox_settings.range_seqs`). It applies to the ranges
/// made from now on; on an outbox that holds no message yet, the ranges already laid ahead are
/// laid again at the new width (cheap: there is nothing to copy). Returns how many ranges were
/// made.
pub async fn set_width(pool: &MySqlPool, schema: &Schema, seqs: i64) -> Result<u64> {
    if seqs < 1 {
        return Err(Error::config(format!(
            "a range must span at least 1 seq, not {seqs}"
        )));
    }
    let Some(mut conn) = maintainer(pool, schema).await? else {
        return Err(Error::new(
            ErrorKind::Timeout,
            "another maintainer is running on this outbox; set the width again once it is done",
        ));
    };
    let err = |e| map_sqlx_error("setting the outbox's range width", e);
    sqlx::query(&schema.render(include_str!("../queries/range_seqs_set.sql")))
        .bind(seqs)
        .execute(&mut *conn)
        .await
        .map_err(err)?;
    let empty: bool =
        sqlx::query_scalar(&schema.render(include_str!("../queries/outbox_empty.sql")))
            .fetch_one(&mut *conn)
            .await
            .map_err(err)?;
    let made = lay_out(&mut conn, schema, empty).await;
    release(&mut conn, schema).await;
    made
}

/// Lays the ranges out again from the start (`empty`: only on a table without rows), then
/// ahead of the writers.
async fn lay_out(conn: &mut sqlx::MySqlConnection, schema: &Schema, empty: bool) -> Result<u64> {
    let err = |e| map_sqlx_error("laying out the outbox's ranges", e);
    if empty {
        sqlx::query(&schema.render(
            &include_str!("../queries/outbox_partition.sql").replace("{catch_all}", CATCH_ALL),
        ))
        .execute(&mut *conn)
        .await
        .map_err(err)?;
    }
    let made = ensure_ahead(conn, schema, false).await?.made;
    if binlog_route(conn, schema).await? {
        if empty {
            // Laid out again from the start: the sequence table (as empty) follows.
            let layout = ranges(conn, schema).await?;
            sqlx::query(&schema.render(
                &include_str!("../queries/sequence_partition.sql").replace(
                    "{partitioning}",
                    &crate::binlog::route::partition_clause(&layout),
                ),
            ))
            .execute(&mut *conn)
            .await
            .map_err(err)?;
        }
        mirror_ranges(conn, schema).await?;
    }
    Ok(made)
}

/// Whether the outbox runs the binlog route (`outbox_settings.binlog_route`): its positions
/// live in `outbox_sequence`, whose ranges follow the outbox's.
async fn binlog_route(conn: &mut sqlx::MySqlConnection, schema: &Schema) -> Result<bool> {
    let on: Option<i64> =
        sqlx::query_scalar(&schema.render(include_str!("../queries/binlog_route_get.sql")))
            .fetch_optional(&mut *conn)
            .await
            .map_err(|e| map_sqlx_error("reading whether the binlog route is on", e))?;
    Ok(on == Some(1))
}

/// Gives `outbox_sequence` the outbox's ranges above its own last one, cut out of its (empty)
/// catch-all: both tables keep the same bounds and names, so a range is dropped from both at
/// once. Run after every change of the outbox's ranges; one interrupted is made good here.
async fn mirror_ranges(conn: &mut sqlx::MySqlConnection, schema: &Schema) -> Result<()> {
    let outbox = ranges(conn, schema).await?;
    let own = ranges_of(conn, schema, "outbox_sequence").await?;
    let last = own.iter().filter_map(|r| r.below).max().unwrap_or(i64::MIN);
    let mut parts: Vec<String> = outbox
        .iter()
        .filter_map(|r| r.below.filter(|b| *b > last).map(|b| (r, b)))
        .map(|(r, b)| format!("PARTITION {} VALUES LESS THAN ({b})", r.name))
        .collect();
    if parts.is_empty() {
        return Ok(());
    }
    parts.push(format!("PARTITION {CATCH_ALL} VALUES LESS THAN MAXVALUE"));
    sqlx::query(&schema.render(&cut("outbox_sequence", &parts)))
        .execute(&mut *conn)
        .await
        .map_err(|e| map_sqlx_error("giving outbox_sequence the outbox's ranges", e))?;
    Ok(())
}

/// Lets the next maintainer in now (closing the connection would too, but a moment later).
pub(crate) async fn release(conn: &mut sqlx::MySqlConnection, schema: &Schema) {
    let _ = sqlx::query(include_str!("../queries/maintain_unlock.sql"))
        .bind(schema.as_str())
        .execute(&mut *conn)
        .await;
}

/// A connection of its own holding the maintenance lock, with short lock waits, or `None` if
/// another maintainer holds the lock. Closing the connection releases the lock and the
/// settings.
pub(crate) async fn maintainer(
    pool: &MySqlPool,
    schema: &Schema,
) -> Result<Option<PoolConnection<MySql>>> {
    let err = |e| map_sqlx_error("maintaining the outbox's ranges", e);
    let mut conn = pool.acquire().await.map_err(err)?;
    conn.close_on_drop();
    let got: Option<i64> = sqlx::query_scalar(include_str!("../queries/maintain_try_lock.sql"))
        .bind(schema.as_str())
        .fetch_one(&mut *conn)
        .await
        .map_err(err)?;
    if got != Some(1) {
        return Ok(None);
    }
    for set in [
        include_str!("../queries/maintain_lock_wait.sql")
            .replace("{secs}", &LOCK_WAIT_SECS.to_string()),
        include_str!("../queries/read_committed.sql").to_string(),
    ] {
        sqlx::query(&set).execute(&mut *conn).await.map_err(err)?;
    }
    Ok(Some(conn))
}

/// One round; `restrained` (see [`restraint`]): no seal, no drop, a range cut only when the
/// writers are about to need it.
async fn run(
    conn: &mut sqlx::MySqlConnection,
    schema: &Schema,
    retention: Duration,
    restrained: bool,
    report: &mut Maintenance,
) -> Result<()> {
    let Ahead {
        made,
        top,
        ranges: all,
        mut sealed_below,
    } = ensure_ahead(conn, schema, restrained).await?;
    report.segments_created = made;
    let binlog = binlog_route(conn, schema).await?;
    if binlog {
        mirror_ranges(conn, schema).await?;
    }
    let ctx = |what: &str| format!("outbox retention in `{}`: {what}", schema.as_str());
    if binlog {
        // The sequencer's seal alone: the trigger's (stored) one says nothing of what has a
        // position in `outbox_sequence`, and until the sequencer's first start took the rows the
        // trigger positioned, a range's positions there would look passed.
        sealed_below = sequenced_below(conn, schema).await?;
    } else if !restrained
        && all
            .iter()
            .any(|r| r.below.is_some_and(|b| b > sealed_below && b <= top + 1))
    {
        // A seal, once taken, holds for ever (no row can appear below it), and taking one holds
        // writers for a moment: take a new one only when a range not yet sealed lies wholly
        // below the last seq, so that it could seal it (once every `range_seqs` seqs).
        sealed_below = sealed_below.max(seal(conn, schema).await?);
        sqlx::query(&schema.render(include_str!("../queries/sealed_below_raise.sql")))
            .bind(sealed_below)
            .execute(&mut *conn)
            .await
            .map_err(|e| map_sqlx_error(&ctx("recording the seal"), e))?;
    }
    let passed: HashMap<i16, i64> =
        sqlx::query_as(&schema.render(include_str!("../queries/positions_passed.sql")))
            .fetch_all(&mut *conn)
            .await
            .map_err(|e| map_sqlx_error(&ctx("reading the positions"), e))?
            .into_iter()
            .collect();
    let keep_us = i64::try_from(retention.as_micros()).unwrap_or(i64::MAX);
    // The lowest ranges that are sealed and passed: claims need not read below them.
    let mut passed_prefix = true;
    let mut passed_below = None;
    for range in all {
        let Some(below) = range.below.filter(|b| *b <= sealed_below) else {
            break;
        };
        if !range_passed(conn, schema, &range, &passed, binlog).await? {
            passed_prefix = false;
            continue;
        }
        if passed_prefix {
            passed_below = Some(below);
        }
        let parked: bool =
            sqlx::query_scalar(&schema.render(include_str!("../queries/parked_in_range.sql")))
                .bind(range.from)
                .bind(below)
                .fetch_one(&mut *conn)
                .await
                .map_err(|e| map_sqlx_error(&ctx("looking for parked messages"), e))?;
        if parked {
            // A parked message is read from its row in the range: it keeps the range.
            continue;
        }
        // Its last row, by seq: when the range was last written to.
        let age_us: Option<i64> = sqlx::query_scalar(&schema.render(
            &include_str!("../queries/range_last_written.sql").replace("{range}", &range.name),
        ))
        .fetch_optional(&mut *conn)
        .await
        .map_err(|e| map_sqlx_error(&ctx("reading a range's age"), e))?;
        if restrained || age_us.is_some_and(|a| a < keep_us) {
            continue;
        }
        sqlx::query(&schema.render(&drop_range("outbox", &range.name)))
            .execute(&mut *conn)
            .await
            .map_err(|e| map_sqlx_error(&ctx(&format!("dropping range `{}`", range.name)), e))?;
        if binlog {
            // Its positions go with it (the same bounds, the same name).
            sqlx::query(&schema.render(&drop_range("outbox_sequence", &range.name)))
                .execute(&mut *conn)
                .await
                .map_err(|e| {
                    map_sqlx_error(
                        &ctx(&format!("dropping range `{}`'s positions", range.name)),
                        e,
                    )
                })?;
        }
        report.segments_dropped += 1;
    }
    if let Some(below) = passed_below {
        sqlx::query(&schema.render(include_str!("../queries/passed_below_raise.sql")))
            .bind(below)
            .execute(&mut *conn)
            .await
            .map_err(|e| map_sqlx_error(&ctx("recording how far every range is passed"), e))?;
    }
    Ok(())
}

/// What [`ensure_ahead`] read and did, for the rest of the round.
struct Ahead {
    /// Ranges it made.
    made: u64,
    /// The last seq when it looked.
    top: i64,
    /// The ranges once it was done, lowest first.
    ranges: Vec<Range>,
    /// The stored seal (`outbox_settings.sealed_below`).
    sealed_below: i64,
}

/// Cuts ranges out of the (empty) catch-all until [`LOOKAHEAD_RANGES`] widths lie beyond the
/// last seq; `restrained`, only once less than one width does. If writers outran maintenance
/// and the catch-all holds rows, the new ranges cover them: the server copies those rows once,
/// and says so in a warning.
async fn ensure_ahead(
    conn: &mut sqlx::MySqlConnection,
    schema: &Schema,
    restrained: bool,
) -> Result<Ahead> {
    let ctx = |what: &str| format!("making outbox ranges in `{}`: {what}", schema.as_str());
    let (width, sealed_below, top): (i64, i64, i64) =
        sqlx::query_as(&schema.render(include_str!("../queries/range_settings.sql")))
            .fetch_one(&mut *conn)
            .await
            .map_err(|e| map_sqlx_error(&ctx("reading the width"), e))?;
    if width < 1 {
        return Err(Error::config(format!(
            "database `{}`: outbox_settings.range_seqs is {width}; set it to 1 or more",
            schema.as_str()
        )));
    }
    let mut ranges = ranges(conn, schema).await?;
    let last = ranges.iter().filter_map(|r| r.below).max().unwrap_or(1);
    let want = top
        .saturating_add(1)
        .saturating_add(width.saturating_mul(LOOKAHEAD_RANGES));
    let mut bounds = Vec::new();
    let mut b = last;
    let room = last.saturating_sub(top.saturating_add(1));
    while b < want && !(restrained && room >= width) {
        b = b.saturating_add(width);
        bounds.push(b);
    }
    let mut ahead = Ahead {
        made: bounds.len() as u64,
        top,
        ranges: Vec::new(),
        sealed_below,
    };
    if bounds.is_empty() {
        ahead.ranges = ranges;
        return Ok(ahead);
    }
    if top >= last {
        tracing::warn!(
            database = schema.as_str(),
            rows_past = top - last + 1,
            "outbox: writers got ahead of the ranges made for them; the server copies those rows \
             into new ranges now (run maintenance more often, or raise range_seqs)"
        );
    }
    let mut parts: Vec<String> = bounds
        .iter()
        .map(|b| format!("PARTITION s{b} VALUES LESS THAN ({b})"))
        .collect();
    parts.push(format!("PARTITION {CATCH_ALL} VALUES LESS THAN MAXVALUE"));
    sqlx::query(&schema.render(&cut("outbox", &parts)))
        .execute(&mut *conn)
        .await
        .map_err(|e| map_sqlx_error(&ctx("cutting ranges out of the catch-all"), e))?;
    // The layout now: the same finite ranges, the new ones, the catch-all.
    ranges.retain(|r| r.below.is_some());
    let mut from = last;
    for b in bounds {
        ranges.push(Range {
            name: format!("s{b}"),
            from,
            below: Some(b),
        });
        from = b;
    }
    ranges.push(Range {
        name: CATCH_ALL.to_string(),
        from,
        below: None,
    });
    ahead.ranges = ranges;
    Ok(ahead)
}

/// Waits until no transaction with an outbox row is in progress (by locking every partition's
/// counter, which each such transaction holds until it ends), and returns one past the highest
/// seq then: no row below it can appear any more.
async fn seal(conn: &mut sqlx::MySqlConnection, schema: &Schema) -> Result<i64> {
    let ctx = |e| {
        map_sqlx_error(
            &format!(
                "outbox retention in `{}`: waiting for writers in progress",
                schema.as_str()
            ),
            e,
        )
    };
    let mut tx = sqlx::Connection::begin(&mut *conn).await.map_err(ctx)?;
    sqlx::query(&schema.render(include_str!("../queries/lock_part_seq.sql")))
        .fetch_all(&mut *tx)
        .await
        .map_err(ctx)?;
    let top: i64 = sqlx::query_scalar(&schema.render(include_str!("../queries/max_seq.sql")))
        .fetch_one(&mut *tx)
        .await
        .map_err(ctx)?;
    tx.commit().await.map_err(ctx)?;
    Ok(top + 1)
}

/// On the binlog route, the seal is the sequencer's: every row below `sequenced_below` has its
/// position or was rolled back, and no row can appear below it any more.
async fn sequenced_below(conn: &mut sqlx::MySqlConnection, schema: &Schema) -> Result<i64> {
    sqlx::query_scalar(&schema.render(include_str!("../queries/sequenced_below.sql")))
        .fetch_one(&mut *conn)
        .await
        .map_err(|e| map_sqlx_error("outbox retention: reading how far the sequencer sealed", e))
}

/// Whether every row of `range` is at or below its partition's position: per partition, the
/// range's highest position (one index dive per partition, "using index for group-by"), read
/// from `outbox_sequence` on the binlog route.
async fn range_passed(
    conn: &mut sqlx::MySqlConnection,
    schema: &Schema,
    range: &Range,
    passed: &HashMap<i16, i64>,
    binlog: bool,
) -> Result<bool> {
    let table = if binlog { "outbox_sequence" } else { "outbox" };
    let highest: Vec<(i16, i64)> = sqlx::query_as(
        &schema.render(
            &include_str!("../queries/range_highest.sql")
                .replace("{table}", table)
                .replace("{range}", &range.name),
        ),
    )
    .fetch_all(&mut *conn)
    .await
    .map_err(|e| {
        map_sqlx_error(
            &format!("outbox retention: reading range `{}`", range.name),
            e,
        )
    })?;
    Ok(highest
        .iter()
        .all(|(part, top)| passed.get(part).is_some_and(|p| p >= top)))
}
