//! Several servers behind one URL: `postgres://u@h1:5440,h2:5441/db?target_session_attrs=read-write`
//! (libpq's form), a primary and its standbys. A pool opened on such a URL connects to the first
//! server that answers and, with `read-write` (or `primary`), is not in recovery; a task follows
//! the primary afterwards: once a second it asks the server in use whether it still is one, and
//! when it does not answer, or answers as a standby, it finds the new primary and points the
//! pool's new connections there. A failover costs the relay the connections to the old primary
//! (their calls fail and are retried) and about a second or two of finding the new one.

use std::time::Duration;

use outbox_core::{Error, ErrorKind, Result};
use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions as _, Connection as _, PgConnection, PgPool};

/// How often the server in use is asked whether it is still the primary.
const FOLLOW_EVERY: Duration = Duration::from_secs(1);

/// How long a server may take to answer that question (or a first connection) before it counts
/// as gone: a black-holed or frozen server does not answer at all.
const ANSWER_WITHIN: Duration = Duration::from_secs(2);

/// The servers a database URL names, and what their sessions must be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Servers {
    /// One URL per server, in the order written, each naming that server alone.
    urls: Vec<String>,
    /// Only a server that is not in recovery will do.
    read_write: bool,
}

impl Servers {
    /// The servers `url` names: `host[:port][,host[:port]…]`, and `target_session_attrs`
    /// (`any`, the default, or `read-write`/`primary`) taken out of its query.
    pub fn parse(url: &str) -> Result<Self> {
        let shown = || outbox_core::redact::url(url);
        let (scheme, after) = url
            .split_once("://")
            .ok_or_else(|| Error::config(format!("database URL `{}` has no scheme", shown())))?;
        let end = after.find(['/', '?', '#']).unwrap_or(after.len());
        let (userinfo, authority) = match after[..end].rfind('@') {
            Some(at) => (&after[..=at], &after[at + 1..end]),
            None => ("", &after[..end]),
        };
        let (path, query) = match after[end..].split_once('?') {
            Some((p, q)) => (p, Some(q)),
            None => (&after[end..], None),
        };
        let mut read_write = false;
        let mut kept = Vec::new();
        for pair in query.into_iter().flat_map(|q| q.split('&')) {
            match pair.split_once('=') {
                Some(("target_session_attrs", v)) => {
                    read_write = match v {
                        "any" => false,
                        "read-write" | "primary" => true,
                        other => {
                            return Err(Error::config(format!(
                                "database URL `{}`: the session target `{other}` is not \
                                 supported: use target_session_attrs read-write (or primary) to \
                                 follow the primary, or any",
                                shown()
                            )))
                        }
                    }
                }
                _ => kept.push(pair),
            }
        }
        let query = if kept.is_empty() {
            String::new()
        } else {
            format!("?{}", kept.join("&"))
        };
        let urls = authority
            .split(',')
            .map(|host| format!("{scheme}://{userinfo}{host}{path}{query}"))
            .collect();
        Ok(Self { urls, read_write })
    }

    /// One server and any session: nothing to choose or follow.
    pub fn is_single(&self) -> bool {
        self.urls.len() == 1 && !self.read_write
    }

    /// The URL of the first server written.
    pub fn first(&self) -> &str {
        &self.urls[0]
    }

    /// Whether only a primary will do.
    pub fn read_write(&self) -> bool {
        self.read_write
    }

    /// Every server's URL, in order.
    pub fn urls(&self) -> &[String] {
        &self.urls
    }
}

/// Whether `conn`'s server will do: it answers, and is not in recovery when `read_write`.
async fn suits(conn: &mut PgConnection, read_write: bool) -> bool {
    let answer = tokio::time::timeout(
        ANSWER_WITHIN,
        sqlx::query_scalar::<_, bool>(include_str!("../queries/in_recovery.sql"))
            .fetch_one(&mut *conn),
    )
    .await;
    matches!(answer, Ok(Ok(standby)) if !(read_write && standby))
}

/// The first of `servers` that answers within [`ANSWER_WITHIN`] and will do, with a connection
/// to it. `options` turns a server's URL into the pool's connection options.
pub(crate) async fn find(
    servers: &Servers,
    options: &(dyn Fn(&str) -> Result<PgConnectOptions> + Send + Sync),
) -> Result<(PgConnectOptions, PgConnection)> {
    let mut causes = Vec::new();
    for url in servers.urls() {
        let o = options(url)?;
        let shown = format!("{}:{}", o.get_host(), o.get_port());
        match tokio::time::timeout(ANSWER_WITHIN, o.connect()).await {
            Ok(Ok(mut conn)) => {
                if suits(&mut conn, servers.read_write).await {
                    return Ok((o, conn));
                }
                causes.push(format!("{shown} is a standby"));
                let _ = conn.close().await;
            }
            Ok(Err(e)) => causes.push(format!(
                "{shown}: {}",
                outbox_core::redact::sanitize(&e.to_string())
            )),
            Err(_) => causes.push(format!("{shown}: no answer within {ANSWER_WITHIN:?}")),
        }
    }
    Err(Error::new(
        ErrorKind::Connection,
        format!(
            "no {} among the database URL's servers ({}); will try again",
            if servers.read_write {
                "primary"
            } else {
                "server that answers"
            },
            causes.join("; ")
        ),
    ))
}

/// Follows the primary for `pool` (see the module documentation) until the pool is closed.
/// `conn` is a connection to the server the pool uses now.
pub(crate) fn follow(
    pool: PgPool,
    servers: Servers,
    mut conn: Option<PgConnection>,
    options: impl Fn(&str) -> Result<PgConnectOptions> + Send + Sync + 'static,
) {
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(FOLLOW_EVERY).await;
            if pool.is_closed() {
                return;
            }
            if let Some(c) = conn.as_mut() {
                if suits(c, servers.read_write).await {
                    continue;
                }
            }
            conn = None;
            match find(&servers, &options).await {
                Ok((o, c)) => {
                    let now = (o.get_host().to_string(), o.get_port());
                    let was = pool.connect_options();
                    if (was.get_host().to_string(), was.get_port()) != now {
                        tracing::warn!(
                            server = %format!("{}:{}", now.0, now.1),
                            "the database's primary moved: new connections go to it"
                        );
                        pool.set_connect_options(o);
                    }
                    conn = Some(c);
                }
                Err(e) => tracing::warn!(error = %e, "looking for the database's primary"),
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_of_several_servers_splits_into_one_url_each() {
        let s = Servers::parse(
            "postgres://u:p@h1:5440,h2:5441/db?sslmode=disable&target_session_attrs=read-write",
        )
        .unwrap();
        assert_eq!(
            s.urls(),
            [
                "postgres://u:p@h1:5440/db?sslmode=disable",
                "postgres://u:p@h2:5441/db?sslmode=disable"
            ]
        );
        assert!(s.read_write() && !s.is_single());
        let one = Servers::parse("postgres://u@h/db").unwrap();
        assert!(one.is_single());
        assert_eq!(one.first(), "postgres://u@h/db");
        let rw = Servers::parse("postgres://h/db?target_session_attrs=primary").unwrap();
        assert!(rw.read_write() && !rw.is_single());
        assert_eq!(rw.first(), "postgres://h/db");
    }

    #[test]
    fn an_unsupported_target_is_refused_without_the_password() {
        let e =
            Servers::parse("postgres://u:secret@h/db?target_session_attrs=standby").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Config);
        assert!(
            e.to_string().contains("standby") && !e.to_string().contains("secret"),
            "{e}"
        );
    }
}
