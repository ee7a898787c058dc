//! What idle-tx mode reads on PostgreSQL around each run: the snapshot's holder (a separate
//! connection whose `REPEATABLE READ` transaction took its snapshot), the floor audit's count of
//! rows below their window's seq floor (0 unless the engine's floor is read wrong) every 5 s,
//! the dead tuples of the message table and its partitions as `pg_stat_user_tables` reports
//! them about a second after the drain (the snapshot still held), and the held snapshot's age.

use std::time::Duration;

use anyhow::Context as _;
use serde::Serialize;
use sqlx::{Connection as _, PgConnection};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::load::Paced;
use crate::scratch::{DeadTuples, Scratch};
use crate::{sql, Ctx};

/// What PostgreSQL showed of one run.
#[derive(Debug, Serialize)]
pub(super) struct Seen {
    /// The most rows the floor audit found below their window's seq floor (where claims pass
    /// over them) in any of its passes, one every 5 s during the load and one after the drain.
    rows_below_floor: u64,
    floor_audits: u64,
    dead_tuples: DeadTuples,
    /// Transaction ids consumed since the held snapshot was taken (`age(backend_xmin)`).
    held_xmin_age: Option<i32>,
    /// Other sessions of this database holding a snapshot older than 5 s when the run began:
    /// they hold the horizon too, for both runs.
    other_snapshots_at_start: i64,
}

impl Seen {
    /// The lines printed under the run's own.
    pub(super) fn print(&self) {
        println!(
            "    rows below their window's seq floor: {} (most found by any of {} floor audits)",
            self.rows_below_floor, self.floor_audits
        );
        if let Some(age) = self.held_xmin_age {
            println!("    the held snapshot is {age} transaction ids old at the end of the run");
        }
        if self.other_snapshots_at_start > 0 {
            println!(
                "    note: {} other session(s) held a snapshot when this run began; they pin the horizon too",
                self.other_snapshots_at_start
            );
        }
    }
}

/// The rows PostgreSQL adds at the end of the side-by-side table.
pub(super) fn rows(without: &Seen, with: &Seen) -> [(&'static str, [String; 2]); 2] {
    [
        (
            "dead tuples, message table",
            [without, with].map(|s| s.dead_tuples.table.to_string()),
        ),
        (
            "dead tuples, whole schema",
            [without, with].map(|s| s.dead_tuples.schema.to_string()),
        ),
    ]
}

/// Prints the mode's header, and a note when autovacuum is off.
pub(super) async fn header(ctx: &Ctx, spec: &Paced) -> anyhow::Result<()> {
    println!(
        "outbox bench: idle-tx, {} events/s for {:?} per run over {} connections, {}; \
         run 1 without, run 2 with a REPEATABLE READ snapshot held open",
        spec.rate,
        spec.duration,
        spec.producers,
        ctx.wake_up()
    );
    let autovacuum: String = sqlx::query_scalar(sql::SHOW_AUTOVACUUM)
        .fetch_one(&ctx.pool)
        .await?;
    if autovacuum != "on" {
        println!("  note: autovacuum is {autovacuum} on this server: only page pruning and index hints reclaim dead tuples, in both runs");
    }
    Ok(())
}

/// PostgreSQL's watch over one run.
pub(super) struct Watch<'s> {
    scratch: &'s Scratch,
    others: i64,
    holder: Option<Holder>,
    stop: CancellationToken,
    audits: Option<JoinHandle<anyhow::Result<(u64, u64)>>>,
}

impl<'s> Watch<'s> {
    /// Counts the other sessions' snapshots, then opens the holder when the run holds one.
    pub(super) async fn begin(ctx: &Ctx, scratch: &'s Scratch, hold: bool) -> anyhow::Result<Self> {
        let others = other_snapshots(scratch).await?;
        let holder = match hold {
            true => Some(Holder::open(ctx, scratch).await?),
            false => None,
        };
        Ok(Self {
            scratch,
            others,
            holder,
            stop: CancellationToken::new(),
            audits: None,
        })
    }

    /// Starts the floor audits, one every 5 s until [`Watch::drained`].
    pub(super) fn load_started(&mut self) {
        let (pool, schema) = (self.scratch.pool.clone(), self.scratch.schema.clone());
        let stop = self.stop.clone();
        self.audits = Some(tokio::spawn(async move {
            let db = <sqlx::Postgres as outbox_db::SqlxBackend>::database(pool, schema.as_str())?;
            let store = db
                .postgres()
                .context("the scratch outbox is a PostgreSQL one")?;
            let (mut worst, mut passes) = (0u64, 0u64);
            loop {
                let found = store.floor_audit().await?;
                worst = worst.max(found);
                passes += 1;
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_secs(5)) => {}
                    () = stop.cancelled() => break,
                }
            }
            worst = worst.max(store.floor_audit().await?);
            anyhow::Ok((worst, passes + 1))
        }));
    }

    /// After the drain: the audits' last pass, the dead tuples and the held snapshot's age.
    pub(super) async fn drained(&mut self) -> anyhow::Result<Seen> {
        self.stop.cancel();
        let (rows_below_floor, floor_audits) = match self.audits.take() {
            Some(audits) => audits.await??,
            None => (0, 0),
        };
        // Statistics reach pg_stat_user_tables about a second after the transactions.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let dead_tuples = self.scratch.dead_tuples("outbox").await?;
        let held_xmin_age = match &self.holder {
            Some(h) => h.xmin_age(self.scratch).await?,
            None => None,
        };
        Ok(Seen {
            rows_below_floor,
            floor_audits,
            dead_tuples,
            held_xmin_age,
            other_snapshots_at_start: self.others,
        })
    }

    /// Ends the held transaction (after the relay stopped).
    pub(super) async fn close(self) {
        self.stop.cancel();
        if let Some(h) = self.holder {
            h.close().await;
        }
    }
}

/// Sessions of this database, other than ours, holding a snapshot taken more than 5 s ago.
async fn other_snapshots(scratch: &Scratch) -> anyhow::Result<i64> {
    Ok(sqlx::query_scalar(sql::OTHER_SNAPSHOTS)
        .fetch_one(&scratch.pool)
        .await?)
}

/// A connection holding a REPEATABLE READ transaction whose snapshot is taken.
struct Holder {
    conn: PgConnection,
    pid: i32,
}

impl Holder {
    async fn open(ctx: &Ctx, scratch: &Scratch) -> anyhow::Result<Self> {
        sqlx::raw_sql(&scratch.schema.render(sql::HELD_REPORT))
            .execute(&scratch.pool)
            .await?;
        let mut conn = PgConnection::connect(&ctx.options.database_url)
            .await
            .context("opening the connection that holds the snapshot")?;
        let pid: i32 = sqlx::query_scalar(sql::BACKEND_PID)
            .fetch_one(&mut conn)
            .await?;
        sqlx::raw_sql(sql::BEGIN_REPEATABLE_READ)
            .execute(&mut conn)
            .await?;
        // The first query takes the snapshot, which the transaction keeps to its end.
        sqlx::raw_sql(&scratch.schema.render(sql::HELD_READ))
            .execute(&mut conn)
            .await?;
        let holder = Self { conn, pid };
        if holder.xmin_age(scratch).await?.is_none() {
            anyhow::bail!("the held transaction shows no snapshot (backend_xmin is null)");
        }
        Ok(holder)
    }

    /// Transaction ids consumed since the snapshot was taken.
    async fn xmin_age(&self, scratch: &Scratch) -> anyhow::Result<Option<i32>> {
        Ok(sqlx::query_scalar(sql::XMIN_AGE)
            .bind(self.pid)
            .fetch_optional(&scratch.pool)
            .await?
            .flatten())
    }

    async fn close(mut self) {
        let _ = sqlx::raw_sql(sql::ROLLBACK).execute(&mut self.conn).await;
        let _ = self.conn.close().await;
    }
}
