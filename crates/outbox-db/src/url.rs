//! Surgery on database URLs that keeps what it does not touch: log in as another user
//! ([`url_as`]), and read or replace the servers a URL names ([`hosts`], [`with_hosts`]), a
//! list where the URL names several (`postgres://u@h1:5440,h2:5441/db`, a primary and its
//! standbys).

use outbox_core::{Error, Result};

use crate::backend::Backend;

/// The parts of `scheme://userinfo@authority/rest` this module edits.
struct Parts<'a> {
    scheme: &'a str,
    userinfo: Option<&'a str>,
    authority: &'a str,
    rest: &'a str,
}

fn split(url: &str) -> Result<Parts<'_>> {
    let (scheme, after) = url.split_once("://").ok_or_else(|| {
        Error::config(format!(
            "database URL `{}` has no `scheme://`",
            outbox_core::redact::url(url)
        ))
    })?;
    // The authority ends at the first `/`, `?` or `#`; its userinfo at its last `@`.
    let end = after.find(['/', '?', '#']).unwrap_or(after.len());
    let (userinfo, authority) = match after[..end].rfind('@') {
        Some(at) => (Some(&after[..at]), &after[at + 1..end]),
        None => (None, &after[..end]),
    };
    Ok(Parts {
        scheme,
        userinfo,
        authority,
        rest: &after[end..],
    })
}

/// `url` logging in as `user` with `password` instead of its own user: the rest (hosts, port,
/// database, query) kept as written. Both are percent-encoded into the URL.
pub fn url_as(url: &str, user: &str, password: &str) -> Result<String> {
    let p = split(url)?;
    let enc = |s: &str| {
        percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
    };
    Ok(format!(
        "{}://{}:{}@{}{}",
        p.scheme,
        enc(user),
        enc(password),
        p.authority,
        p.rest
    ))
}

/// The servers `url` names, in order, as `(host, port)` (the backend's default port where the
/// URL gives none). SQLite names none.
pub fn hosts(url: &str) -> Result<Vec<(String, u16)>> {
    let default = match Backend::of(url)? {
        Backend::Postgres => 5432,
        Backend::Mysql => 3306,
        Backend::Sqlite => return Ok(Vec::new()),
    };
    let p = split(url)?;
    p.authority
        .split(',')
        .map(|h| {
            // `[::1]:5432`, `host:5432`, `host`.
            let (host, port) = match h.rsplit_once(':') {
                Some((host, port)) if !port.contains(']') => (host, Some(port)),
                _ => (h, None),
            };
            let port = match port {
                Some(p) => p.parse().map_err(|_| {
                    Error::config(format!(
                        "database URL `{}`: `{p}` is not a port",
                        outbox_core::redact::url(url)
                    ))
                })?,
                None => default,
            };
            if host.is_empty() {
                return Err(Error::config(format!(
                    "database URL `{}` names an empty host",
                    outbox_core::redact::url(url)
                )));
            }
            Ok((host.to_string(), port))
        })
        .collect()
}

/// `url` naming `servers` instead of its own (a proxy in front of each, say), in that order.
pub fn with_hosts(url: &str, servers: &[(String, u16)]) -> Result<String> {
    let p = split(url)?;
    let authority: Vec<String> = servers
        .iter()
        .map(|(h, port)| format!("{h}:{port}"))
        .collect();
    Ok(format!(
        "{}://{}{}{}",
        p.scheme,
        p.userinfo.map(|u| format!("{u}@")).unwrap_or_default(),
        authority.join(","),
        p.rest
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_logs_in_as_another_user_keeping_hosts_and_query() {
        assert_eq!(
            url_as("postgres://root@127.0.0.1:5432/test", "r_1", "p@ss").unwrap(),
            "postgres://r%5F1:p%40ss@127.0.0.1:5432/test"
        );
        assert_eq!(
            url_as(
                "postgres://a:b@h1:5440,h2:5441/db?target_session_attrs=read-write",
                "w",
                "x"
            )
            .unwrap(),
            "postgres://w:x@h1:5440,h2:5441/db?target_session_attrs=read-write"
        );
        assert_eq!(
            url_as("mysql://127.0.0.1:3306/test", "u", "p").unwrap(),
            "mysql://u:p@127.0.0.1:3306/test"
        );
        assert!(url_as("sqlite:x.db", "u", "p").is_err());
    }

    #[test]
    fn the_servers_of_a_url_are_read_and_replaced_in_order() {
        let url = "postgres://u:p@h1:5440,h2/db?target_session_attrs=read-write";
        assert_eq!(
            hosts(url).unwrap(),
            vec![("h1".to_string(), 5440), ("h2".to_string(), 5432)]
        );
        assert_eq!(
            with_hosts(url, &[("127.0.0.1".into(), 1), ("127.0.0.1".into(), 2)]).unwrap(),
            "postgres://u:p@127.0.0.1:1,127.0.0.1:2/db?target_session_attrs=read-write"
        );
        assert_eq!(
            hosts("mysql://root@127.0.0.1/test").unwrap(),
            vec![("127.0.0.1".to_string(), 3306)]
        );
        assert_eq!(
            hosts("postgres://[::1]:6543/x").unwrap(),
            vec![("[::1]".to_string(), 6543)]
        );
        assert!(hosts("postgres://u@h:port/x").is_err());
        assert!(hosts("sqlite://x.db").unwrap().is_empty());
    }
}
