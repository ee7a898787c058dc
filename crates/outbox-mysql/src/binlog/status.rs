//! What `outbox status` and a metrics scrape show of the binlog route's sequencer: who holds
//! its lease, how far it has read the binlog (in bytes and in seconds), how far the seal is,
//! and how many partitions wait at a row they cannot see. Read-only, four cheap statements
//! (its row, the binlog's files, the outbox's next `seq`, one probe per partition).

use chrono::{DateTime, NaiveDateTime, Utc};
use outbox_core::status::SequencerStatus;
use outbox_core::{Result, SequencerGauges};
use sqlx::MySqlPool;

use super::{server, BinlogPosition};
use crate::error::map_sqlx_error;
use crate::schema::Schema;

/// The sequencer's row, the binlog's end and how far behind it the sequencer is.
pub async fn read(pool: &MySqlPool, schema: &Schema) -> Result<SequencerStatus> {
    let err = |e| map_sqlx_error("reading the binlog sequencer's row", e);
    type Row = (
        Option<String>,
        i64,
        NaiveDateTime,
        NaiveDateTime,
        Option<String>,
        Option<i64>,
        i64,
        i64,
        NaiveDateTime,
        Option<NaiveDateTime>,
    );
    let row: Row =
        sqlx::query_as(&schema.render(include_str!("../../queries/sequencer_status.sql")))
            .fetch_one(pool)
            .await
            .map_err(err)?;
    let (
        owner,
        epoch,
        lease_until,
        saved_at,
        file,
        offset,
        sequenced_below,
        from_table,
        db_now,
        advanced_at,
    ) = row;
    // The server's times, on this host's clock (the lease runs on the server's).
    let skew = Utc::now() - db_now.and_utc();
    let here = |t: NaiveDateTime| (t.and_utc().timestamp() > 0).then(|| t.and_utc() + skew);
    let through = match (file, offset) {
        (Some(file), Some(offset)) => Some(BinlogPosition::new(
            file,
            u64::try_from(offset).unwrap_or(0),
        )),
        _ => None,
    };
    // The last file's size is where the binlog ends: one statement gives both.
    let files = server::file_sizes(pool).await?;
    let end = files
        .last()
        .map(|(file, size)| BinlogPosition::new(file.clone(), *size));
    let lag_bytes = match &through {
        Some(t) => server::bytes_after(&files, t),
        // Not started: it will read from where the route was turned on.
        None => Some(0),
    }
    .map(|b| i64::try_from(b).unwrap_or(i64::MAX));
    // Behind (or its file gone) and not moving: since it last moved, or was last saved.
    let lag_seconds = if lag_bytes == Some(0) {
        0.0
    } else {
        let moved = advanced_at.unwrap_or(saved_at);
        ((db_now - moved).num_milliseconds().max(0) as f64) / 1000.0
    };
    // A partition's next position whose row is not visible: one index probe per partition.
    let stuck_partitions: i64 = sqlx::query_scalar(
        &schema.render(include_str!("../../queries/status_unsequenced_heads.sql")),
    )
    .fetch_one(pool)
    .await
    .map_err(|e| map_sqlx_error("counting the partitions stuck at a missing row", e))?;
    Ok(SequencerStatus {
        owner,
        epoch,
        lease_until: here(lease_until),
        saved_at: here(saved_at),
        through: through.map(|t| t.to_string()),
        binlog_end: end.map(|e| e.to_string()),
        lag_bytes,
        sequenced_below,
        next_seq: super::seal::next_seq(pool, schema).await?,
        rows_from_table: from_table,
        lag_seconds,
        stuck_partitions,
    })
}

/// The figures a metrics scrape exports, from [`read`] taken at `now`.
pub fn gauges(s: &SequencerStatus, now: DateTime<Utc>) -> SequencerGauges {
    let seconds = |t: DateTime<Utc>| (now - t).num_milliseconds().max(0) as f64 / 1000.0;
    SequencerGauges {
        leased: s.owner.is_some() && s.lease_until.is_some_and(|t| t > now),
        save_age_seconds: s.saved_at.map_or(f64::INFINITY, seconds),
        lag_bytes: s.lag_bytes,
        unsealed_seqs: (s.next_seq - s.sequenced_below).max(0),
        rows_from_table: s.rows_from_table,
        lag_seconds: s.lag_seconds,
        stuck_partitions: s.stuck_partitions,
    }
}
