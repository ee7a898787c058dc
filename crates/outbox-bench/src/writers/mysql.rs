//! Writers mode's setup and clients on MySQL/MariaDB: the scratch database with the accounts
//! and naive tables, analysed, and a pool of application sessions keeping the server's default
//! isolation (REPEATABLE READ), as an application's do. The plain and naive inserts below are
//! the raw baseline, excepted by issue 47.
//!
//! Where (a) and (b) can lose to (c) on InnoDB: the outbox row's trigger takes its partition's
//! counter row, which the transaction holds until it commits, so two clients whose keys share
//! one of the 64 partitions commit one after the other (docs/engine-mysql.md).

use std::time::{Duration, Instant};

use anyhow::Context as _;
use outbox_core::NewMessage;
use sqlx::mysql::MySqlPoolOptions;
use sqlx::{MySqlPool, QueryBuilder};

use super::{rounds, Clients, Tps, Variant, ROUNDS};
use crate::load;
use crate::mysql::{MyCtx, Scratch, NAIVE_TABLE};

// Raw baseline, excepted by issue 47: the business table, its UPDATE and the plain and naive
// inserts.

/// The business table, shaped like pgbench's `pgbench_accounts`.
const ACCOUNTS: &str = "CREATE TABLE {schema}.accounts (
    id      INT      NOT NULL PRIMARY KEY,
    balance BIGINT   NOT NULL DEFAULT 0,
    filler  CHAR(84) NOT NULL DEFAULT ''
) ENGINE = InnoDB";
const CREDIT: &str = "UPDATE {schema}.accounts SET balance = balance + 1 WHERE id = ?";
const RAW_INSERT: &str = "INSERT INTO {schema}.outbox (aggregate_type, aggregate_id, event_type, payload) VALUES (?, ?, ?, ?)";
const NAIVE_INSERT: &str = "INSERT INTO {schema}.outbox_naive (aggregate_type, aggregate_id, event_type, payload) VALUES (?, ?, ?, ?)";

/// Runs the variants in a scratch database, dropped after them.
pub(super) async fn run(ctx: &MyCtx, duration: Duration) -> anyhow::Result<Vec<(Variant, Tps)>> {
    let o = &ctx.options;
    println!(
        "outbox bench on MySQL/MariaDB: writers, {} clients, {:?} per variant in {ROUNDS} rounds, \
         accounts table of {} rows, {} B payloads",
        o.clients, duration, o.accounts, o.payload_bytes
    );
    let scratch = Scratch::new(&ctx.pool, &ctx.js, o, "writers").await?;
    let result = measure(ctx, &scratch, duration).await;
    scratch.drop().await;
    result
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
        .connect_with(outbox_db::tools::mysql::connect_options(&o.database_url)?)
        .await
        .context("connecting the writers")?;
    let clients = MyClients {
        pool,
        schema: s.clone(),
        clients,
        accounts,
        pad: load::pad(o.payload_bytes),
    };
    let outcome = rounds(&clients, duration).await;
    clients.pool.close().await;
    outcome
}

/// MySQL's clients: the application sessions' pool and what each transaction writes.
struct MyClients {
    pool: MySqlPool,
    schema: outbox_db::tools::MysqlSchema,
    clients: usize,
    accounts: i32,
    pad: String,
}

impl Clients for MyClients {
    fn variants(&self) -> &'static [Variant] {
        &[
            Variant::WriterApi,
            Variant::RawSql,
            Variant::Naive,
            Variant::UpdateOnly,
        ]
    }

    fn label(&self, variant: Variant) -> &'static str {
        match variant {
            Variant::WriterApi => "(a) UPDATE + MySQL writer enqueue",
            Variant::RawSql => "(b) UPDATE + plain INSERT into outbox",
            Variant::Naive => "(c) UPDATE + INSERT into naive seed table",
            Variant::UpdateOnly => "(d) UPDATE alone",
            Variant::Emit => "(e) emit: PostgreSQL only",
        }
    }

    async fn run_variant(&self, variant: Variant, duration: Duration) -> anyhow::Result<Tps> {
        run_variant(
            &self.pool,
            &self.schema,
            variant,
            duration,
            self.clients,
            self.accounts,
            &self.pad,
        )
        .await
    }
}

async fn run_variant(
    pool: &MySqlPool,
    schema: &outbox_db::tools::MysqlSchema,
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
    schema: &outbox_db::tools::MysqlSchema,
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
                outbox_db::tools::mysql::enqueue(&mut tx, schema, &m).await?;
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
            Variant::Emit => anyhow::bail!("emit (CDC) runs on PostgreSQL only"),
        }
        tx.commit().await?;
        committed += 1;
    }
    Ok(committed)
}
