//! The least privileges of each part on MySQL/MariaDB, as docs/engine-mysql.md's table "Least
//! privileges" lists them, for the tools that run each part as production does (`outbox
//! verify` makes accounts with them; `outbox bench`'s relay under test logs in as one), and
//! throw-away accounts holding them. `tests/grants.rs` checks the table with its own copy.

use outbox_core::{Error, Result};
use sqlx::MySqlPool;

use crate::error::map_sqlx_error;

/// The grants of each part, word for word as documented, with `{db}` the outbox's database
/// and `{user}` the account; `{monitor}` is MariaDB's `BINLOG MONITOR` (MySQL's
/// `REPLICATION CLIENT`). The writer's grants name tables, so they are given once the operator
/// made them.
pub struct Documented {
    /// The writer: the plain insert (the trigger runs with its definer's rights), and the
    /// position counters the writer API's batch over several keys locks first.
    pub writer: &'static [&'static str],
    /// The relay, either route.
    pub relay: &'static [&'static str],
    /// The relay on the binlog route, beside `relay`.
    pub relay_binlog: &'static [&'static str],
    /// The operator (`outbox migrate`, `outbox status`).
    pub operator: &'static [&'static str],
    /// The operator of `outbox migrate --binlog`, beside `operator`.
    pub operator_binlog: &'static [&'static str],
    /// The operator, where the server writes a binlog and does not trust function creators
    /// (`log_bin_trust_function_creators = 0`): `CREATE TRIGGER` needs it.
    pub operator_binlog_on: &'static [&'static str],
}

// The grant files end without a newline: each is matched, as written, against its row in
// docs/engine-mysql.md.
/// See [`Documented`].
pub const DOCUMENTED: Documented = Documented {
    writer: &[
        include_str!("../queries/grant_writer_outbox.sql"),
        include_str!("../queries/grant_writer_part_seq.sql"),
    ],
    relay: &[
        include_str!("../queries/grant_relay.sql"),
        include_str!("../queries/grant_relay_process.sql"),
    ],
    relay_binlog: &[include_str!("../queries/grant_relay_binlog.sql")],
    operator: &[include_str!("../queries/grant_operator.sql")],
    operator_binlog: &[include_str!("../queries/grant_operator_binlog.sql")],
    operator_binlog_on: &[include_str!("../queries/grant_operator_super.sql")],
};

/// `grants` for account `user` (quoted, `'name'@'%'`) on database `db`.
pub fn render(grants: &[&str], db: &str, user: &str, mariadb: bool) -> Vec<String> {
    let monitor = if mariadb {
        "BINLOG MONITOR"
    } else {
        "REPLICATION CLIENT"
    };
    grants
        .iter()
        .map(|g| {
            g.replace("{db}", db)
                .replace("{user}", user)
                .replace("{monitor}", monitor)
        })
        .collect()
}

/// What the server is: MariaDB or not, and whether `CREATE TRIGGER` needs `SUPER` there (a
/// binlog written, function creators not trusted).
pub async fn server(pool: &MySqlPool) -> Result<(bool, bool)> {
    let (version, log_bin, trusted): (String, i64, i64) =
        sqlx::query_as(include_str!("../queries/server_flavour.sql"))
            .fetch_one(pool)
            .await
            .map_err(|e| map_sqlx_error("reading the server's version and binlog settings", e))?;
    Ok((version.contains("MariaDB"), log_bin == 1 && trusted == 0))
}

/// `'name'@'%'`, for a plain name of at most 32 characters (it goes into the statement).
pub fn account(name: &str) -> Result<String> {
    if !outbox_core::identifier::is_plain(name, 32) {
        return Err(Error::config(format!(
            "account `{name}` is not a plain identifier of at most 32 characters"
        )));
    }
    Ok(format!("'{name}'@'%'"))
}

/// Creates account `name` (`'name'@'%'`) with `password` holding `grants` on database `db`;
/// for throw-away checks, run by an administrator. The password must be plain text of letters
/// and digits (it goes into the statement; make it random).
pub async fn create_account(
    pool: &MySqlPool,
    name: &str,
    password: &str,
    db: &str,
    grants: &[&str],
    mariadb: bool,
) -> Result<()> {
    let user = account(name)?;
    if password.is_empty() || !password.chars().all(|c| c.is_ascii_alphanumeric()) {
        return Err(Error::config(
            "a throw-away account's password must be letters and digits",
        ));
    }
    sqlx::raw_sql(
        &include_str!("../queries/login_create.sql")
            .replace("{user}", &user)
            .replace("{password}", password),
    )
    .execute(pool)
    .await
    .map_err(|e| map_sqlx_error(&format!("creating the account {user}"), e))?;
    for sql in render(grants, db, &user, mariadb) {
        sqlx::raw_sql(&sql)
            .execute(pool)
            .await
            .map_err(|e| map_sqlx_error(&format!("`{sql}`"), e))?;
    }
    Ok(())
}

/// Drops account `name` if it exists.
pub async fn drop_account(pool: &MySqlPool, name: &str) -> Result<()> {
    let user = account(name)?;
    sqlx::raw_sql(&include_str!("../queries/login_drop.sql").replace("{user}", &user))
        .execute(pool)
        .await
        .map_err(|e| map_sqlx_error(&format!("dropping the account {user}"), e))?;
    Ok(())
}

/// `url` logging in as `user` with `password` (plain: no encoding needed) in database `db`
/// (none when empty); its servers and query kept.
pub fn login_url(url: &str, user: &str, password: &str, db: &str) -> Result<String> {
    let (scheme, after) = url
        .split_once("://")
        .ok_or_else(|| Error::config("a database URL needs `scheme://`"))?;
    let end = after.find(['/', '?', '#']).unwrap_or(after.len());
    let (userinfo_host, rest) = after.split_at(end);
    let host = userinfo_host
        .rsplit_once('@')
        .map_or(userinfo_host, |(_, h)| h);
    let query = rest.find(['?', '#']).map_or("", |q| &rest[q..]);
    Ok(format!("{scheme}://{user}:{password}@{host}/{db}{query}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_login_url_names_the_account_and_the_database_and_keeps_the_rest() {
        assert_eq!(
            login_url(
                "mysql://root@127.0.0.1:3307/test?ssl-mode=disabled",
                "r",
                "p1",
                "run"
            )
            .unwrap(),
            "mysql://r:p1@127.0.0.1:3307/run?ssl-mode=disabled"
        );
        assert_eq!(
            login_url("mysql://a:b@h:3306", "r", "p1", "").unwrap(),
            "mysql://r:p1@h:3306/"
        );
    }

    /// Every line of [`DOCUMENTED`] is written, as `` `PRIVILEGES ON object` ``, in its part's
    /// row of docs/engine-mysql.md's table, so the code cannot grant what the docs do not say.
    #[test]
    fn every_documented_grant_is_in_its_row_of_the_docs_table() {
        let doc = include_str!("../../../docs/engine-mysql.md");
        let row = |who: &str| {
            doc.lines()
                .find(|l| l.starts_with(&format!("| {who} |")))
                .unwrap_or_else(|| panic!("no row `{who}` in the table"))
        };
        let parts = [
            ("writer", DOCUMENTED.writer),
            ("relay", DOCUMENTED.relay),
            ("relay, binlog route", DOCUMENTED.relay_binlog),
            (
                "operator (`outbox migrate`, `--binlog`)",
                DOCUMENTED.operator,
            ),
            (
                "operator (`outbox migrate`, `--binlog`)",
                DOCUMENTED.operator_binlog,
            ),
            (
                "operator (`outbox migrate`, `--binlog`)",
                DOCUMENTED.operator_binlog_on,
            ),
        ];
        for (who, grants) in parts {
            for g in render(grants, "shop", "u", true) {
                let written = g
                    .strip_prefix("GRANT ")
                    .and_then(|g| g.strip_suffix(" TO u"))
                    .unwrap();
                assert!(
                    row(who).contains(&format!("`{written}`")),
                    "`{written}` is not in the row `{who}`"
                );
            }
        }
    }

    #[test]
    fn the_grants_name_the_database_the_account_and_the_servers_monitor_privilege() {
        let g = render(DOCUMENTED.relay_binlog, "shop", "'r'@'%'", true);
        assert_eq!(
            g,
            ["GRANT REPLICATION SLAVE, BINLOG MONITOR ON *.* TO 'r'@'%'"]
        );
        let g = render(DOCUMENTED.operator_binlog, "shop", "'o'@'%'", false);
        assert_eq!(g, ["GRANT REPLICATION CLIENT ON *.* TO 'o'@'%'"]);
        assert!(account("outbox_verify_0123abcd_operator").is_ok());
        assert!(account("x'; DROP").is_err());
    }
}
