//! The downstream ledger: a consumer with its own SQLite database and an inbox, reading the
//! broker independently of the relays.

use std::collections::HashSet;
use std::path::Path;
use std::time::Duration;

use outbox_db::SqlxBackend as _;
use outbox_inbox::{HandlerError, Handlers, InboxMessage, InboxProcessor, ProcessorConfig};
use outbox_sinks::read::{Delivered, Reader};
use sqlx::SqlitePool;
use uuid::Uuid;

/// Connections of the ledger's pool: SQLite's own default (one writer at a time, readers beside).
const LEDGER_CONNECTIONS: u32 = 8;
/// The balance table.
const LEDGER: &str = include_str!("../queries/ledger.sql");
/// Applies one payment to the balance.
const APPLY: &str = include_str!("../queries/ledger_apply.sql");
/// Payments applied and their total.
const TOTALS: &str = include_str!("../queries/ledger_totals.sql");

/// The downstream ledger: its own SQLite database, with an inbox. Every event read from the
/// broker is recorded in `inbox_messages` (a redelivery is absorbed there, by message id), and
/// an [`InboxProcessor`] applies each payment to the balance once: its handler runs in a
/// transaction that also claims the message in `processed_messages` (see `docs/consumers.md`).
pub(crate) struct Ledger {
    pool: SqlitePool,
}

impl Ledger {
    /// A fresh ledger database at `path` (a previous run's is removed).
    pub async fn open(path: &Path) -> anyhow::Result<Self> {
        outbox_db::tools::remove_sqlite_database(path);
        let url = format!("sqlite://{}", path.display());
        let pool = sqlx::Sqlite::connect_pool(&url, LEDGER_CONNECTIONS).await?;
        outbox_inbox::migrate_sqlite(&pool).await?;
        sqlx::raw_sql(LEDGER).execute(&pool).await?;
        Ok(Self { pool })
    }

    /// The processor applying payments to the balance, once each.
    pub fn processor(&self) -> outbox_core::Result<InboxProcessor> {
        let handlers = Handlers::new().on_fn("payment.created", |tx, m| {
            Box::pin(async move {
                let cents = m.payload["amount_cents"]
                    .as_i64()
                    .ok_or_else(|| HandlerError::permanent("payment without amount_cents"))?;
                sqlx::query(APPLY).bind(cents).execute(&mut **tx).await?;
                Ok(())
            })
        });
        InboxProcessor::sqlite(
            self.pool.clone(),
            handlers,
            ProcessorConfig {
                workers: 1,
                poll_interval: Duration::from_millis(50),
                member_prefix: "ledger".into(),
                ..ProcessorConfig::default()
            },
        )
    }

    /// Records `events` in the inbox, in one transaction; returns (recorded, duplicates).
    async fn ingest(&self, events: &[Delivered]) -> anyhow::Result<(u64, u64)> {
        let messages: Vec<InboxMessage> = events
            .iter()
            .map(|e| {
                InboxMessage::from_broker(
                    "demo",
                    &e.payload,
                    e.headers.clone(),
                    e.id,
                    &e.destination,
                    Some(&e.key),
                )
            })
            .collect();
        // IMMEDIATE: take SQLite's write lock at BEGIN, so the processor's transactions wait
        // for this one instead of failing an upgrade from a read lock.
        let mut tx = sqlx::Sqlite::begin_writing(&self.pool).await?;
        let flags = outbox_inbox::Inbox::default()
            .ingest_many(&mut tx, &messages)
            .await?;
        tx.commit().await?;
        let recorded = flags.iter().filter(|f| **f).count() as u64;
        Ok((recorded, flags.len() as u64 - recorded))
    }

    /// Payments applied so far and their total, in cents.
    pub async fn totals(&self) -> anyhow::Result<(i64, i64)> {
        Ok(sqlx::query_as(TOTALS).fetch_one(&self.pool).await?)
    }
}

/// What the ledger consumer has seen so far.
#[derive(Default)]
pub(crate) struct Consumed {
    pub received: u64,
    pub recorded: u64,
    pub duplicates: u64,
    pub arrived: HashSet<Uuid>,
}

impl Consumed {
    /// Reads what reached the broker since the last call and records it in the ledger's inbox.
    pub async fn step(&mut self, broker: &mut dyn Reader, ledger: &Ledger) -> anyhow::Result<()> {
        let events = broker.poll(Duration::from_millis(250)).await.delivered;
        self.received += events.len() as u64;
        self.arrived.extend(events.iter().map(|e| e.id));
        let (ok, dup) = ledger.ingest(&events).await?;
        self.recorded += ok;
        self.duplicates += dup;
        Ok(())
    }
}
