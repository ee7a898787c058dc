//! Writers mode: what writing an outbox row costs a business transaction, pgbench-style.
//!
//! `--clients` connections run transactions back to back for `--duration` per variant. Each
//! transaction is `UPDATE accounts SET balance = balance + 1 WHERE id = <random>` on a table of
//! `--accounts` rows, plus one outbox row written
//! (a) through the writer API (`Writer::enqueue`, after the UPDATE, as documented),
//! (b) with the raw SQL insert of the SQL contract,
//! (c) into the seed articles' naive table (uuid key, `status`, `(status, created_at)` index),
//! or (d) nothing: the UPDATE alone, the ceiling.
//! The variants run in four alternating rounds (order rotated) in one scratch schema, each after a `CHECKPOINT` so each
//! starts with the same full-page-write debt. No relay runs: this is the write path alone.
//! TPS = committed transactions / wall time of the variant. The target is a/c and b/c ≥ 90%.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use outbox_core::NewMessage;
use outbox_postgres::Writer;
use serde::Serialize;
use sqlx::pool::PoolConnection;
use sqlx::{Connection as _, Postgres};

use crate::scratch::Scratch;
use crate::{naive, sql, verdict, Ctx, Report};

/// Default time per variant.
const DEFAULT_DURATION: Duration = Duration::from_secs(20);
/// Target share of the naive table's TPS.
const TARGET_RATIO: f64 = 0.9;

/// What each transaction writes besides the UPDATE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Variant {
    WriterApi,
    RawSql,
    Naive,
    UpdateOnly,
    /// The table-less writer of CDC mode: a transactional logical message, no row.
    Emit,
}

impl Variant {
    const ALL: [Variant; 5] = [
        Variant::WriterApi,
        Variant::RawSql,
        Variant::Naive,
        Variant::UpdateOnly,
        Variant::Emit,
    ];

    fn label(self) -> &'static str {
        match self {
            Variant::WriterApi => "(a) UPDATE + writer API enqueue",
            Variant::RawSql => "(b) UPDATE + raw SQL INSERT into outbox",
            Variant::Naive => "(c) UPDATE + INSERT into naive seed table",
            Variant::UpdateOnly => "(d) UPDATE alone",
            Variant::Emit => "(e) UPDATE + emit (CDC: logical message, no row)",
        }
    }
}

/// The statements of one run, rendered for the scratch schema.
#[derive(Clone)]
struct Statements {
    update: String,
    raw_insert: String,
    naive_insert: String,
    writer: Writer,
    emitter: outbox_postgres::Emitter,
}

/// TPS of one variant.
#[derive(Debug, Clone, Copy, Serialize)]
struct Tps {
    transactions: u64,
    seconds: f64,
    tps: f64,
}

/// Runs writers mode.
pub async fn run(ctx: &Ctx) -> anyhow::Result<Report> {
    let duration = ctx.duration(DEFAULT_DURATION);
    println!(
        "outbox bench: writers, {} clients, {:?} per variant, accounts table of {} rows, {} B payloads",
        ctx.options.clients, duration, ctx.options.accounts, ctx.options.payload_bytes
    );
    let scratch = Scratch::with_outbox(&ctx.pool, &ctx.js, ctx.options.storage, "writers").await?;
    // `emit` goes through `outbox_emit`, which exists with the group's CDC setup and refuses
    // while the group has no slot: the scratch schema gets both for the run, dropped after it.
    let names = outbox_postgres::cdc::CdcNames::new(&scratch.schema, "bench")?;
    let result = match outbox_postgres::cdc::setup::migrate_cdc(&scratch.pool, &names).await {
        Ok(_) => measure(ctx, &scratch, duration).await,
        Err(e) => Err(e.into()),
    };
    if let Err(error) = outbox_postgres::cdc::setup::drop_cdc(&scratch.pool, &names).await {
        eprintln!("outbox bench: the writers run's CDC slot could not be dropped: {error}");
    }
    scratch.drop().await;
    let tps = result?;
    Ok(report(ctx, &tps))
}

async fn measure(
    ctx: &Ctx,
    scratch: &Scratch,
    duration: Duration,
) -> anyhow::Result<Vec<(Variant, Tps)>> {
    create_accounts(scratch, ctx.options.accounts).await?;
    naive::create(&scratch.pool, &scratch.schema).await?;
    let s = &scratch.schema;
    let statements = Statements {
        update: s.render(sql::ACCOUNT_CREDIT),
        raw_insert: s.render(sql::OUTBOX_RAW_INSERT),
        naive_insert: s.render(sql::NAIVE_INSERT),
        writer: Writer::new(s),
        emitter: outbox_postgres::Emitter::new(s),
    };
    // Variants alternate in rounds (each a slice of the duration, the order rotated every
    // round), so drift on a shared machine (other load, checkpoints, autovacuum) spreads over
    // all of them instead of favouring whichever ran at the quiet moment.
    const ROUNDS: u32 = 4;
    let slice = duration / ROUNDS;
    let mut totals: Vec<(Variant, Tps)> = Variant::ALL
        .iter()
        .map(|v| {
            (
                *v,
                Tps {
                    transactions: 0,
                    seconds: 0.0,
                    tps: 0.0,
                },
            )
        })
        .collect();
    for round in 0..ROUNDS as usize {
        for k in 0..totals.len() {
            let i = (k + round) % totals.len();
            let v = totals[i].0;
            checkpoint(scratch).await;
            let t = run_variant(ctx, scratch, &statements, v, slice).await?;
            totals[i].1.transactions += t.transactions;
            totals[i].1.seconds += t.seconds;
        }
    }
    let mut out = Vec::new();
    for (v, mut t) in totals {
        t.tps = t.transactions as f64 / t.seconds.max(f64::EPSILON);
        println!(
            "  {:<44} {:>8.0} tps ({} transactions)",
            v.label(),
            t.tps,
            t.transactions
        );
        out.push((v, t));
    }
    Ok(out)
}

/// A pgbench-like accounts table: integer key, balance, 84 bytes of filler; vacuumed and
/// analysed like `pgbench -i` leaves it.
async fn create_accounts(scratch: &Scratch, rows: usize) -> anyhow::Result<()> {
    sqlx::raw_sql(&scratch.schema.render(sql::ACCOUNTS))
        .execute(&scratch.pool)
        .await?;
    sqlx::query(&scratch.schema.render(sql::ACCOUNTS_FILL))
        .bind(i32::try_from(rows.max(1)).context("--accounts is too large")?)
        .execute(&scratch.pool)
        .await?;
    sqlx::raw_sql(&scratch.schema.render(sql::ACCOUNTS_VACUUM))
        .execute(&scratch.pool)
        .await?;
    Ok(())
}

/// `CHECKPOINT`, so a variant does not inherit the previous one's dirty pages. Needs superuser
/// or `pg_checkpoint`; without them the variants simply run without it.
async fn checkpoint(scratch: &Scratch) {
    if let Err(error) = sqlx::raw_sql(sql::CHECKPOINT).execute(&scratch.pool).await {
        tracing::debug!(%error, "CHECKPOINT refused; variants run without it");
    }
}

async fn run_variant(
    ctx: &Ctx,
    scratch: &Scratch,
    statements: &Statements,
    variant: Variant,
    duration: Duration,
) -> anyhow::Result<Tps> {
    // Connections first, so every client starts at the same instant.
    let mut conns = Vec::with_capacity(ctx.options.clients);
    for _ in 0..ctx.options.clients.max(1) {
        conns.push(scratch.pool.acquire().await?);
    }
    let accounts = i32::try_from(ctx.options.accounts.max(1)).context("--accounts is too large")?;
    let pad = ctx.pad();
    let started = Instant::now();
    let deadline = started + duration;
    let mut tasks = Vec::new();
    for conn in conns {
        let (st, pad) = (statements.clone(), pad.clone());
        tasks.push(tokio::spawn(async move {
            client(conn, &st, variant, deadline, accounts, &pad).await
        }));
    }
    let mut transactions = 0;
    for t in tasks {
        transactions += t.await??;
    }
    let seconds = started.elapsed().as_secs_f64();
    Ok(Tps {
        transactions,
        seconds,
        tps: transactions as f64 / seconds,
    })
}

/// One client: business transactions back to back until `deadline`; returns how many committed.
async fn client(
    mut conn: PoolConnection<Postgres>,
    st: &Statements,
    variant: Variant,
    deadline: Instant,
    accounts: i32,
    pad: &str,
) -> anyhow::Result<u64> {
    let mut committed = 0;
    while Instant::now() < deadline {
        let id = fastrand::i32(1..=accounts);
        let payload = serde_json::json!({ "account": id, "amount": 1, "pad": pad });
        let mut tx = conn.begin().await?;
        sqlx::query(&st.update).bind(id).execute(&mut *tx).await?;
        match variant {
            Variant::WriterApi => {
                let m = NewMessage::new("account", id.to_string(), "credited", payload);
                st.writer.enqueue(&mut tx, &m).await?;
            }
            Variant::RawSql | Variant::Naive => {
                let sql = if variant == Variant::RawSql {
                    &st.raw_insert
                } else {
                    &st.naive_insert
                };
                sqlx::query(sql)
                    .bind("account")
                    .bind(id.to_string())
                    .bind("credited")
                    .bind(payload.to_string())
                    .execute(&mut *tx)
                    .await?;
            }
            Variant::UpdateOnly => {}
            Variant::Emit => {
                let m = NewMessage::new("account", id.to_string(), "credited", payload);
                st.emitter.emit(&mut tx, &m).await?;
            }
        }
        tx.commit().await?;
        committed += 1;
    }
    Ok(committed)
}

fn report(ctx: &Ctx, results: &[(Variant, Tps)]) -> Report {
    let tps = |v: Variant| {
        results
            .iter()
            .find(|(x, _)| *x == v)
            .map_or(0.0, |(_, t)| t.tps)
    };
    let naive = tps(Variant::Naive);
    let ratio = |v: Variant| if naive > 0.0 { tps(v) / naive } else { 0.0 };
    let (a, b) = (ratio(Variant::WriterApi), ratio(Variant::RawSql));
    let e = ratio(Variant::Emit);
    println!(
        "  writer API / naive table: {:.0}% ({}), raw SQL / naive table: {:.0}% ({}); target ≥ {:.0}%",
        a * 100.0,
        verdict(a >= TARGET_RATIO),
        b * 100.0,
        verdict(b >= TARGET_RATIO),
        TARGET_RATIO * 100.0
    );
    println!(
        "  emit (CDC) / naive table: {:.0}% ({}; target ≥ 100%)",
        e * 100.0,
        verdict(e >= 1.0)
    );
    let by_name: serde_json::Map<String, serde_json::Value> = results
        .iter()
        .map(|(v, t)| {
            let name = match v {
                Variant::WriterApi => "writer_api",
                Variant::RawSql => "raw_sql",
                Variant::Naive => "naive_table",
                Variant::UpdateOnly => "update_only",
                Variant::Emit => "emit",
            };
            (name.to_string(), serde_json::json!(t))
        })
        .collect();
    Report::line(serde_json::json!({
        "mode": "writers", "clients": ctx.options.clients, "accounts": ctx.options.accounts,
        "variants": by_name,
        "ratios": { "writer_api_vs_naive": a, "raw_sql_vs_naive": b, "target": TARGET_RATIO,
                    "emit_vs_naive": e },
    }))
}
