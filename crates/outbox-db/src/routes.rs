//! The routes a database offers beside the polling engine, behind [`Database`]: PostgreSQL's
//! CDC (its setup and its store) and the Debezium copy trigger, so that commands never name a
//! backend crate. MySQL's binlog route is [`Database::enable_binlog_route`].

use std::sync::Arc;
use std::time::Duration;

use outbox_core::{Error, Result, Store};

use crate::Database;

/// The names of a CDC relay group's objects: its publication and its slot.
pub use outbox_postgres::cdc::CdcNames;
/// What `outbox migrate --cdc` made or found, and what the server's settings mean for it.
pub use outbox_postgres::cdc::CdcSetup;
/// How long a CDC relay holds a message whose route is down before it parks it.
pub use outbox_postgres::cdc::DEFAULT_PARK_AFTER;

/// How a CDC relay reads its slot (`outbox relay --mode cdc`'s options).
#[derive(Debug, Clone, Copy)]
pub struct CdcOptions {
    /// How often the relay writes a heartbeat into the WAL (`None`: never).
    pub heartbeat: Option<Duration>,
    /// Past this much WAL held for the slot, the relay drops it and recovers (`None`: no limit).
    pub max_retained: Option<u64>,
    /// How long a message of a route that is down is held before it is parked.
    pub park_after: Duration,
}

impl Default for CdcOptions {
    fn default() -> Self {
        Self {
            heartbeat: None,
            max_retained: None,
            park_after: DEFAULT_PARK_AFTER,
        }
    }
}

/// What `--adopt-debezium` installed on a Debezium outbox table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdoptedTable {
    /// Whether `tracingspancontext` is copied into the trace headers.
    pub tracing: bool,
    /// Additional columns copied as headers.
    pub additional: Vec<String>,
}

impl Database {
    /// Creates the CDC relay group `group`'s publication, slot and `outbox_emit` when missing
    /// (PostgreSQL with `wal_level=logical` only); idempotent.
    pub async fn migrate_cdc(&self, group: &str) -> Result<(CdcNames, CdcSetup)> {
        let pg = self.cdc_postgres("--cdc")?;
        let names = CdcNames::new(pg.schema(), group)?;
        let setup = outbox_postgres::cdc::setup::migrate_cdc(pg.pool(), &names).await?;
        Ok((names, setup))
    }

    /// The store of a CDC relay of group `group`: it reads the group's slot over a replication
    /// connection to `url` (the URL this database was opened with).
    pub async fn cdc_store(
        &self,
        url: &str,
        group: &str,
        options: CdcOptions,
    ) -> Result<(Arc<dyn Store>, CdcNames)> {
        let pg = self.cdc_postgres("--mode cdc")?;
        let names = CdcNames::new(pg.schema(), group)?;
        let store = outbox_postgres::cdc::CdcStore::new(pg.pool().clone(), url, names.clone())
            .await?
            .with_heartbeat(options.heartbeat)
            .with_max_retained(options.max_retained)
            .with_park_after(options.park_after);
        Ok((Arc::new(store), names))
    }

    /// Installs the copy trigger on the Debezium outbox table `table` (PostgreSQL or
    /// MySQL/MariaDB): Debezium's writers keep writing it, and each row reaches the outbox.
    pub async fn adopt_debezium(&self, table: &str) -> Result<AdoptedTable> {
        match self {
            Self::Postgres(s) => {
                let t = outbox_postgres::debezium::TableName::parse(table)?;
                let a = outbox_postgres::debezium::adopt(s.pool(), s.schema(), &t).await?;
                Ok(AdoptedTable {
                    tracing: a.tracing,
                    additional: a.additional,
                })
            }
            Self::Mysql(s) => {
                let a = outbox_mysql::debezium::adopt(s.pool(), s.schema(), table).await?;
                Ok(AdoptedTable {
                    tracing: a.tracing,
                    additional: a.additional,
                })
            }
            Self::Sqlite(_) => Err(self.no_debezium()),
        }
    }

    /// Removes the copy trigger `adopt_debezium` installed on `table`.
    pub async fn release_debezium(&self, table: &str) -> Result<()> {
        match self {
            Self::Postgres(s) => {
                let t = outbox_postgres::debezium::TableName::parse(table)?;
                outbox_postgres::debezium::release(s.pool(), s.schema(), &t).await
            }
            Self::Mysql(s) => outbox_mysql::debezium::release(s.pool(), s.schema(), table).await,
            Self::Sqlite(_) => Err(self.no_debezium()),
        }
    }

    fn no_debezium(&self) -> Error {
        Error::config(format!(
            "--adopt-debezium installs a trigger on PostgreSQL or MySQL/MariaDB; {} is neither",
            self.place()
        ))
    }

    /// The PostgreSQL store, or the error that `flag` needs PostgreSQL's write-ahead log.
    fn cdc_postgres(&self, flag: &str) -> Result<&outbox_postgres::PgStore> {
        match self {
            Self::Postgres(pg) => Ok(pg),
            Self::Sqlite(_) | Self::Mysql(_) => Err(Error::config(format!(
                "{flag} reads PostgreSQL's write-ahead log; {} is {}: use the polling relay (no \
                 --mode){}",
                self.place(),
                self.backend().name(),
                if matches!(self, Self::Mysql(_)) {
                    ", or MySQL's binlog route (outbox migrate --binlog)"
                } else {
                    ""
                }
            ))),
        }
    }
}

/// Checks the schema name the configuration gives for the database `url` names: a plain
/// lower-case identifier within the server's limit (63 bytes on PostgreSQL, 64 characters for a
/// MySQL database; SQLite, which ignores it, gets PostgreSQL's rule). The one check every
/// command runs before it connects.
pub fn check_schema_name(url: &str, schema: &str) -> Result<()> {
    match crate::Backend::of(url) {
        Ok(crate::Backend::Mysql) => outbox_mysql::Schema::new(schema).map(drop),
        // An unknown scheme is reported by `open`, with the accepted ones.
        _ => outbox_postgres::Schema::new(schema).map(drop),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_schema_name_is_checked_against_its_own_servers_limit() {
        let long = "a".repeat(64);
        assert!(check_schema_name("mysql://root@127.0.0.1/test", &long).is_ok());
        assert!(check_schema_name("mysql://root@127.0.0.1/test", &"a".repeat(65)).is_err());
        assert!(check_schema_name("postgres://root@127.0.0.1/test", &long).is_err());
        assert!(check_schema_name("postgres://root@127.0.0.1/test", &long[..63]).is_ok());
        for bad in ["Public", "a;drop", "1a", ""] {
            assert!(check_schema_name("postgres://h/d", bad).is_err(), "{bad}");
            assert!(check_schema_name("mysql://h/d", bad).is_err(), "{bad}");
        }
    }
}
