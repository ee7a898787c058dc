//! Writers mode's setup and clients on PostgreSQL: the scratch schema with its CDC setup (for
//! the emit variant), the accounts and naive tables, a `CHECKPOINT` before each variant so
//! each starts with the same full-page-write debt, and the client loop. The raw SQL and naive
//! inserts are the raw baseline, excepted by issue 47 (`crate::sql`).

use std::time::{Duration, Instant};

use anyhow::Context as _;
use outbox_core::NewMessage;
use outbox_db::tools::postgres::Writer;
use outbox_db::SqlxBackend as _;
use sqlx::pool::PoolConnection;
use sqlx::{Connection as _, Postgres};

use super::{rounds, Clients, Tps, Variant};
use crate::scratch::Scratch;
use crate::{naive, sql, Ctx};

/// The statements of one run, rendered for the scratch schema.
#[derive(Clone)]
struct Statements {
    update: String,
    raw_insert: String,
    naive_insert: String,
    writer: Writer,
    emitter: outbox_db::tools::postgres::Emitter,
}

/// Runs the variants in a scratch schema, dropped after them with its CDC setup.
pub(super) async fn run(ctx: &Ctx, duration: Duration) -> anyhow::Result<Vec<(Variant, Tps)>> {
    println!(
        "outbox bench: writers, {} clients, {:?} per variant, accounts table of {} rows, {} B payloads",
        ctx.options.clients, duration, ctx.options.accounts, ctx.options.payload_bytes
    );
    let scratch = Scratch::with_outbox(&ctx.pool, &ctx.js, ctx.options.storage, "writers").await?;
    // `emit` goes through `outbox_emit`, which exists with the group's CDC setup and refuses
    // while the group has no slot: the scratch schema gets both for the run, dropped after it.
    let db = Postgres::database(scratch.pool.clone(), scratch.schema.as_str())?;
    let result = match db.migrate_cdc("bench").await {
        Ok(_) => measure(ctx, &scratch, duration).await,
        Err(e) => Err(e.into()),
    };
    if let Err(error) = db.drop_cdc("bench").await {
        eprintln!("outbox bench: the writers run's CDC slot could not be dropped: {error}");
    }
    scratch.drop().await;
    result
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
        emitter: outbox_db::tools::postgres::Emitter::new(s),
    };
    let clients = PgClients {
        ctx,
        scratch,
        statements,
    };
    rounds(&clients, duration).await
}

/// PostgreSQL's clients: connections of the scratch pool, the statements rendered for it.
struct PgClients<'a> {
    ctx: &'a Ctx,
    scratch: &'a Scratch,
    statements: Statements,
}

impl Clients for PgClients<'_> {
    fn variants(&self) -> &'static [Variant] {
        &[
            Variant::WriterApi,
            Variant::RawSql,
            Variant::Naive,
            Variant::UpdateOnly,
            Variant::Emit,
        ]
    }

    fn label(&self, variant: Variant) -> &'static str {
        match variant {
            Variant::WriterApi => "(a) UPDATE + writer API enqueue",
            Variant::RawSql => "(b) UPDATE + raw SQL INSERT into outbox",
            Variant::Naive => "(c) UPDATE + INSERT into naive seed table",
            Variant::UpdateOnly => "(d) UPDATE alone",
            Variant::Emit => "(e) UPDATE + emit (CDC: logical message, no row)",
        }
    }

    async fn run_variant(&self, variant: Variant, duration: Duration) -> anyhow::Result<Tps> {
        checkpoint(self.scratch).await;
        run_variant(self.ctx, self.scratch, &self.statements, variant, duration).await
    }
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
