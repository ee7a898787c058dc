//! Inbox mode's database half on PostgreSQL: the scratch schema with the inbox and the bench's
//! tables, the naive consumers' transactions (raw baseline, excepted by issue 47: `crate::sql`)
//! and the processor with its handler.

use outbox_inbox::{Handlers, InboxProcessor, InboxSchema, ProcessorConfig};
use sqlx::PgPool;
use uuid::Uuid;

use super::{measure, Figures, InboxBench, Plan, Stream};
use crate::scratch::Scratch;
use crate::{sql, Ctx};

/// Measures `plan` in a scratch schema (and its inbox queue's), dropped after it.
pub(super) async fn run(ctx: &Ctx, plan: &Plan) -> anyhow::Result<Figures> {
    let s = Scratch::new(&ctx.pool, &ctx.js, ctx.options.storage, "inbox").await?;
    let stream = Stream {
        js: &s.js,
        name: &s.stream,
        subject_prefix: &s.subject_prefix,
    };
    let bench = PgInboxBench {
        url: &ctx.options.database_url,
        scratch: &s,
        inserts: (
            s.schema.render(sql::NAIVE_INBOX_INSERT),
            s.schema.render(sql::NAIVE_HANDLER_CLAIM),
            s.schema.render(sql::EFFECT_INSERT),
        ),
    };
    let result = match prepare_pg(&s).await {
        Ok(()) => measure(&bench, &stream, plan).await,
        Err(e) => Err(e),
    };
    // The inbox's processing queue lives in a schema of its own beside the scratch one.
    if let Ok(inbox) = InboxSchema::new(s.schema.as_str()) {
        let _ = sqlx::raw_sql(&inbox.queue().render(sql::DROP_SCHEMA_IF_EXISTS))
            .execute(&s.pool)
            .await;
    }
    s.drop().await;
    result
}

/// The inbox tables and the bench's own in the PostgreSQL scratch schema.
async fn prepare_pg(s: &Scratch) -> anyhow::Result<()> {
    let schema = InboxSchema::new(s.schema.as_str())?;
    outbox_inbox::migrate_postgres(&s.pool, &schema).await?;
    sqlx::raw_sql(&s.schema.render(sql::INBOX_TABLES))
        .execute(&s.pool)
        .await?;
    Ok(())
}

/// Inbox mode's database half on PostgreSQL.
struct PgInboxBench<'a> {
    url: &'a str,
    scratch: &'a Scratch,
    /// The naive ingest's insert, the naive handler's claim, the effect.
    inserts: (String, String, String),
}

/// Runs `statements` with `(id, key)` in one transaction; each after the first only if the
/// one before it affected a row (the claim gates the effect).
async fn pg_tx(pool: &PgPool, statements: &[&str], id: Uuid, key: &str) -> anyhow::Result<()> {
    let mut tx = pool.begin().await?;
    for sql in statements {
        let r = sqlx::query(sql)
            .bind(id)
            .bind(key)
            .execute(&mut *tx)
            .await?;
        if r.rows_affected() != 1 {
            break;
        }
    }
    tx.commit().await?;
    Ok(())
}

impl InboxBench for PgInboxBench<'_> {
    fn database_url(&self) -> &str {
        self.url
    }

    fn schema(&self) -> &str {
        self.scratch.schema.as_str()
    }

    async fn naive_ingest(&self, id: Uuid, key: &str) -> anyhow::Result<()> {
        pg_tx(&self.scratch.pool, &[&self.inserts.0], id, key).await
    }

    async fn naive_handle(&self, id: Uuid, key: &str) -> anyhow::Result<()> {
        pg_tx(
            &self.scratch.pool,
            &[&self.inserts.1, &self.inserts.2],
            id,
            key,
        )
        .await
    }

    async fn processor(&self, config: ProcessorConfig) -> anyhow::Result<InboxProcessor> {
        let insert = self.inserts.2.clone();
        let handlers = Handlers::new().on_fn("created", move |tx, m| {
            let insert = insert.clone();
            Box::pin(async move {
                sqlx::query(&insert)
                    .bind(m.id)
                    .bind(&m.key)
                    .execute(&mut **tx)
                    .await?;
                Ok(())
            })
        });
        let pool = <sqlx::Postgres as outbox_db::SqlxBackend>::connect_pool(self.url, 24).await?;
        let schema = InboxSchema::new(self.schema())?;
        Ok(InboxProcessor::postgres(pool, schema, handlers, config)?)
    }

    async fn effects(&self) -> anyhow::Result<i64> {
        Ok(
            sqlx::query_scalar(&self.scratch.schema.render(sql::EFFECTS_COUNT))
                .fetch_one(&self.scratch.pool)
                .await?,
        )
    }
}
