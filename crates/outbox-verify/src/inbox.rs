//! The receiving half of `outbox verify --through-inbox`: the inbox tables beside the run's
//! outbox (PostgreSQL or MySQL), the handler the inbox processor runs (one `verify_effects`
//! row per message, in the handler's transaction), and reading the effects back.
//!
//! Handlers run in processes of their own (`outbox verify-inbox-handler`, hidden), so the
//! `kill` and `pause` faults hit them as they hit relays and `outbox inbox` daemons.

use std::time::Duration;

use anyhow::Context as _;
use outbox_db::{Backend, SqlxBackend as _};
use outbox_inbox::{
    HandlerError, Handlers, InboxDatabase, InboxProcessor, InboxSchema, ProcessorConfig,
};
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
const MYSQL_EFFECTS: &str = "
    CREATE TABLE IF NOT EXISTS {schema}.verify_effects (
        seq        BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
        message_id CHAR(36)     NOT NULL,
        `key`      VARCHAR(255) NOT NULL,
        applied_at DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6))) ENGINE = InnoDB";

/// The handler's insert; ids are bound as text (`$1::uuid` on PostgreSQL).
const INSERT: &str =
    "INSERT INTO {schema}.verify_effects (message_id, key) VALUES (CAST($1 AS uuid), $2)";
const MYSQL_INSERT: &str = "INSERT INTO {schema}.verify_effects (message_id, `key`) VALUES (?, ?)";

/// Effects in commit order, as text on either database.
const READ: &str = "SELECT CAST(message_id AS text), key FROM {schema}.verify_effects ORDER BY seq";
const MYSQL_READ: &str = "SELECT CAST(message_id AS CHAR), CAST(`key` AS CHAR) \
                          FROM {schema}.verify_effects ORDER BY seq";

/// Opens the inbox beside the outbox of `database_url` (tables in `schema`, its processing
/// queue in `<schema>_inbox`), creates or upgrades it and the effects table.
pub async fn prepare(database_url: &str, schema: &str) -> anyhow::Result<InboxDatabase> {
    let inbox = InboxDatabase::open(database_url, schema, 4).await?;
    inbox.migrate().await.context("migrating the inbox")?;
    let effects = match inbox.tables().backend() {
        Backend::Mysql => MYSQL_EFFECTS,
        _ => EFFECTS,
    };
    inbox
        .tables()
        .execute_script(effects)
        .await
        .context("creating verify_effects")?;
    Ok(inbox)
}

fn config(lease: Duration) -> ProcessorConfig {
    ProcessorConfig {
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
    }
}

/// The verify handler on sqlx database `DB`: `insert` (rendered) with the message's id and key.
macro_rules! handlers {
    ($db:ty, $insert:expr) => {{
        let insert: String = $insert;
        Handlers::<$db>::new().on_fn(MESSAGE_TYPE, move |tx, m| {
            let insert = insert.clone();
            Box::pin(async move {
                sqlx::query(&insert)
                    .bind(m.id.to_string())
                    .bind(&m.key)
                    .execute(&mut **tx)
                    .await
                    .map_err(HandlerError::from)?;
                Ok(())
            })
        })
    }};
}

/// Runs the inbox processor of `schema` with the verify handler until `shutdown`: what the
/// hidden `outbox verify-inbox-handler` command does.
pub async fn run_handlers(
    database_url: &str,
    schema: &str,
    lease: Duration,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    // `schema` is the run's schema, or its database on MySQL: the inbox tables' place either way.
    let s = InboxSchema::new(schema)?;
    let place = s.tables().as_str();
    let processor = match Backend::of(database_url)? {
        Backend::Mysql => {
            let pool = sqlx::MySql::connect_pool(database_url, 12).await?;
            let handlers = handlers!(sqlx::MySql, MYSQL_INSERT.replace("{schema}", place));
            InboxProcessor::mysql(pool, s, handlers, config(lease))?
        }
        _ => {
            let pool = sqlx::Postgres::connect_pool(database_url, 12).await?;
            let handlers = handlers!(sqlx::Postgres, INSERT.replace("{schema}", place));
            InboxProcessor::postgres(pool, s, handlers, config(lease))?
        }
    };
    processor.run(shutdown).await;
    Ok(())
}

/// Every effect, in the order they committed.
pub async fn effects(inbox: &InboxDatabase) -> anyhow::Result<Vec<Effect>> {
    let read = match inbox.tables().backend() {
        Backend::Mysql => MYSQL_READ,
        _ => READ,
    };
    let rows: Vec<(String, String)> = inbox
        .tables()
        .fetch_all(read, &[])
        .await
        .context("reading verify_effects")?;
    rows.into_iter()
        .map(|(id, key)| {
            let id: Uuid = id.parse().context("an effect's message id")?;
            Ok(Effect { id, key })
        })
        .collect()
}

/// Messages recorded in the inbox.
pub async fn ingested(inbox: &InboxDatabase) -> anyhow::Result<i64> {
    let (n,): (i64,) = inbox
        .tables()
        .fetch_one("SELECT count(*) FROM {schema}.inbox_messages", &[])
        .await?;
    Ok(n)
}
