//! The receiving half of `outbox verify --through-inbox`: the inbox tables beside the run's
//! outbox, the handler the inbox processor runs (one `verify_effects` row per message, in the
//! handler's transaction), and reading the effects back.
//!
//! Handlers run in processes of their own (`outbox verify-inbox-handler`, hidden), so the
//! `kill` and `pause` faults hit them as they hit relays and `outbox inbox` daemons.

use std::time::Duration;

use anyhow::Context as _;
use outbox_inbox::{HandlerError, Handlers, InboxProcessor, InboxSchema, ProcessorConfig};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::effects::Effect;

/// The message type the workload writes (`event_type`), which the handler is registered for.
pub const MESSAGE_TYPE: &str = "event";

/// The effects table: no constraint on the message id, so an effect applied twice shows.
const EFFECTS: &str = "
    CREATE TABLE IF NOT EXISTS {schema}.verify_effects (
        seq        bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        message_id uuid        NOT NULL,
        key        text        NOT NULL,
        applied_at timestamptz NOT NULL DEFAULT now())";

/// Creates the inbox tables in `schema` (its processing queue in `<schema>_inbox`) and the
/// effects table.
pub async fn prepare(pool: &PgPool, schema: &str) -> anyhow::Result<InboxSchema> {
    let s = InboxSchema::new(schema)?;
    outbox_inbox::migrate_postgres(pool, &s)
        .await
        .context("migrating the inbox")?;
    sqlx::raw_sql(&EFFECTS.replace("{schema}", schema))
        .execute(pool)
        .await
        .context("creating verify_effects")?;
    Ok(s)
}

/// Runs the inbox processor of `schema` with the verify handler until `shutdown`: what the
/// hidden `outbox verify-inbox-handler` command does.
pub async fn run_handlers(
    database_url: &str,
    schema: &str,
    lease: Duration,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let s = InboxSchema::new(schema)?;
    let pool = outbox_postgres::connect_pool(database_url, 12).await?;
    let insert = format!("INSERT INTO {schema}.verify_effects (message_id, key) VALUES ($1, $2)");
    let handlers = Handlers::new().on_fn(MESSAGE_TYPE, move |tx, m| {
        let insert = insert.clone();
        Box::pin(async move {
            sqlx::query(&insert)
                .bind(m.id)
                .bind(&m.key)
                .execute(&mut **tx)
                .await
                .map_err(HandlerError::from)?;
            Ok(())
        })
    });
    let config = ProcessorConfig {
        workers: 1,
        batch_size: 200,
        concurrency: 8,
        lease,
        poll_interval: Duration::from_millis(50),
        retry: outbox_core::RetryPolicy {
            max_attempts: 100_000,
            base: Duration::from_millis(100),
            max: Duration::from_secs(2),
        },
        member_prefix: format!("verify-handler-{}", std::process::id()),
        ..ProcessorConfig::default()
    };
    InboxProcessor::postgres(pool, s, handlers, config)?
        .run(shutdown)
        .await;
    Ok(())
}

/// Every effect, in the order they committed.
pub async fn effects(pool: &PgPool, schema: &str) -> anyhow::Result<Vec<Effect>> {
    let rows: Vec<(Uuid, String)> = sqlx::query_as(&format!(
        "SELECT message_id, key FROM {schema}.verify_effects ORDER BY seq"
    ))
    .fetch_all(pool)
    .await
    .context("reading verify_effects")?;
    Ok(rows
        .into_iter()
        .map(|(id, key)| Effect { id, key })
        .collect())
}

/// Messages recorded in the inbox.
pub async fn ingested(pool: &PgPool, schema: &str) -> anyhow::Result<i64> {
    Ok(
        sqlx::query_scalar(&format!("SELECT count(*) FROM {schema}.inbox_messages"))
            .fetch_one(pool)
            .await?,
    )
}
