//! Inbox mode's database half on MySQL/MariaDB: the scratch database with the inbox and the
//! bench's tables, the naive consumers' transactions (raw baseline, excepted by issue 47: the
//! SQL below) and the processor with its handler.

use anyhow::Context as _;
use outbox_inbox::{Handlers, InboxProcessor, InboxSchema, ProcessorConfig};
use sqlx::MySqlPool;
use uuid::Uuid;

use super::{measure, Figures, InboxBench, Plan, Stream};
use crate::mysql::{MyCtx, Scratch};

/// The bench's own tables beside the inbox: the effect every handler writes, and the naive
/// consumer's inbox keyed by message id (a redelivery is absorbed by the key).
const TABLES: &str = "
CREATE TABLE {schema}.bench_effects (message_id CHAR(36) NOT NULL, `key` VARCHAR(255) NOT NULL)
    ENGINE = InnoDB;
CREATE TABLE {schema}.naive_inbox (id CHAR(36) NOT NULL PRIMARY KEY,
                                   `key` VARCHAR(255) NOT NULL,
                                   received_at DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)))
    ENGINE = InnoDB";
const NAIVE_INGEST: &str = "INSERT IGNORE INTO {schema}.naive_inbox (id, `key`) VALUES (?, ?)";
const NAIVE_CLAIM: &str =
    "INSERT IGNORE INTO {schema}.processed_messages (consumer, message_id) VALUES ('naive', ?)";
const EFFECT: &str = "INSERT INTO {schema}.bench_effects (message_id, `key`) VALUES (?, ?)";
const EFFECTS: &str = "SELECT COUNT(*) FROM {schema}.bench_effects";

/// Measures `plan` in a scratch database (and its inbox queue's), dropped after it.
pub(super) async fn run(ctx: &MyCtx, plan: &Plan) -> anyhow::Result<Figures> {
    let s = Scratch::new(&ctx.pool, &ctx.js, &ctx.options, "inbox").await?;
    let stream = Stream {
        js: &s.js,
        name: &s.stream,
        subject_prefix: &s.subject_prefix,
    };
    let bench = MyInboxBench {
        url: &ctx.options.database_url,
        pool: &s.pool,
        schema: s.schema.as_str(),
    };
    let result = match bench.prepare().await {
        Ok(()) => measure(&bench, &stream, plan).await,
        Err(e) => Err(e),
    };
    // The inbox's processing queue lives in a database of its own beside the scratch one.
    let _ = sqlx::raw_sql(&s.schema.render("DROP DATABASE IF EXISTS {schema}_inbox"))
        .execute(&s.pool)
        .await;
    s.drop().await;
    result
}

/// Inbox mode's database half on MySQL.
struct MyInboxBench<'a> {
    url: &'a str,
    pool: &'a MySqlPool,
    schema: &'a str,
}

impl MyInboxBench<'_> {
    fn sql(&self, text: &str) -> String {
        text.replace("{schema}", self.schema)
    }

    /// The inbox (its queue in `<schema>_inbox`) and the bench's tables.
    async fn prepare(&self) -> anyhow::Result<()> {
        outbox_inbox::migrate_mysql(self.pool, &InboxSchema::new(self.schema)?)
            .await
            .context("migrating the inbox")?;
        sqlx::raw_sql(&self.sql(TABLES))
            .execute(self.pool)
            .await
            .context("creating the bench tables")?;
        Ok(())
    }
}

impl InboxBench for MyInboxBench<'_> {
    fn database_url(&self) -> &str {
        self.url
    }

    fn schema(&self) -> &str {
        self.schema
    }

    async fn naive_ingest(&self, id: Uuid, key: &str) -> anyhow::Result<()> {
        let mut tx = self.pool.begin().await?;
        sqlx::query(&self.sql(NAIVE_INGEST))
            .bind(id.to_string())
            .bind(key)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn naive_handle(&self, id: Uuid, key: &str) -> anyhow::Result<()> {
        let mut tx = self.pool.begin().await?;
        let claimed = sqlx::query(&self.sql(NAIVE_CLAIM))
            .bind(id.to_string())
            .execute(&mut *tx)
            .await?
            .rows_affected()
            == 1;
        if claimed {
            sqlx::query(&self.sql(EFFECT))
                .bind(id.to_string())
                .bind(key)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn processor(&self, config: ProcessorConfig) -> anyhow::Result<InboxProcessor> {
        let insert = self.sql(EFFECT);
        let handlers = Handlers::new().on_fn("created", move |tx, m| {
            let insert = insert.clone();
            Box::pin(async move {
                sqlx::query(&insert)
                    .bind(m.id.to_string())
                    .bind(&m.key)
                    .execute(&mut **tx)
                    .await?;
                Ok(())
            })
        });
        let pool = <sqlx::MySql as outbox_db::SqlxBackend>::connect_pool(self.url, 24).await?;
        let schema = InboxSchema::new(self.schema)?;
        Ok(InboxProcessor::mysql(pool, schema, handlers, config)?)
    }

    async fn effects(&self) -> anyhow::Result<i64> {
        Ok(sqlx::query_scalar(&self.sql(EFFECTS))
            .fetch_one(self.pool)
            .await?)
    }
}
