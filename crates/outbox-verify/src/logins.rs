//! The least-privilege logins of one `outbox verify` run: a writer, a relay and an operator, each
//! holding only its part's grants (docs/roles.md on PostgreSQL; on MySQL/MariaDB the table
//! "Least privileges" of docs/engine-mysql.md, [`MYSQL_GRANTS`]), made for the run and dropped after
//! it, so the guarantees are checked as production runs them, not as a superuser.

use anyhow::Context as _;
use outbox_core::{Grant, Part};
use outbox_db::{Database, MYSQL_GRANTS};

/// A login's name and password.
pub type Login = (String, String);

/// The run's logins (the URL's own user, an administrator, made them).
pub struct Logins {
    /// MySQL/MariaDB: the run's database (the logins' URLs name it), whether the server is
    /// MariaDB; `None` on PostgreSQL.
    mysql: Option<(String, bool)>,
    /// Owns the outbox tables and runs the migrations, as docs/roles.md has it: a role of its
    /// own that may create a schema (and, for CDC mode, replicate).
    pub owner: Login,
    /// Producers log in as this one.
    pub writer: Login,
    /// Relays.
    pub relay: Login,
    /// Status reads and operator commands.
    pub operator: Login,
}

impl Logins {
    /// Creates the three logins, named after the run's schema, and grants each its part.
    pub async fn make(db: &Database) -> anyhow::Result<Self> {
        let login = |part: &str| {
            (
                format!("{}_{part}", db.schema()),
                format!("{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..)),
            )
        };
        let logins = Self {
            mysql: None,
            owner: login("owner"),
            writer: login("writer"),
            relay: login("relay"),
            operator: login("operator"),
        };
        for (name, password) in logins.all() {
            db.create_login(name, password)
                .await
                .with_context(|| format!("creating the login `{name}`"))?;
        }
        db.let_own(&logins.owner.0)
            .await
            .context("letting the owner login create the run's schema")?;
        Ok(logins)
    }

    /// MySQL/MariaDB: creates the writer, the relay and the operator as accounts (`'name'@'%'`)
    /// and gives the relay and the operator their grants ([`MYSQL_GRANTS`]); the operator owns
    /// the outbox (it runs `outbox migrate`, which creates the database). `binlog`: the grants
    /// of the binlog route too. The writer's grant waits for the table ([`Logins::grant`]).
    pub async fn make_mysql(db: &Database, binlog: bool) -> anyhow::Result<Self> {
        let schema = db.schema().to_string();
        let login = |part: &str| {
            (
                format!("{schema}_{part}"),
                format!("{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..)),
            )
        };
        let (mariadb, needs_super) = db.mysql_server().await?;
        let operator = login("operator");
        let logins = Self {
            mysql: Some((schema.clone(), mariadb)),
            owner: operator.clone(),
            writer: login("writer"),
            relay: login("relay"),
            operator,
        };
        let g = &MYSQL_GRANTS;
        let mut relay: Vec<&str> = g.relay.to_vec();
        let mut operator: Vec<&str> = g.operator.to_vec();
        if binlog {
            relay.extend(g.relay_binlog);
            operator.extend(g.operator_binlog);
        }
        if needs_super {
            operator.extend(g.operator_binlog_on);
        }
        for ((name, password), part) in [
            (&logins.writer, &[][..]),
            (&logins.relay, &relay[..]),
            (&logins.operator, &operator[..]),
        ] {
            db.create_account(name, password, part, mariadb)
                .await
                .with_context(|| format!("making the account `{name}`"))?;
        }
        Ok(logins)
    }

    /// MySQL/MariaDB: the owner's (the operator's) URL naming no database: `outbox migrate`
    /// creates it.
    pub fn owner_url(&self, url: &str) -> anyhow::Result<String> {
        let as_owner = outbox_db::url_as(url, &self.owner.0, &self.owner.1)?;
        Ok(match &self.mysql {
            Some(_) => with_database(&as_owner, ""),
            None => as_owner,
        })
    }

    /// The outbox at `url` (the administrator's) as the owner login: what production runs as
    /// the owner (`outbox migrate`, `outbox migrate --cdc`) runs as it here, so that every
    /// object in the run's schema is the owner's and the writers' `outbox_emit` (a `SECURITY
    /// DEFINER` function) runs with the owner's rights, not an administrator's.
    pub async fn open_owner(&self, url: &str, schema: &str) -> anyhow::Result<Database> {
        outbox_db::open(&self.owner_url(url)?, schema, 2)
            .await
            .context("logging in as the owner role")
    }

    /// Grants each login its part, once the owner made the tables (again after the CDC setup:
    /// the relay's REPLICATION). `db` is the administrator's: the relay's membership of the
    /// owner role takes one (on MySQL/MariaDB, the grants on the tables).
    pub async fn grant(&self, db: &Database) -> anyhow::Result<()> {
        if let Some((_, mariadb)) = &self.mysql {
            db.grant_account(&self.writer.0, MYSQL_GRANTS.writer, *mariadb)
                .await
                .with_context(|| format!("granting the account `{}`", self.writer.0))?;
            return Ok(());
        }
        let grants = [
            Grant::new(Part::Writer, &self.writer.0)?,
            Grant::new(Part::Relay, &self.relay.0)?,
            Grant::new(Part::Operator, &self.operator.0)?,
        ];
        for note in db
            .grant(&grants)
            .await
            .context("granting the run's roles")?
        {
            eprintln!("verify: {note}");
        }
        Ok(())
    }

    /// `url` logging in as `login` (on MySQL/MariaDB, in the run's database: a login may not
    /// open the URL's own).
    pub fn url(&self, url: &str, login: &Login) -> anyhow::Result<String> {
        let as_login = outbox_db::url_as(url, &login.0, &login.1)?;
        Ok(match &self.mysql {
            Some((schema, _)) => with_database(&as_login, schema),
            None => as_login,
        })
    }

    /// Drops every login (after the run's schema is gone, or with what they hold in it).
    pub async fn drop_all(&self, db: &Database) {
        if self.mysql.is_some() {
            for (name, _) in [&self.writer, &self.relay, &self.operator] {
                if let Err(e) = db.drop_account(name).await {
                    eprintln!("verify: the account `{name}` was not dropped: {e}");
                }
            }
            return;
        }
        for (name, _) in self.all() {
            if let Err(e) = db.drop_login(name).await {
                eprintln!("verify: the login `{name}` was not dropped: {e}");
            }
        }
    }

    fn all(&self) -> [&Login; 4] {
        [&self.writer, &self.relay, &self.operator, &self.owner]
    }
}

/// `url` with its path (the database) replaced by `database` (none when empty), its query kept.
fn with_database(url: &str, database: &str) -> String {
    let Some((scheme, after)) = url.split_once("://") else {
        return url.to_string();
    };
    let end = after.find(['/', '?', '#']).unwrap_or(after.len());
    let (authority, rest) = after.split_at(end);
    let query = rest.find(['?', '#']).map_or("", |q| &rest[q..]);
    format!("{scheme}://{authority}/{database}{query}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_login_url_names_the_runs_database_and_keeps_the_query() {
        assert_eq!(
            with_database("mysql://u:p@127.0.0.1:3307/test?ssl-mode=disabled", "run_1"),
            "mysql://u:p@127.0.0.1:3307/run_1?ssl-mode=disabled"
        );
        assert_eq!(
            with_database("mysql://u:p@h:3306", "run_1"),
            "mysql://u:p@h:3306/run_1"
        );
        assert_eq!(
            with_database("mysql://u:p@h:3306/test", ""),
            "mysql://u:p@h:3306/"
        );
    }
}
