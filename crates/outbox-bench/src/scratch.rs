//! A scratch schema and JetStream stream per measured run, dropped at the end, and the few
//! catalog reads the bench makes about them.

use anyhow::Context as _;
use async_nats::jetstream;
use outbox_db::Schema;
use outbox_db::SqlxBackend as _;
use sqlx::PgPool;

use crate::{sql, Storage};

/// A schema and a stream with a random suffix, so runs never share state.
pub struct Scratch {
    pub pool: PgPool,
    pub schema: Schema,
    pub js: jetstream::Context,
    pub stream: String,
    /// Subjects of the stream are `<subject_prefix>.<event_type>`.
    pub subject_prefix: String,
    /// The random suffix, reused for names that must be unique to this run.
    pub suffix: String,
}

impl Scratch {
    /// Creates an empty schema `outbox_bench_<tag>_<suffix>` and its stream.
    pub async fn new(
        pool: &PgPool,
        js: &jetstream::Context,
        storage: Storage,
        tag: &str,
    ) -> anyhow::Result<Self> {
        let suffix = format!("{:012x}", fastrand::u64(..) & 0xffff_ffff_ffff);
        let schema = Schema::new(&format!("outbox_bench_{tag}_{suffix}"))?;
        sqlx::raw_sql(&schema.render(sql::CREATE_SCHEMA))
            .execute(pool)
            .await
            .context("creating the scratch schema")?;
        let stream = format!("OUTBOX_BENCH_{}_{suffix}", tag.to_uppercase());
        let subject_prefix = format!("outbox_bench_{tag}_{suffix}");
        let created = outbox_sinks::nats::create_stream(
            js,
            &stream,
            vec![format!("{subject_prefix}.>")],
            storage.durable(),
        )
        .await;
        let scratch = Self {
            pool: pool.clone(),
            schema,
            js: js.clone(),
            stream,
            subject_prefix,
            suffix,
        };
        if let Err(e) = created {
            scratch.drop().await;
            return Err(e.into());
        }
        Ok(scratch)
    }

    /// Like [`Scratch::new`], with the outbox tables migrated in.
    pub async fn with_outbox(
        pool: &PgPool,
        js: &jetstream::Context,
        storage: Storage,
        tag: &str,
    ) -> anyhow::Result<Self> {
        let scratch = Self::new(pool, js, storage, tag).await?;
        let migrated = match sqlx::Postgres::database(pool.clone(), scratch.schema.as_str()) {
            Ok(db) => db.migrate().await,
            Err(e) => Err(e),
        };
        if let Err(e) = migrated {
            scratch.drop().await;
            return Err(e.into());
        }
        Ok(scratch)
    }

    /// Messages the stream holds (what the broker acknowledged, deduplicated by id).
    pub async fn stream_messages(&self) -> anyhow::Result<u64> {
        Ok(self
            .js
            .get_stream(&self.stream)
            .await?
            .info()
            .await?
            .state
            .messages)
    }

    /// `ANALYZE`s every table of the schema, so the planner works with statistics as it would
    /// in production rather than on a freshly filled, never analysed table.
    pub async fn analyze(&self) -> anyhow::Result<()> {
        let tables: Vec<String> = sqlx::query_scalar(sql::SCRATCH_TABLES)
            .bind(self.schema.as_str())
            .fetch_all(&self.pool)
            .await?;
        if !tables.is_empty() {
            // Names quoted by the catalog query's `format('%I.%I')`.
            sqlx::raw_sql(&sql::ANALYZE.replace("{tables}", &tables.join(", ")))
                .execute(&self.pool)
                .await
                .context("ANALYZE of the scratch tables")?;
        }
        Ok(())
    }

    /// Dead tuples (`n_dead_tup`) of `table` and, when it is partitioned, of its partitions at
    /// any depth; and of every table of the schema together. Statistics reach
    /// `pg_stat_user_tables` about a second after the backends' transactions.
    pub async fn dead_tuples(&self, table: &str) -> anyhow::Result<DeadTuples> {
        let (table_dead, schema_dead): (i64, i64) = sqlx::query_as(sql::DEAD_TUPLES)
            .bind(self.schema.as_str())
            .bind(table)
            .fetch_one(&self.pool)
            .await?;
        Ok(DeadTuples {
            table: table_dead,
            schema: schema_dead,
        })
    }

    /// Drops the schema and the stream (best effort: a failure leaves a named leftover, never
    /// a wrong figure).
    pub async fn drop(self) {
        // A load stopped mid-statement leaves that statement running on the server (sqlx does
        // not cancel it); if it then waits for a lock the drop took, one of the two is picked
        // as a deadlock victim. Either way the next try finds the statement gone.
        for attempt in 1..=5 {
            match sqlx::raw_sql(&self.schema.render(sql::DROP_SCHEMA))
                .execute(&self.pool)
                .await
            {
                Ok(_) => break,
                Err(sqlx::Error::Database(e))
                    if e.code().as_deref() == Some("40P01") && attempt < 5 =>
                {
                    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                }
                Err(error) => {
                    tracing::warn!(schema = self.schema.as_str(), %error, "could not drop the scratch schema");
                    break;
                }
            }
        }
        if let Err(error) = self.js.delete_stream(&self.stream).await {
            tracing::warn!(stream = %self.stream, %error, "could not delete the bench stream");
        }
    }
}

/// Dead tuples after a run.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct DeadTuples {
    /// Of the message table (and its partitions).
    pub table: i64,
    /// Of every table in the scratch schema (the engine's own tables included).
    pub schema: i64,
}
