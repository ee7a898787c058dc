//! Writers mode on MySQL/MariaDB: what writing an outbox row costs a business transaction.
//!
//! `--clients` connections run transactions back to back, each `UPDATE accounts SET balance =
//! balance + 1 WHERE id = <random>` on a table of `--accounts` rows plus one outbox row written
//! (a) through the MySQL writer (`enqueue`, after the UPDATE, as documented), (b) with the plain
//! four-column `INSERT` of the SQL contract, (c) into the seed articles' naive table (UUID key,
//! `status`, `(status, created_at)` index), or (d) nothing: the UPDATE alone, the ceiling.
//! The sessions keep the server's default isolation (REPEATABLE READ), as an application's do.
//! Variants run in four alternating rounds (order rotated), so drift spreads over all of them.
//! No relay runs. TPS = committed transactions / wall time; the target is a/c and b/c ≥ 90%.
//!
//! Where (a) and (b) can lose to (c) on InnoDB: the outbox row's trigger takes its partition's
//! counter row, which the transaction holds until it commits, so two clients whose keys share
//! one of the 64 partitions commit one after the other (docs/engine-mysql.md).

use std::time::{Duration, Instant};

use anyhow::Context as _;
use outbox_core::NewMessage;
use serde::Serialize;
use sqlx::mysql::MySqlPoolOptions;
use sqlx::{MySqlPool, QueryBuilder};

use super::{MyCtx, Scratch, NAIVE_TABLE};
use crate::{load, verdict, Report};

/// Default time per variant.
const DEFAULT_DURATION: Duration = Duration::from_secs(20);
/// Target share of the naive table's TPS.
const TARGET_RATIO: f64 = 0.9;
/// Rounds the variants alternate in.
const ROUNDS: u32 = 4;

/// The business table, shaped like pgbench's `pgbench_accounts`.
const ACCOUNTS: &str = "CREATE TABLE {schema}.accounts (
    id      INT      NOT NULL PRIMARY KEY,
    balance BIGINT   NOT NULL DEFAULT 0,
    filler  CHAR(84) NOT NULL DEFAULT ''
) ENGINE = InnoDB";
const CREDIT: &str = "UPDATE {schema}.accounts SET balance = balance + 1 WHERE id = ?";
const RAW_INSERT: &str = "INSERT INTO {schema}.outbox (aggregate_type, aggregate_id, event_type, payload) VALUES (?, ?, ?, ?)";
const NAIVE_INSERT: &str = "INSERT INTO {schema}.outbox_naive (aggregate_type, aggregate_id, event_type, payload) VALUES (?, ?, ?, ?)";

/// What each transaction writes besides the UPDATE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Variant {
    WriterApi,
    RawSql,
    Naive,
    UpdateOnly,
}

impl Variant {
    const ALL: [Variant; 4] = [
        Variant::WriterApi,
        Variant::RawSql,
        Variant::Naive,
        Variant::UpdateOnly,
    ];

    fn label(self) -> &'static str {
        match self {
            Variant::WriterApi => "(a) UPDATE + MySQL writer enqueue",
            Variant::RawSql => "(b) UPDATE + plain INSERT into outbox",
            Variant::Naive => "(c) UPDATE + INSERT into naive seed table",
            Variant::UpdateOnly => "(d) UPDATE alone",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Variant::WriterApi => "writer_api",
            Variant::RawSql => "raw_sql",
            Variant::Naive => "naive_table",
            Variant::UpdateOnly => "update_only",
        }
    }
}

/// TPS of one variant.
#[derive(Debug, Clone, Copy, Default, Serialize)]
struct Tps {
    transactions: u64,
    seconds: f64,
    tps: f64,
}

/// Runs writers mode on MySQL.
pub async fn run(ctx: &MyCtx) -> anyhow::Result<Report> {
    let o = &ctx.options;
    let duration = o.duration.unwrap_or(DEFAULT_DURATION);
    println!(
        "outbox bench on MySQL/MariaDB: writers, {} clients, {:?} per variant in {ROUNDS} rounds, \
         accounts table of {} rows, {} B payloads",
        o.clients, duration, o.accounts, o.payload_bytes
    );
    let scratch = Scratch::new(&ctx.pool, &ctx.js, o, "writers").await?;
    let result = measure(ctx, &scratch, duration).await;
    scratch.drop().await;
    let results = result?;
    Ok(report(ctx, &results))
}

async fn measure(
    ctx: &MyCtx,
    scratch: &Scratch,
    duration: Duration,
) -> anyhow::Result<Vec<(Variant, Tps)>> {
    let o = &ctx.options;
    let s = &scratch.schema;
    scratch.migrate(&ctx.options).await?;
    sqlx::raw_sql(&s.render(NAIVE_TABLE))
        .execute(&scratch.pool)
        .await
        .context("creating the naive table")?;
    sqlx::raw_sql(&s.render(ACCOUNTS))
        .execute(&scratch.pool)
        .await
        .context("creating the accounts table")?;
    let accounts = i32::try_from(o.accounts.max(1)).context("--accounts is too large")?;
    for start in (1..=accounts).step_by(1000) {
        let mut q = QueryBuilder::new(s.render("INSERT INTO {schema}.accounts (id) "));
        q.push_values(start..=(start + 999).min(accounts), |mut row, id| {
            row.push_bind(id);
        });
        q.build().execute(&scratch.pool).await?;
    }
    for table in ["accounts", "outbox", "outbox_naive"] {
        scratch.analyze(table).await?;
    }
    // Application sessions: the server's default isolation, no relay settings.
    let clients = o.clients.max(1);
    let pool = MySqlPoolOptions::new()
        .max_connections(clients as u32)
        .min_connections(clients as u32)
        .connect_with(outbox_mysql::connect_options(&o.database_url)?)
        .await
        .context("connecting the writers")?;
    let pad = load::pad(o.payload_bytes);
    let slice = duration / ROUNDS;
    let mut totals: Vec<(Variant, Tps)> =
        Variant::ALL.iter().map(|v| (*v, Tps::default())).collect();
    let outcome = async {
        for round in 0..ROUNDS as usize {
            for k in 0..totals.len() {
                let i = (k + round) % totals.len();
                let t = run_variant(&pool, s, totals[i].0, slice, clients, accounts, &pad).await?;
                totals[i].1.transactions += t.transactions;
                totals[i].1.seconds += t.seconds;
            }
        }
        anyhow::Ok(())
    }
    .await;
    pool.close().await;
    outcome?;
    for (v, t) in &mut totals {
        t.tps = t.transactions as f64 / t.seconds.max(f64::EPSILON);
        println!(
            "  {:<44} {:>8.0} tps ({} transactions)",
            v.label(),
            t.tps,
            t.transactions
        );
    }
    Ok(totals)
}

async fn run_variant(
    pool: &MySqlPool,
    schema: &outbox_mysql::Schema,
    variant: Variant,
    duration: Duration,
    clients: usize,
    accounts: i32,
    pad: &str,
) -> anyhow::Result<Tps> {
    let started = Instant::now();
    let deadline = started + duration;
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let (pool, schema, pad) = (pool.clone(), schema.clone(), pad.to_string());
        tasks.push(tokio::spawn(async move {
            client(&pool, &schema, variant, deadline, accounts, &pad).await
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
    pool: &MySqlPool,
    schema: &outbox_mysql::Schema,
    variant: Variant,
    deadline: Instant,
    accounts: i32,
    pad: &str,
) -> anyhow::Result<u64> {
    let (credit, raw, naive) = (
        schema.render(CREDIT),
        schema.render(RAW_INSERT),
        schema.render(NAIVE_INSERT),
    );
    let mut committed = 0;
    while Instant::now() < deadline {
        let id = fastrand::i32(1..=accounts);
        let payload = serde_json::json!({ "account": id, "amount": 1, "pad": pad });
        let mut tx = pool.begin().await?;
        sqlx::query(&credit).bind(id).execute(&mut *tx).await?;
        match variant {
            Variant::WriterApi => {
                let m = NewMessage::new("account", id.to_string(), "credited", payload);
                outbox_mysql::enqueue(&mut tx, schema, &m).await?;
            }
            Variant::RawSql | Variant::Naive => {
                let sql = if variant == Variant::RawSql {
                    &raw
                } else {
                    &naive
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
        }
        tx.commit().await?;
        committed += 1;
    }
    Ok(committed)
}

fn report(ctx: &MyCtx, results: &[(Variant, Tps)]) -> Report {
    let tps = |v: Variant| {
        results
            .iter()
            .find(|(x, _)| *x == v)
            .map_or(0.0, |(_, t)| t.tps)
    };
    let naive = tps(Variant::Naive);
    let ratio = |v: Variant| if naive > 0.0 { tps(v) / naive } else { 0.0 };
    let (a, b) = (ratio(Variant::WriterApi), ratio(Variant::RawSql));
    println!(
        "  writer / naive table: {:.0}% ({}), plain INSERT / naive table: {:.0}% ({}); target ≥ {:.0}%",
        a * 100.0,
        verdict(a >= TARGET_RATIO),
        b * 100.0,
        verdict(b >= TARGET_RATIO),
        TARGET_RATIO * 100.0
    );
    let by_name: serde_json::Map<String, serde_json::Value> = results
        .iter()
        .map(|(v, t)| (v.name().to_string(), serde_json::json!(t)))
        .collect();
    Report::line(serde_json::json!({
        "mode": "writers", "database": "mysql", "clients": ctx.options.clients,
        "accounts": ctx.options.accounts, "variants": by_name,
        "ratios": { "writer_api_vs_naive": a, "raw_sql_vs_naive": b, "target": TARGET_RATIO },
    }))
}
