//! The least-privilege logins of one `outbox verify` run: a writer, a relay and an operator, each
//! holding only its part's grants (docs/roles.md), made for the run and dropped after it, so the
//! guarantees are checked as production runs them, not as a superuser.

use anyhow::Context as _;
use outbox_core::{Grant, Part};
use outbox_db::Database;

/// A login's name and password.
pub type Login = (String, String);

/// The run's logins (the URL's own user, an administrator, made them).
pub struct Logins {
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

    /// Grants each login its part, once the owner made the tables (again after the CDC setup:
    /// the relay's REPLICATION). `db` is the administrator's: the relay's membership of the
    /// owner role takes one.
    pub async fn grant(&self, db: &Database) -> anyhow::Result<()> {
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

    /// `url` logging in as `login`.
    pub fn url(&self, url: &str, login: &Login) -> anyhow::Result<String> {
        Ok(outbox_db::url_as(url, &login.0, &login.1)?)
    }

    /// Drops every login (after the run's schema is gone, or with what they hold in it).
    pub async fn drop_all(&self, db: &Database) {
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
