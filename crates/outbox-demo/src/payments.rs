//! The payments service: its database (the outbox and a `payments` table) and its one business
//! transaction, a payment and its event committed together or rolled back together.

use std::collections::{HashMap, HashSet};

use outbox_core::NewMessage;
use outbox_db::{Backend, Database};
use uuid::Uuid;

/// The demo's default schema on PostgreSQL (database on MySQL); only schemas named like it are
/// ever dropped.
pub const DEMO_SCHEMA: &str = "outbox_demo";

/// The payments table.
const PAYMENTS: &str = include_str!("../queries/payments.sql");
/// One payment row.
const PAY: &str = include_str!("../queries/pay.sql");

/// Opens the payments service's database (the outbox and a `payments` table) from nothing:
/// what a previous run left is dropped first, but never a PostgreSQL schema or a MySQL database
/// the demo did not make (one not named `outbox_demo…`).
pub(crate) async fn open(url: &str, schema: &str) -> anyhow::Result<Database> {
    let mut db = outbox_db::open(url, schema, 8).await?;
    if db.exists().await? {
        anyhow::ensure!(
            db.backend() == Backend::Sqlite || schema.starts_with(DEMO_SCHEMA),
            "demo: schema `{schema}` exists and is not a demo schema; pick another --schema (it is dropped and recreated)"
        );
        db.destroy().await?;
        db = outbox_db::open(url, schema, 8).await?;
    }
    db.migrate().await?;
    db.execute_script(PAYMENTS).await?;
    Ok(db)
}

/// One payment: the business row and its event in one transaction, committed or (when the
/// fraud check fails) rolled back. Returns the event's id.
pub(crate) async fn pay(db: &Database, amount_cents: i64, fraud: bool) -> anyhow::Result<Uuid> {
    let payment = Uuid::now_v7();
    let event = NewMessage::new(
        "payment",
        payment.to_string(),
        "payment.created",
        serde_json::json!({ "payment_id": payment, "amount_cents": amount_cents }),
    );
    let mut tx = db.begin().await?;
    tx.execute(PAY, &[payment.to_string().into(), amount_cents.into()])
        .await?;
    tx.enqueue(&event).await?;
    if fraud {
        tx.rollback().await?;
    } else {
        tx.commit().await?;
    }
    Ok(event.id)
}

/// What the producer committed and rolled back: event ids, and each committed amount.
#[derive(Default)]
pub(crate) struct Produced {
    pub committed: HashMap<Uuid, i64>,
    pub rolled_back: HashSet<Uuid>,
}
