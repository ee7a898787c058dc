//! The database a merged bench runs on (issue 47: one bench per mode, parameterised by the
//! database): its scratch outbox and stream, the relay under test on it and the producers'
//! writer target, each step the PostgreSQL or the MySQL/MariaDB way of doing it.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;
use outbox_core::NewMessage;

use crate::cpu::CpuMeter;
use crate::latency::Latency;
use crate::load::{PgTarget, Target};
use crate::mysql::{self, MyCtx, MysqlTarget, RelayOnMysql};
use crate::relay::RelayUnderTest;
use crate::scratch::Scratch;
use crate::{Ctx, Options};

/// Time the MySQL relay gets to take its partitions before a timed load starts (the
/// PostgreSQL relay's [`RelayUnderTest::settle`] waits as long).
const SETTLE: Duration = Duration::from_secs(3);

/// One run's context on either database.
#[derive(Clone, Copy)]
pub(crate) enum Bed<'a> {
    Postgres(&'a Ctx),
    Mysql(&'a MyCtx),
}

/// A scratch outbox (a schema, or a database on MySQL), migrated, and its stream.
pub(crate) enum BedScratch {
    Postgres(Scratch),
    Mysql(mysql::Scratch),
}

/// The relay under test on a [`BedScratch`].
pub(crate) enum BedRelay {
    Postgres(RelayUnderTest),
    Mysql(RelayOnMysql),
}

/// Producers' commits through the database's writer API.
#[derive(Clone)]
pub(crate) enum BedTarget {
    Postgres(PgTarget),
    Mysql(MysqlTarget),
}

impl<'a> Bed<'a> {
    /// The run's settings.
    pub fn options(self) -> &'a Options {
        match self {
            Bed::Postgres(ctx) => &ctx.options,
            Bed::Mysql(ctx) => &ctx.options,
        }
    }

    /// A meter of the CPU each message costs the relay, the database server and the broker,
    /// where the mode reports it on this database (MySQL/MariaDB: the `mariadbd` process).
    pub fn cpu_meter(self) -> Option<CpuMeter> {
        match self {
            Bed::Postgres(_) => None,
            Bed::Mysql(_) => Some(CpuMeter::start_with(mysql::SERVER)),
        }
    }

    /// A scratch outbox `tag` and its stream, migrated (on MySQL on the binlog route when the
    /// bench runs it).
    pub async fn scratch(self, tag: &str) -> anyhow::Result<BedScratch> {
        match self {
            Bed::Postgres(ctx) => Ok(BedScratch::Postgres(
                Scratch::with_outbox(&ctx.pool, &ctx.js, ctx.options.storage, tag).await?,
            )),
            Bed::Mysql(ctx) => {
                let scratch = mysql::Scratch::new(&ctx.pool, &ctx.js, &ctx.options, tag).await?;
                if let Err(e) = scratch.migrate(&ctx.options).await {
                    scratch.drop().await;
                    return Err(e);
                }
                Ok(BedScratch::Mysql(scratch))
            }
        }
    }

    /// Starts the relay under test on `scratch`, publishing to its stream.
    pub async fn start_relay(self, scratch: &BedScratch) -> anyhow::Result<BedRelay> {
        match (self, scratch) {
            (Bed::Postgres(ctx), BedScratch::Postgres(s)) => {
                Ok(BedRelay::Postgres(RelayUnderTest::start(ctx, s).await?))
            }
            (Bed::Mysql(ctx), BedScratch::Mysql(s)) => {
                Ok(BedRelay::Mysql(RelayOnMysql::start(&ctx.options, s).await?))
            }
            _ => anyhow::bail!("bench: a scratch outbox of one database given to the other"),
        }
    }
}

impl BedScratch {
    /// JetStream, where the stream lives.
    pub fn js(&self) -> &jetstream::Context {
        match self {
            BedScratch::Postgres(s) => &s.js,
            BedScratch::Mysql(s) => &s.js,
        }
    }

    /// The stream the relay publishes to.
    pub fn stream(&self) -> &str {
        match self {
            BedScratch::Postgres(s) => &s.stream,
            BedScratch::Mysql(s) => &s.stream,
        }
    }

    /// Producers writing into this outbox.
    pub fn target(&self) -> BedTarget {
        match self {
            BedScratch::Postgres(s) => BedTarget::Postgres(PgTarget::new(&s.pool, &s.schema)),
            BedScratch::Mysql(s) => BedTarget::Mysql(MysqlTarget::new(&s.pool, &s.schema)),
        }
    }

    /// Drops the outbox and the stream (best effort).
    pub async fn drop(self) {
        match self {
            BedScratch::Postgres(s) => s.drop().await,
            BedScratch::Mysql(s) => s.drop().await,
        }
    }
}

impl BedRelay {
    /// Waits until the relay has taken its partitions, before a timed load.
    pub async fn settle(&self) {
        match self {
            BedRelay::Postgres(r) => r.settle().await,
            BedRelay::Mysql(_) => tokio::time::sleep(SETTLE).await,
        }
    }

    /// Claim count and time so far.
    pub fn claims(&self) -> crate::relay::ClaimCounter {
        match self {
            BedRelay::Postgres(r) => r.claims(),
            BedRelay::Mysql(r) => r.claims(),
        }
    }

    /// Stops the relay (and, on MySQL, drops its account).
    pub async fn stop(self) {
        match self {
            BedRelay::Postgres(r) => r.stop().await,
            BedRelay::Mysql(r) => r.stop().await,
        }
    }
}

impl Target for BedTarget {
    async fn commit(&self, msgs: Vec<NewMessage>, latency: Arc<Latency>) -> anyhow::Result<()> {
        match self {
            BedTarget::Postgres(t) => t.commit(msgs, latency).await,
            BedTarget::Mysql(t) => t.commit(msgs, latency).await,
        }
    }
}
