//! Writers mode, on PostgreSQL or MySQL/MariaDB: what writing an outbox row costs a business
//! transaction, pgbench-style.
//!
//! `--clients` connections run transactions back to back for `--duration` per variant. Each
//! transaction is `UPDATE accounts SET balance = balance + 1 WHERE id = <random>` on a table of
//! `--accounts` rows, plus one outbox row written
//! (a) through the writer API (after the UPDATE, as documented),
//! (b) with the raw SQL insert of the SQL contract,
//! (c) into the seed articles' naive table (uuid key, `status`, `(status, created_at)` index),
//! or (d) nothing: the UPDATE alone, the ceiling; on PostgreSQL also (e) CDC mode's emit.
//! The variants run in four alternating rounds (order rotated) in one scratch outbox, so drift
//! on a shared machine spreads over all of them. No relay runs: this is the write path alone.
//! TPS = committed transactions / wall time of the variant. The target is a/c and b/c ≥ 90%.
//!
//! Each database's setup and client loop is in `postgres` and `mysql`; the raw and naive
//! inserts there are the raw baseline SQL issue 47 excepts.

mod mysql;
mod postgres;

use std::time::Duration;

use serde::Serialize;

use crate::bed::Bed;
use crate::{verdict, Report};

/// Default time per variant.
const DEFAULT_DURATION: Duration = Duration::from_secs(20);
/// Target share of the naive table's TPS.
const TARGET_RATIO: f64 = 0.9;
/// Rounds the variants alternate in.
const ROUNDS: u32 = 4;

/// What each transaction writes besides the UPDATE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Variant {
    WriterApi,
    RawSql,
    Naive,
    UpdateOnly,
    /// The table-less writer of CDC mode: a transactional logical message, no row
    /// (PostgreSQL only).
    Emit,
}

impl Variant {
    /// The variant's key in the JSON report.
    fn name(self) -> &'static str {
        match self {
            Variant::WriterApi => "writer_api",
            Variant::RawSql => "raw_sql",
            Variant::Naive => "naive_table",
            Variant::UpdateOnly => "update_only",
            Variant::Emit => "emit",
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

/// One database's clients, ready to run the variants.
trait Clients {
    /// The variants this database runs, in their first round's order.
    fn variants(&self) -> &'static [Variant];
    /// The variant's line in the text report.
    fn label(&self, variant: Variant) -> &'static str;
    /// Runs `variant` for `duration` on every client at once.
    async fn run_variant(&self, variant: Variant, duration: Duration) -> anyhow::Result<Tps>;
}

/// Runs writers mode on the database of `bed`.
pub async fn run(bed: Bed<'_>) -> anyhow::Result<Report> {
    let o = bed.options();
    let duration = o.duration.unwrap_or(DEFAULT_DURATION);
    let results = match bed {
        Bed::Postgres(ctx) => postgres::run(ctx, duration).await?,
        Bed::Mysql(ctx) => mysql::run(ctx, duration).await?,
    };
    let tps = |v: Variant| {
        results
            .iter()
            .find(|(x, _)| *x == v)
            .map_or(0.0, |(_, t)| t.tps)
    };
    let naive = tps(Variant::Naive);
    let ratio = |v: Variant| if naive > 0.0 { tps(v) / naive } else { 0.0 };
    let (a, b) = (ratio(Variant::WriterApi), ratio(Variant::RawSql));
    let (writer, raw) = match bed {
        Bed::Postgres(_) => ("writer API", "raw SQL"),
        Bed::Mysql(_) => ("writer", "plain INSERT"),
    };
    println!(
        "  {writer} / naive table: {:.0}% ({}), {raw} / naive table: {:.0}% ({}); target ≥ {:.0}%",
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
    let mut figures = serde_json::json!({
        "mode": "writers", "clients": o.clients, "accounts": o.accounts,
        "variants": by_name,
        "ratios": { "writer_api_vs_naive": a, "raw_sql_vs_naive": b, "target": TARGET_RATIO },
    });
    match bed {
        Bed::Postgres(_) => {
            let e = ratio(Variant::Emit);
            println!(
                "  emit (CDC) / naive table: {:.0}% ({}; target ≥ 100%)",
                e * 100.0,
                verdict(e >= 1.0)
            );
            figures["ratios"]["emit_vs_naive"] = e.into();
        }
        Bed::Mysql(_) => figures["database"] = "mysql".into(),
    }
    Ok(Report::line(figures))
}

/// Runs every variant of `clients` for `duration` in all, in [`ROUNDS`] alternating rounds
/// (each a slice of the duration, the order rotated every round), so drift on a shared machine
/// (other load, checkpoints, autovacuum) spreads over all of them instead of favouring
/// whichever ran at the quiet moment; prints and returns each variant's TPS.
async fn rounds(clients: &impl Clients, duration: Duration) -> anyhow::Result<Vec<(Variant, Tps)>> {
    let slice = duration / ROUNDS;
    let mut totals: Vec<(Variant, Tps)> = clients
        .variants()
        .iter()
        .map(|v| (*v, Tps::default()))
        .collect();
    for round in 0..ROUNDS as usize {
        for k in 0..totals.len() {
            let i = (k + round) % totals.len();
            let t = clients.run_variant(totals[i].0, slice).await?;
            totals[i].1.transactions += t.transactions;
            totals[i].1.seconds += t.seconds;
        }
    }
    for (v, t) in &mut totals {
        t.tps = t.transactions as f64 / t.seconds.max(f64::EPSILON);
        println!(
            "  {:<44} {:>8.0} tps ({} transactions)",
            clients.label(*v),
            t.tps,
            t.transactions
        );
    }
    Ok(totals)
}
