//! Connecting: `mysql://` and `mariadb://` URLs, and the pool of relay sessions (`READ
//! COMMITTED`, short row-lock waits).

use super::*;

/// How long a relay statement waits for a row lock (`innodb_lock_wait_timeout`) before failing
/// as a timeout the relay retries: well inside the relay's store deadline.
const LOCK_WAIT_SECS: u32 = 5;

/// Connection options for a `mysql://` or `mariadb://` URL.
pub fn connect_options(url: &str) -> Result<MySqlConnectOptions> {
    let shown = outbox_core::redact::url(url);
    let rest = url
        .split_once("://")
        .filter(|(scheme, _)| {
            scheme.eq_ignore_ascii_case("mysql") || scheme.eq_ignore_ascii_case("mariadb")
        })
        .map(|(_, rest)| rest)
        .ok_or_else(|| {
            Error::config(format!(
                "database URL `{shown}` is not a MySQL URL; use mysql://user:password@host:3306/database"
            ))
        })?;
    MySqlConnectOptions::from_str(&format!("mysql://{rest}"))
        .map_err(|e| map_sqlx_error(&format!("database URL `{shown}`"), e))
}

/// The database a URL names (its path), if any.
pub fn url_database(url: &str) -> Result<Option<String>> {
    Ok(connect_options(url)?.get_database().map(str::to_string))
}

/// Opens a pool of at most `max_connections` relay sessions to `url`: `READ COMMITTED`, and
/// row-lock waits cut at a few seconds. Fails at once if the server cannot be reached.
pub async fn connect_pool(url: &str, max_connections: u32) -> Result<MySqlPool> {
    let options = connect_options(url)?;
    let shown = outbox_core::redact::url(url);
    MySqlPoolOptions::new()
        .max_connections(max_connections.max(1))
        .acquire_timeout(Duration::from_secs(10))
        .after_connect(|conn, _| {
            Box::pin(async move {
                conn.execute(include_str!("../../queries/read_committed.sql"))
                    .await?;
                conn.execute(
                    include_str!("../../queries/lock_wait.sql")
                        .replace("{secs}", &LOCK_WAIT_SECS.to_string())
                        .as_str(),
                )
                .await?;
                Ok(())
            })
        })
        .connect_with(options)
        .await
        .map_err(|e| map_sqlx_error(&format!("connecting to MySQL at {shown}"), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_mysql_and_mariadb_urls_are_taken_and_the_password_is_not_shown() {
        assert!(connect_options("mariadb://root@127.0.0.1:3306/test").is_ok());
        assert!(connect_options("MySQL://root@127.0.0.1/test").is_ok());
        let e = connect_options("postgres://u:hunter2@db/x").unwrap_err();
        assert!(!e.to_string().contains("hunter2"), "{e}");
        assert_eq!(
            url_database("mysql://root@127.0.0.1/shop").ok().flatten(),
            Some("shop".into())
        );
    }
}
