//! What the outbox's own tools (`outbox verify`, `outbox bench`, `outbox demo`) need of a
//! database beyond a relay's or an application's needs: CDC clean-up and WAL salvage, a typed
//! pool on any backend, a SQLite file's removal, the MySQL/MariaDB least-privilege accounts and
//! the backend pieces the bench measures. Kept here, beside [`Database`], so that those crates
//! name no backend crate (issue 47); each item is a thin route to its backend's own code.

use std::path::Path;

use outbox_core::{Error, Result};

use crate::Database;

/// MySQL/MariaDB accounts ([`Database::create_account`]): a URL logging in as one.
pub mod mysql_grants {
    pub use outbox_mysql::grants::login_url;
}

/// A validated MySQL/MariaDB database name (the outbox's place there): what a MySQL-only tool
/// splices into SQL with `render`.
pub use outbox_mysql::Schema as MysqlSchema;

/// What `outbox bench` drives on PostgreSQL below [`Database`]: the relay's pool options (to
/// name its sessions), the writer and CDC's emit on a caller's transaction, the CDC store and
/// replication password on the bench's own pools. The bench measures these pieces themselves,
/// side by side, so it takes them as they are.
pub mod postgres {
    pub use outbox_postgres::cdc::{url_password, CdcStore};
    pub use outbox_postgres::{connect_options, Emitter, Writer};
}

/// What `outbox bench` drives on MySQL/MariaDB below [`Database`]: connect options for
/// application sessions, the writer on a caller's transaction, the store (plain or on the binlog
/// route) and the retention ranges' width.
pub mod mysql {
    pub use outbox_mysql::ranges::set_width as set_range_width;
    pub use outbox_mysql::{connect_options, enqueue, enqueue_many, MysqlStore};
}

/// Removes the SQLite database file `path` and its `-wal` and `-shm` companions, if present.
pub fn remove_sqlite_database(path: &Path) {
    outbox_sqlite::remove_database(path);
}

impl Database {
    /// Drops the CDC relay group `group`'s slot and publication (what `migrate_cdc` made),
    /// releasing the WAL the slot held. Fails while a relay still reads the slot.
    pub async fn drop_cdc(&self, group: &str) -> Result<()> {
        let pg = self
            .postgres()
            .ok_or_else(|| not_postgres(self, "dropping a CDC slot"))?;
        let names = crate::CdcNames::new(pg.schema(), group)?;
        outbox_postgres::cdc::setup::drop_cdc(pg.pool(), &names).await
    }

    /// Ends the session still reading the CDC relay group `group`'s slot, so that
    /// [`Database::drop_cdc`] can drop it: for a scratch slot whose relays are gone (a killed
    /// reader's session can outlive it for a while on a loaded server). Returns how many
    /// sessions it ended.
    pub async fn end_cdc_reader(&self, group: &str) -> Result<i64> {
        let pg = self
            .postgres()
            .ok_or_else(|| not_postgres(self, "ending a CDC slot's reader"))?;
        let names = crate::CdcNames::new(pg.schema(), group)?;
        outbox_postgres::cdc::setup::end_slot_reader(pg.pool(), &names.slot).await
    }

    /// Makes `pg_walinspect` available when this login may (a superuser), so that a lost
    /// slot's emitted messages can be read back from the WAL; returns whether it is.
    pub async fn install_wal_salvage(&self) -> Result<bool> {
        let pg = self
            .postgres()
            .ok_or_else(|| not_postgres(self, "reading the WAL"))?;
        outbox_postgres::cdc::salvage::install(pg.pool()).await
    }
}

fn not_postgres(db: &Database, what: &str) -> Error {
    Error::config(format!(
        "{what} needs PostgreSQL; {} is {}",
        db.place(),
        db.backend().name()
    ))
}
