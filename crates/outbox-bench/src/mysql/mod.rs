//! `outbox bench` on MySQL/MariaDB (`--database-url mysql://…` or `mariadb://…`): backlog mode
//! (the relay's drain beside a naive `SKIP LOCKED` relay), writers mode (what the outbox row
//! costs a business transaction, beside a naive table), steady mode (commit→ack at a paced rate)
//! idle-tx mode (the same with a REPEATABLE READ snapshot held open) and inbox mode (ingest and
//! handlers beside naive consumers), each measured as on PostgreSQL, with the CPU figures read
//! from the `mariadbd` process where the mode reports them. Each mode is the generic one
//! (`crate::backlog`, `crate::writers`, `crate::steady`, `crate::idle_tx`, `crate::inbox`) on
//! [`crate::bed::Bed::Mysql`]; this module gives them their scratch database, relay and writer
//! target.
//!
//! Each run works in a scratch database and stream of its own and drops them. The other modes
//! measure PostgreSQL only and say so.

use std::sync::Arc;

use anyhow::Context as _;
use async_nats::jetstream;
use outbox_core::{DestinationTemplate, Store};
use outbox_db::tools::mysql::MysqlStore;
use outbox_db::tools::MysqlSchema as Schema;
use outbox_db::SqlxBackend as _;
use outbox_relay::{Relay, RelayMetrics};
use sqlx::MySqlPool;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::{Mode, Options, Report};

/// The MySQL writer as a producer's [`Target`](crate::load::Target).
#[derive(Clone)]
pub(crate) struct MysqlTarget {
    pool: MySqlPool,
    schema: Schema,
}

impl MysqlTarget {
    pub(crate) fn new(pool: &MySqlPool, schema: &Schema) -> Self {
        Self {
            pool: pool.clone(),
            schema: schema.clone(),
        }
    }
}

impl crate::load::Target for MysqlTarget {
    fn commit(
        &self,
        msgs: Vec<outbox_core::NewMessage>,
        latency: Arc<crate::latency::Latency>,
    ) -> impl std::future::Future<Output = anyhow::Result<()>> + Send {
        let t = self.clone();
        async move {
            let mut tx = t.pool.begin().await?;
            match msgs.as_slice() {
                [one] => {
                    outbox_db::tools::mysql::enqueue(&mut tx, &t.schema, one).await?;
                }
                many => outbox_db::tools::mysql::enqueue_many(&mut tx, &t.schema, many).await?,
            }
            let sent = latency.stamp();
            tx.commit().await?;
            latency.committed(msgs.iter().map(|m| m.id), sent);
            Ok(())
        }
    }
}

/// Process names of the database server, for the CPU figures.
pub(crate) const SERVER: &[&str] = &["mariadbd", "mysqld"];

// Raw baseline, excepted by issue 47: the seed articles' table, not the outbox's.
/// The seed articles' table on MySQL: a UUID key and a status column with its index, which the
/// naive relay claims `FOR UPDATE SKIP LOCKED` and marks one `UPDATE` per row.
pub(crate) const NAIVE_TABLE: &str = "CREATE DATABASE IF NOT EXISTS {schema};
CREATE TABLE {schema}.outbox_naive (
    id             CHAR(36)     NOT NULL DEFAULT (UUID()) PRIMARY KEY,
    aggregate_type VARCHAR(255) NOT NULL,
    aggregate_id   VARCHAR(255) NOT NULL,
    event_type     VARCHAR(255) NOT NULL,
    payload        JSON         NOT NULL,
    status         VARCHAR(16)  NOT NULL DEFAULT 'PENDING',
    created_at     DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    KEY outbox_naive_status (status, created_at)
) ENGINE = InnoDB";

/// InnoDB's undo history not yet purged, server-wide (`None` where the metric is not exposed).
pub(crate) const HISTORY_LENGTH: &str =
    "SELECT `COUNT` FROM information_schema.INNODB_METRICS WHERE NAME = 'trx_rseg_history_len'";

/// What a table occupies, and the server's purge backlog, at one instant.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub(crate) struct Footprint {
    pub(crate) data_bytes: u64,
    pub(crate) index_bytes: u64,
    pub(crate) history_length: Option<i64>,
}

impl Footprint {
    pub(crate) fn total_mib(&self) -> f64 {
        (self.data_bytes + self.index_bytes) as f64 / 1048576.0
    }
}

/// Whether `url` names MySQL/MariaDB.
pub fn is_mysql(url: &str) -> bool {
    matches!(
        outbox_core::redact::url(url)
            .split_once("://")
            .map(|(s, _)| s.to_ascii_lowercase()),
        Some(s) if s == "mysql" || s == "mariadb"
    )
}

/// What every MySQL mode shares: the options, a pool of relay-style sessions for setup, NATS.
pub(crate) struct MyCtx {
    pub(crate) options: Options,
    pub(crate) pool: MySqlPool,
    pub(crate) js: jetstream::Context,
}

/// Runs the mode `options` names on MySQL/MariaDB.
pub async fn run(options: Options) -> anyhow::Result<Report> {
    if options.sink_url.is_some() {
        anyhow::bail!("bench on MySQL/MariaDB publishes to NATS only; drop --sink");
    }
    if !matches!(
        options.mode,
        Mode::Backlog | Mode::Writers | Mode::Steady | Mode::IdleTx | Mode::Inbox
    ) {
        anyhow::bail!(
            "bench on MySQL/MariaDB has the backlog, writers, steady, idle-tx and inbox modes; \
             --mode {:?} runs on PostgreSQL only so far",
            options.mode
        );
    }
    let connections = (options.producers.max(4) + options.clients + options.workers * 2 + 4) as u32;
    let pool = sqlx::MySql::connect_pool(&options.database_url, connections).await?;
    let client = outbox_sinks::nats::NatsConfig::from_url(&options.nats_url)?
        .connect_client()
        .await
        .context("connecting to NATS for the bench stream")?;
    let ctx = MyCtx {
        options,
        pool,
        js: jetstream::new(client),
    };
    let report = match ctx.options.mode {
        Mode::Writers => crate::writers::run(crate::bed::Bed::Mysql(&ctx)).await,
        Mode::Steady => crate::steady::run(crate::bed::Bed::Mysql(&ctx)).await,
        Mode::IdleTx => crate::idle_tx::run(crate::bed::Bed::Mysql(&ctx)).await,
        Mode::Inbox => crate::inbox::run(crate::bed::Bed::Mysql(&ctx)).await,
        _ => crate::backlog::run(crate::bed::Bed::Mysql(&ctx)).await,
    };
    ctx.pool.close().await;
    report
}

/// A scratch database and stream.
pub(crate) struct Scratch {
    pub(crate) pool: MySqlPool,
    pub(crate) schema: Schema,
    pub(crate) js: jetstream::Context,
    pub(crate) stream: String,
    pub(crate) subject_prefix: String,
}

impl Scratch {
    pub(crate) async fn new(
        pool: &MySqlPool,
        js: &jetstream::Context,
        opts: &Options,
        tag: &str,
    ) -> anyhow::Result<Self> {
        let suffix = format!("{:012x}", fastrand::u64(..) & 0xffff_ffff_ffff);
        let schema = Schema::new(&format!("outbox_bench_{tag}_{suffix}"))?;
        let stream = format!("OUTBOX_BENCH_MY{}_{suffix}", tag.to_uppercase());
        let subject_prefix = format!("outbox_bench_my{tag}_{suffix}");
        outbox_sinks::nats::create_stream(
            js,
            &stream,
            vec![format!("{subject_prefix}.>")],
            opts.storage.durable(),
        )
        .await?;
        Ok(Self {
            pool: pool.clone(),
            schema,
            js: js.clone(),
            stream,
            subject_prefix,
        })
    }

    /// Migrates the scratch outbox, on the binlog route when the bench runs it.
    pub(crate) async fn migrate(&self, options: &Options) -> anyhow::Result<()> {
        let db = sqlx::MySql::database(self.pool.clone(), self.schema.as_str())?;
        db.migrate().await?;
        if options.binlog {
            db.enable_binlog_route().await?;
        }
        Ok(())
    }

    pub(crate) async fn stream_messages(&self) -> anyhow::Result<u64> {
        Ok(self
            .js
            .get_stream(&self.stream)
            .await?
            .info()
            .await?
            .state
            .messages)
    }

    pub(crate) async fn analyze(&self, table: &str) -> anyhow::Result<()> {
        sqlx::raw_sql(
            &self
                .schema
                .render(&format!("ANALYZE TABLE {{schema}}.{table}")),
        )
        .execute(&self.pool)
        .await
        .context("ANALYZE TABLE")?;
        Ok(())
    }

    /// What `table` occupies after `ANALYZE TABLE` (MySQL 8 caches these figures otherwise), and
    /// InnoDB's undo history not yet purged, server-wide.
    pub(crate) async fn footprint(&self, table: &str) -> anyhow::Result<Footprint> {
        self.analyze(table).await?;
        let (data_bytes, index_bytes): (u64, u64) = sqlx::query_as(
            "SELECT CAST(DATA_LENGTH AS UNSIGNED), CAST(INDEX_LENGTH AS UNSIGNED) \
             FROM information_schema.TABLES WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ?",
        )
        .bind(self.schema.as_str())
        .bind(table)
        .fetch_one(&self.pool)
        .await
        .context("reading the table's size")?;
        let history_length = sqlx::query_scalar::<_, i64>(HISTORY_LENGTH)
            .fetch_optional(&self.pool)
            .await
            .ok()
            .flatten();
        Ok(Footprint {
            data_bytes,
            index_bytes,
            history_length,
        })
    }

    /// Drops the database and the stream (best effort: a leftover is named, never a figure).
    pub(crate) async fn drop(self) {
        if let Err(error) = sqlx::raw_sql(&self.schema.render("DROP DATABASE IF EXISTS {schema}"))
            .execute(&self.pool)
            .await
        {
            tracing::warn!(database = self.schema.as_str(), %error, "could not drop the scratch database");
        }
        if let Err(error) = self.js.delete_stream(&self.stream).await {
            tracing::warn!(stream = %self.stream, %error, "could not delete the bench stream");
        }
    }
}

/// The relay under test on the MySQL store, publishing the scratch outbox into its stream. It
/// logs in as an account made for it holding exactly the relay's documented grants
/// (docs/engine-mysql.md, "Least privileges"; the binlog route's too when the bench runs it),
/// as production runs it, not as the bench's URL's user; the account goes when it stops.
pub(crate) struct RelayOnMysql {
    pub(crate) metrics: Arc<RelayMetrics>,
    stop: CancellationToken,
    handle: JoinHandle<()>,
    /// The scratch database on the administrator's pool and the relay's account, dropped at
    /// [`RelayOnMysql::stop`].
    account: (outbox_db::Database, String),
}

impl RelayOnMysql {
    pub(crate) async fn start(options: &Options, scratch: &Scratch) -> anyhow::Result<Self> {
        let sink = outbox_sinks::connect(&options.nats_url).await?;
        let destination =
            DestinationTemplate::parse(&format!("{}.{{event_type}}", scratch.subject_prefix))?;
        let name = format!("outbox_bench_relay_{:08x}", fastrand::u32(..));
        let password = format!("{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..));
        let admin = sqlx::MySql::database(scratch.pool.clone(), scratch.schema.as_str())?;
        let (mariadb, _) = admin.mysql_server().await?;
        let documented = &outbox_db::MYSQL_GRANTS;
        let mut grants = documented.relay.to_vec();
        if options.binlog {
            grants.extend(documented.relay_binlog);
        }
        admin
            .create_account(&name, &password, &grants, mariadb)
            .await?;
        let url = outbox_db::tools::mysql_grants::login_url(
            &options.database_url,
            &name,
            &password,
            scratch.schema.as_str(),
        )?;
        let pool = sqlx::MySql::connect_pool(&url, options.workers as u32 * 2 + 2).await?;
        let store: Arc<dyn Store> = Arc::new(if options.binlog {
            MysqlStore::binlog(pool, scratch.schema.clone(), &url)?
        } else {
            MysqlStore::new(pool, scratch.schema.clone())
        });
        let relay = Relay::new(store, sink, crate::relay::config_of(options, destination));
        let metrics = relay.metrics();
        let stop = CancellationToken::new();
        let handle = tokio::spawn(relay.run(stop.clone()));
        Ok(Self {
            metrics,
            stop,
            handle,
            account: (admin, name),
        })
    }

    /// Claim count and time so far.
    pub(crate) fn claims(&self) -> crate::relay::ClaimCounter {
        crate::relay::ClaimCounter::of(&self.metrics)
    }

    pub(crate) async fn stop(self) {
        self.stop.cancel();
        let _ = self.handle.await;
        let (admin, name) = &self.account;
        if let Err(error) = admin.drop_account(name).await {
            tracing::warn!(account = %name, %error, "could not drop the bench relay's account");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mysql_and_mariadb_urls_are_told_from_others() {
        assert!(is_mysql("mysql://root@127.0.0.1:3306/test"));
        assert!(is_mysql("MariaDB://db/x"));
        assert!(!is_mysql("postgres://root@127.0.0.1/test"));
        assert!(!is_mysql("sqlite://x.db"));
    }
}
