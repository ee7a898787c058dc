//! Least-privilege roles through one door: the part's grants (docs/roles.md) on whichever
//! backend the database is, throw-away logins for checks that run each part as production does
//! (`outbox verify`; [`crate::url::url_as`] logs in as one).

use outbox_core::{Error, Grant, Result};

use crate::database::Database;

impl Database {
    /// Gives each grant's part its least privileges (docs/roles.md) and records the grant, so
    /// that every later `migrate` applies it again. Returns what must still be done by hand (a
    /// privilege the migrating login cannot give). SQLite has no roles: a configuration error.
    pub async fn grant(&self, grants: &[Grant]) -> Result<Vec<String>> {
        match self {
            Self::Postgres(s) => outbox_postgres::grant(s.pool(), s.schema(), grants).await,
            Self::Mysql(_) => Err(Error::config(
                "--grant on MySQL/MariaDB is not built yet: grant the privileges docs/roles.md \
                 lists by hand",
            )),
            Self::Sqlite(_) => Err(no_roles()),
        }
    }

    /// Creates a login `name` with `password` (a role on PostgreSQL, an account on
    /// MySQL/MariaDB) holding nothing yet: for throw-away checks, which then [`grant`] it a
    /// part and connect as it ([`url_as`](crate::url_as)).
    ///
    /// [`grant`]: Database::grant
    pub async fn create_login(&self, name: &str, password: &str) -> Result<()> {
        match self {
            Self::Postgres(s) => outbox_postgres::create_login(s.pool(), name, password).await,
            Self::Mysql(_) => Err(Error::config(
                "throw-away logins on MySQL/MariaDB are not built yet",
            )),
            Self::Sqlite(_) => Err(no_roles()),
        }
    }

    /// Lets a login made by [`Database::create_login`] own an outbox here: create its schema
    /// (PostgreSQL; and replicate, when this login is a superuser) or its database
    /// (MySQL/MariaDB).
    pub async fn let_own(&self, name: &str) -> Result<()> {
        match self {
            Self::Postgres(s) => outbox_postgres::let_own(s.pool(), name).await,
            Self::Mysql(_) => Err(Error::config(
                "owner logins on MySQL/MariaDB are not built yet",
            )),
            Self::Sqlite(_) => Err(no_roles()),
        }
    }

    /// Drops a login made by [`Database::create_login`] and what it holds; nothing when it
    /// does not exist.
    pub async fn drop_login(&self, name: &str) -> Result<()> {
        match self {
            Self::Postgres(s) => outbox_postgres::drop_login(s.pool(), name).await,
            Self::Mysql(_) => Ok(()),
            Self::Sqlite(_) => Err(no_roles()),
        }
    }
}

fn no_roles() -> Error {
    Error::config("SQLite has no roles: the file's permissions are its only access control")
}
