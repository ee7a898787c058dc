//! Backlog mode's steps on MySQL/MariaDB: the relay's drain over the MySQL store into NATS,
//! the message table's footprint after it and after retention, and the naive relay's drain of a
//! seed-style table (`FOR UPDATE SKIP LOCKED`, one publish and one `UPDATE` per row: raw
//! baseline, excepted by issue 47), with the CPU each message cost the relay, the database
//! server and the broker.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use sqlx::Row;
use uuid::Uuid;

use super::{finish_with, wait_published, Run};
use crate::cpu::CpuMeter;
use crate::latency::Probe;
use crate::mysql::{Footprint, MyCtx, MysqlTarget, RelayOnMysql, Scratch, NAIVE_TABLE, SERVER};
use crate::{load, Drain, DrainTiming, Options};

/// Rows per transaction when filling, as the PostgreSQL backlog does.
const FILL_TX_ROWS: usize = 1000;

/// Prints the mode's header on MySQL/MariaDB.
pub(super) fn header(options: &Options, naive_rows: usize) {
    println!(
        "outbox bench on MySQL/MariaDB: backlog of {} events (naive relay: {naive_rows}), {} B \
         payloads, keys {:?}, NATS JetStream ({} storage), {}; relay {} workers, batch {}, polling",
        options.rows,
        options.payload_bytes,
        options.keys,
        options.storage,
        if options.analyze {
            "ANALYZE TABLE after filling"
        } else {
            "no ANALYZE"
        },
        options.workers,
        options.batch_size,
    );
}

/// The summary table on MySQL/MariaDB: the relay beside the naive relay.
pub(super) fn print_summary(runs: &[Run]) {
    println!("  keys            relay ev/s  naive ev/s  relay/naive");
    for r in runs {
        let naive = r
            .naive
            .as_ref()
            .map_or("-".into(), |n| format!("{:.0}", n.events_per_second));
        println!(
            "  {:>6}  {:>20}  {:>10}  {:>11}",
            r.keys,
            format!("{:.0}", r.relay.events_per_second),
            naive,
            r.speedup.map_or("-".into(), |s| format!("{s:.1}x"))
        );
    }
}

/// Fills, analyses and drains a backlog of `--rows` with the relay in a scratch database, then
/// runs retention on the drained table.
pub(super) async fn relay_drain(ctx: &MyCtx, keys: usize) -> anyhow::Result<(Drain, Retention)> {
    let scratch = Scratch::new(&ctx.pool, &ctx.js, &ctx.options, "relay").await?;
    let r = relay_drain_in(&ctx.options, &scratch, keys).await;
    scratch.drop().await;
    r
}

/// Fills and drains `rows` with the naive relay, in a scratch database holding only its table.
pub(super) async fn naive_drain(ctx: &MyCtx, keys: usize, rows: usize) -> anyhow::Result<Drain> {
    let scratch = Scratch::new(&ctx.pool, &ctx.js, &ctx.options, "naive").await?;
    let n = naive_drain_in(&ctx.options, &scratch, keys, rows).await;
    scratch.drop().await;
    n
}

async fn relay_drain_in(
    options: &Options,
    scratch: &Scratch,
    keys: usize,
) -> anyhow::Result<(Drain, Retention)> {
    let rows = options.rows;
    scratch.migrate(options).await?;
    if options.binlog {
        // The sequencer's first start (which takes what the table holds) before the backlog is
        // written: the relay then reads the backlog from the binlog, as after an outage.
        let store = outbox_db::tools::mysql::MysqlStore::binlog(
            scratch.pool.clone(),
            scratch.schema.clone(),
            &options.database_url,
        )?;
        if let Some(sequencer) = store.sequencer() {
            sequencer.start();
            sequencer
                .wait_until_sequenced(Duration::from_secs(60))
                .await?;
            sequencer.stop().await;
        }
    }
    // Ranges of half the backlog: the two laid ahead hold it, and both can go once drained.
    let width = i64::try_from(rows.div_ceil(2).max(1000)).unwrap_or(i64::MAX);
    outbox_db::tools::mysql::set_range_width(&scratch.pool, &scratch.schema, width).await?;
    let probe = Probe::start(&scratch.js, &scratch.stream).await?;
    let took = load::fill_into(
        &MysqlTarget::new(&scratch.pool, &scratch.schema),
        rows,
        keys,
        &load::pad(options.payload_bytes),
        &probe.latency(),
    )
    .await?;
    println!(
        "  keys {keys:>6}  filled {rows} rows in {:.2} s ({:.0} rows/s)",
        took.as_secs_f64(),
        rows as f64 / took.as_secs_f64()
    );
    if options.analyze {
        scratch.analyze("outbox").await?;
    }
    let started = Instant::now();
    let meter = CpuMeter::start_with(SERVER);
    let relay = RelayOnMysql::start(options, scratch).await?;
    let drained = wait_published(&relay.metrics, rows as u64, started).await;
    relay.stop().await;
    let mut timing = drained?;
    timing.cpu = meter.per_message(rows as u64);
    let drain = finish(scratch, probe, rows as u64, timing).await?;
    let drained = scratch.footprint("outbox").await?;
    let store =
        outbox_db::tools::mysql::MysqlStore::new(scratch.pool.clone(), scratch.schema.clone());
    let purged = outbox_core::Store::maintain(&store, Duration::ZERO).await?;
    let after = scratch.footprint("outbox").await?;
    Ok((
        drain,
        Retention {
            drained,
            purged,
            after,
        },
    ))
}

/// The message table once drained, what retention then did, and the table after it.
#[derive(Debug, serde::Serialize)]
pub(super) struct Retention {
    drained: Footprint,
    purged: outbox_core::Maintenance,
    after: Footprint,
}

impl Retention {
    /// Prints the footprints and what retention dropped, for the key count `keys`.
    pub(super) fn print(&self, keys: usize) {
        for (when, f) in [
            ("after the drain", &self.drained),
            ("after retention", &self.after),
        ] {
            println!(
                "  keys {keys:>6}  {when}: outbox table {:.1} MiB (data {:.1}, indexes {:.1}), \
                 InnoDB history list length {}",
                f.total_mib(),
                f.data_bytes as f64 / 1048576.0,
                f.index_bytes as f64 / 1048576.0,
                f.history_length.map_or("-".into(), |h: i64| h.to_string()),
            );
        }
        println!(
            "  keys {keys:>6}  retention (older than 0 s) dropped {} ranges whole",
            self.purged.segments_dropped
        );
    }
}

async fn naive_drain_in(
    options: &Options,
    scratch: &Scratch,
    keys: usize,
    rows: usize,
) -> anyhow::Result<Drain> {
    // Raw baseline, excepted by issue 47: the naive table, its fill and its relay below are the
    // seed articles' SQL, not the outbox's.
    sqlx::raw_sql(&scratch.schema.render(NAIVE_TABLE))
        .execute(&scratch.pool)
        .await
        .context("creating the naive table")?;
    let probe = Probe::start(&scratch.js, &scratch.stream).await?;
    let pad = load::pad(options.payload_bytes);
    let insert = scratch.schema.render(
        "INSERT INTO {schema}.outbox_naive (id, aggregate_type, aggregate_id, event_type, payload) ",
    );
    let latency = probe.latency();
    for start in (0..rows).step_by(FILL_TX_ROWS) {
        let end = (start + FILL_TX_ROWS).min(rows);
        let ids: Vec<Uuid> = (start..end).map(|_| Uuid::now_v7()).collect();
        let mut q = sqlx::QueryBuilder::<sqlx::MySql>::new(&insert);
        q.push_values((start..end).zip(&ids), |mut row, (i, id)| {
            row.push_bind(id.to_string())
                .push_bind("bench")
                .push_bind(format!("key-{}", i % keys.max(1)))
                .push_bind("created")
                .push_bind(serde_json::json!({ "n": i, "pad": pad }).to_string());
        });
        let mut tx = scratch.pool.begin().await?;
        q.build().execute(&mut *tx).await?;
        let sent = latency.stamp();
        tx.commit().await?;
        latency.committed(ids, sent);
    }
    if options.analyze {
        scratch.analyze("outbox_naive").await?;
    }
    // The seed's relay, on a session of the database's default isolation, as an app has it.
    let mut conn = <sqlx::MySqlConnection as sqlx::Connection>::connect_with(
        &outbox_db::tools::mysql::connect_options(&options.database_url)?,
    )
    .await?;
    let select = scratch.schema.render(
        "SELECT id, event_type, CAST(payload AS CHAR) AS payload FROM {schema}.outbox_naive \
         WHERE status = 'PENDING' ORDER BY created_at LIMIT 100 FOR UPDATE SKIP LOCKED",
    );
    let update = scratch
        .schema
        .render("UPDATE {schema}.outbox_naive SET status = 'SENT' WHERE id = ?");
    let meter = CpuMeter::start_with(SERVER);
    let started = Instant::now();
    let mut published = 0u64;
    loop {
        let mut tx = sqlx::Connection::begin(&mut conn).await?;
        let batch = sqlx::query(&select).fetch_all(&mut *tx).await?;
        if batch.is_empty() {
            tx.commit().await?;
            break;
        }
        for row in batch {
            let id: String = row.try_get("id")?;
            let event_type: String = row.try_get("event_type")?;
            let payload: String = row.try_get("payload")?;
            let mut headers = async_nats::HeaderMap::new();
            headers.insert("Nats-Msg-Id", id.as_str());
            scratch
                .js
                .publish_with_headers(
                    format!("{}.{event_type}", scratch.subject_prefix),
                    headers,
                    payload.into(),
                )
                .await
                .context("naive publish")?
                .await
                .context("naive publish ack")?;
            sqlx::query(&update).bind(&id).execute(&mut *tx).await?;
            published += 1;
        }
        tx.commit().await?;
    }
    let took = started.elapsed();
    if published != rows as u64 {
        anyhow::bail!("the naive relay published {published} of {rows} rows");
    }
    let timing = DrainTiming {
        took,
        tenth: None,
        ninth_tenth: None,
        cpu: meter.per_message(published),
    };
    finish(scratch, probe, rows as u64, timing).await
}

async fn finish(
    scratch: &Scratch,
    probe: Probe,
    rows: u64,
    timing: DrainTiming,
) -> anyhow::Result<Drain> {
    finish_with(probe, rows, timing, scratch.stream_messages()).await
}
