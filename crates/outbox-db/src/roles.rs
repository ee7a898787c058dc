//! Least-privilege roles through one door: the part's grants (docs/roles.md) on whichever
//! backend the database is, throw-away logins (PostgreSQL) and accounts (MySQL/MariaDB) for
//! checks that run each part as production does (`outbox verify`, `outbox bench`;
//! [`crate::url::url_as`] logs in as one).

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

/// The least privileges of each part on MySQL/MariaDB, word for word as docs/engine-mysql.md's
/// table "Least privileges" lists them: what [`Database::create_account`] and
/// [`Database::grant_account`] give.
pub use outbox_mysql::grants::{Documented as MysqlGrants, DOCUMENTED as MYSQL_GRANTS};

/// MySQL/MariaDB throw-away accounts (`'name'@'%'`) holding the documented least privileges
/// ([`MYSQL_GRANTS`]) on this database, for checks that run each part as production does
/// (`outbox verify`, `outbox bench`); run by an administrator. Other backends: a configuration
/// error.
impl Database {
    /// What the server is: whether it is MariaDB, and whether `CREATE TRIGGER` needs `SUPER`
    /// there (a binlog written, function creators not trusted). The `mariadb` the account
    /// methods take.
    pub async fn mysql_server(&self) -> Result<(bool, bool)> {
        outbox_mysql::grants::server(self.mysql_pool("reading the server's kind")?).await
    }

    /// Creates the account `name` with `password` (letters and digits: make it random),
    /// holding `grants` ([`MYSQL_GRANTS`]' entries) on this database.
    pub async fn create_account(
        &self,
        name: &str,
        password: &str,
        grants: &[&str],
        mariadb: bool,
    ) -> Result<()> {
        let pool = self.mysql_pool("making an account")?;
        outbox_mysql::grants::create_account(pool, name, password, self.schema(), grants, mariadb)
            .await
    }

    /// Gives the account `name` `grants` on this database (the writer's, once the tables
    /// they name exist).
    pub async fn grant_account(&self, name: &str, grants: &[&str], mariadb: bool) -> Result<()> {
        let pool = self.mysql_pool("granting an account")?;
        let user = outbox_mysql::grants::account(name)?;
        for sql in outbox_mysql::grants::render(grants, self.schema(), &user, mariadb) {
            sqlx::raw_sql(&sql)
                .execute(pool)
                .await
                .map_err(|e| outbox_mysql::map_sqlx_error(&format!("`{sql}`"), e))?;
        }
        Ok(())
    }

    /// Drops the account `name` if it exists.
    pub async fn drop_account(&self, name: &str) -> Result<()> {
        outbox_mysql::grants::drop_account(self.mysql_pool("dropping an account")?, name).await
    }

    fn mysql_pool(&self, what: &str) -> Result<&sqlx::MySqlPool> {
        match self {
            Self::Mysql(s) => Ok(s.pool()),
            _ => Err(Error::config(format!(
                "{what}: MySQL/MariaDB accounts on {}, a {} database",
                self.place(),
                self.backend().name()
            ))),
        }
    }
}

fn no_roles() -> Error {
    Error::config("SQLite has no roles: the file's permissions are its only access control")
}
