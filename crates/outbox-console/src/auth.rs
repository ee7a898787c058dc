//! Who may read and who may act: the Host a request names, the console token
//! (`--token` / `OUTBOX_CONSOLE_TOKEN`) on every request, and, for actions, a same-origin check
//! and a CSRF token bound to this process.
//!
//! - **Host.** Every request must name this console by an IP address, `localhost`, or a name
//!   given with `--allowed-host`. A DNS-rebinding page reaches the console under a name of its
//!   own, so it is refused before anything else is read, token or not.
//! - **Token.** It arrives as `Authorization: Bearer <token>` (any case of `Bearer`), or once as
//!   `?token=` in a link: the console then starts a *session* and redirects to the same page
//!   without the token, so it stays out of the address bar and history. A session is two
//!   cookies that hold no token, only values signed with it (HMAC-SHA256) that expire after
//!   12 hours: `outbox_console` (SameSite=Lax) lets pages be read, so a console link followed
//!   from chat or a pager opens the page; `outbox_console_act` (SameSite=Strict) is needed for
//!   actions, so no request started on another site can act. Signing out revokes the session.
//! - **Actions** are POSTs that must carry the CSRF token the console put in its own forms and
//!   must not come from another site (`Sec-Fetch-Site`, else `Origin` against `Host`; the
//!   scheme is not compared, so a proxy that terminates TLS may keep `Host`).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;

use hmac::{Hmac, Mac as _};
use hyper::header::{AUTHORIZATION, COOKIE, HOST, ORIGIN};
use hyper::HeaderMap;
use sha2::Sha256;

/// The cookie that lets a session read pages (SameSite=Lax).
pub const COOKIE_NAME: &str = "outbox_console";
/// The cookie that lets a session act (SameSite=Strict).
pub const ACT_COOKIE_NAME: &str = "outbox_console_act";
/// How long a session lasts.
pub const SESSION_SECONDS: i64 = 12 * 3600;

/// The host names every console answers to besides IP addresses.
pub const LOOPBACK_NAMES: [&str; 1] = ["localhost"];

/// The secrets of one console process.
pub struct Guard {
    token: Option<String>,
    csrf: String,
    /// Host names allowed besides IP addresses and `localhost`, lower case.
    hosts: Vec<String>,
    /// Sessions signed out before they expired: nonce → when they were issued.
    revoked: Mutex<HashMap<String, i64>>,
}

impl std::fmt::Debug for Guard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guard")
            .field("token", &self.token.as_ref().map(|_| "<set>"))
            .field("hosts", &self.hosts)
            .finish_non_exhaustive()
    }
}

/// Whether a request may go on.
#[derive(Debug, PartialEq, Eq)]
pub enum Access {
    /// It may.
    Granted,
    /// It carried the token in its query: start a session and redirect to the page without it.
    Adopt,
    /// No token, a wrong one, or a session that ended.
    Refused,
}

/// What a request may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// Read pages.
    Read,
    /// Change something (a POST).
    Act,
}

impl Purpose {
    fn tag(self) -> &'static str {
        match self {
            Purpose::Read => "read",
            Purpose::Act => "act",
        }
    }
}

impl Guard {
    /// A guard for `token` (`None`: every request may read) answering to `hosts` besides IP
    /// addresses and `localhost`, with a fresh random CSRF token.
    pub fn new(token: Option<String>, hosts: &[String]) -> Self {
        Self {
            token,
            csrf: random(),
            hosts: hosts
                .iter()
                .map(|h| h.trim_end_matches('.').to_ascii_lowercase())
                .collect(),
            revoked: Mutex::new(HashMap::new()),
        }
    }

    /// Whether a token is required.
    pub fn requires_token(&self) -> bool {
        self.token.is_some()
    }

    /// The CSRF token this process's forms carry.
    pub fn csrf(&self) -> &str {
        &self.csrf
    }

    /// Why the request's `Host` is refused, or `None` when it names this console: an IP
    /// address, `localhost`, or an allowed name (any port: a proxy may front it on another).
    pub fn refuse_host(&self, headers: &HeaderMap) -> Option<String> {
        let Some(host) = headers.get(HOST).and_then(|v| v.to_str().ok()) else {
            return Some("the request names no Host".into());
        };
        let name = host_name(host);
        if name.parse::<IpAddr>().is_ok() {
            return None;
        }
        let name = name.trim_end_matches('.').to_ascii_lowercase();
        if LOOPBACK_NAMES.contains(&name.as_str()) || self.hosts.contains(&name) {
            return None;
        }
        let names = match self.hosts.as_slice() {
            [] => "IP addresses and localhost".to_string(),
            hosts => format!("IP addresses, localhost and {}", hosts.join(", ")),
        };
        Some(format!(
            "this console answers only to {names}, and was asked for “{}”. If you reach it \
             through that name (a DNS name, a proxy), start it with --allowed-host {}",
            outbox_core::text::terminal(&outbox_core::text::cut(host, 200)),
            outbox_core::text::terminal(&outbox_core::text::cut(&name, 200)),
        ))
    }

    /// Whether a request with `headers` and query `token` may go on for `purpose`.
    pub fn check(
        &self,
        headers: &HeaderMap,
        query_token: Option<&str>,
        purpose: Purpose,
    ) -> Access {
        let Some(want) = &self.token else {
            return Access::Granted;
        };
        let bearer = headers
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, t)| t.trim());
        if bearer.is_some_and(|b| same(b, want)) {
            return Access::Granted;
        }
        // A reader may show either cookie: the Strict one is sent wherever the Lax one is.
        let names: &[&str] = match purpose {
            Purpose::Read => &[COOKIE_NAME, ACT_COOKIE_NAME],
            Purpose::Act => &[ACT_COOKIE_NAME],
        };
        let now = chrono::Utc::now().timestamp();
        let session = cookies(headers)
            .filter(|(name, _)| names.contains(name))
            .any(|(name, value)| {
                let purpose = if name == COOKIE_NAME {
                    Purpose::Read
                } else {
                    Purpose::Act
                };
                self.session_valid(value, purpose, now)
            });
        if session {
            Access::Granted
        } else if purpose == Purpose::Read && query_token.is_some_and(|q| same(q, want)) {
            Access::Adopt
        } else {
            Access::Refused
        }
    }

    /// The `Set-Cookie` values that start a new session (`secure`: the console is reached over
    /// HTTPS, through a proxy), or nothing without a token.
    pub fn start_session(&self, secure: bool) -> Vec<String> {
        let Some(token) = &self.token else {
            return Vec::new();
        };
        let issued = chrono::Utc::now().timestamp();
        let nonce = random();
        let secure = if secure { "; Secure" } else { "" };
        [
            (COOKIE_NAME, Purpose::Read, "Lax"),
            (ACT_COOKIE_NAME, Purpose::Act, "Strict"),
        ]
        .into_iter()
        .map(|(name, purpose, same_site)| {
            let value = format!(
                "{}.{issued}.{nonce}.{}",
                purpose.tag(),
                sign(token, purpose, issued, &nonce)
            );
            format!(
                "{name}={value}; Path=/; HttpOnly; SameSite={same_site}; \
                 Max-Age={SESSION_SECONDS}{secure}"
            )
        })
        .collect()
    }

    /// Ends the session the request carries (it is refused from now on, in every browser that
    /// holds it) and returns the `Set-Cookie` values that remove its cookies.
    pub fn end_session(&self, headers: &HeaderMap) -> Vec<String> {
        let now = chrono::Utc::now().timestamp();
        let mut revoked = self.revoked.lock().unwrap_or_else(|p| p.into_inner());
        revoked.retain(|_, issued| now - *issued < SESSION_SECONDS);
        for (_, value) in cookies(headers) {
            if let Some((issued, nonce)) = parse_session(value) {
                revoked.insert(nonce.to_string(), issued);
            }
        }
        [COOKIE_NAME, ACT_COOKIE_NAME]
            .iter()
            .map(|name| format!("{name}=; Path=/; HttpOnly; SameSite=Lax; Max-Age=0"))
            .collect()
    }

    fn session_valid(&self, value: &str, purpose: Purpose, now: i64) -> bool {
        let Some(token) = &self.token else {
            return false;
        };
        let mut parts = value.split('.');
        let (Some(tag), Some(issued), Some(nonce), Some(mac), None) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return false;
        };
        let Ok(issued) = issued.parse::<i64>() else {
            return false;
        };
        tag == purpose.tag()
            && (0..SESSION_SECONDS).contains(&(now - issued))
            && same(mac, &sign(token, purpose, issued, nonce))
            && !self
                .revoked
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .contains_key(nonce)
    }

    /// Why an action (a POST) with `headers` and the form's `csrf` field is refused, or `None`
    /// when it may go on: it must come from this console's own pages.
    pub fn refuse_action(&self, headers: &HeaderMap, csrf: Option<&str>) -> Option<&'static str> {
        let header = |name| headers.get(name).and_then(|v| v.to_str().ok());
        match header("sec-fetch-site") {
            Some("same-origin") | Some("none") | None => {}
            Some(_) => return Some("a cross-site request cannot act on this console"),
        }
        if let (Some(origin), Some(host)) = (header(ORIGIN.as_str()), header(HOST.as_str())) {
            let own = origin
                .strip_prefix("http://")
                .or_else(|| origin.strip_prefix("https://"));
            if !own.is_some_and(|o| o.eq_ignore_ascii_case(host)) {
                return Some("a request from another origin cannot act on this console");
            }
        }
        if !csrf.is_some_and(|c| same(c, &self.csrf)) {
            return Some(
                "the form's CSRF token is missing or stale: reload the page and submit it again",
            );
        }
        None
    }
}

/// The host of a `Host` header value, without its port (`[::1]:8080` → `::1`).
fn host_name(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    }
}

/// Every `name=value` cookie of the request.
fn cookies(headers: &HeaderMap) -> impl Iterator<Item = (&str, &str)> {
    headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
}

/// (issued, nonce) of a session cookie's value, unchecked.
fn parse_session(value: &str) -> Option<(i64, &str)> {
    let mut parts = value.split('.');
    let _tag = parts.next()?;
    let issued = parts.next()?.parse().ok()?;
    Some((issued, parts.next()?))
}

/// The session's signature: HMAC-SHA256 keyed with the token over what the cookie says, in hex.
/// A cookie that leaks gives neither the token nor a session longer than its own.
fn sign(token: &str, purpose: Purpose, issued: i64, nonce: &str) -> String {
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(token.as_bytes()) else {
        // HMAC takes a key of any length; never reached.
        return String::new();
    };
    mac.update(format!("outbox-console/1/{}/{issued}/{nonce}", purpose.tag()).as_bytes());
    mac.finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// 64 random hex digits.
fn random() -> String {
    format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}

/// Compares two secrets in time that depends on their length only.
fn same(a: &str, b: &str) -> bool {
    !b.is_empty()
        && a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::header::HeaderValue;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                *k,
                HeaderValue::from_str(v).unwrap_or(HeaderValue::from_static("")),
            );
        }
        h
    }

    /// The `name=value` of each Set-Cookie, joined as a browser sends them.
    fn cookie_header(set: &[String]) -> String {
        set.iter()
            .map(|c| c.split(';').next().unwrap_or_default())
            .collect::<Vec<_>>()
            .join("; ")
    }

    #[test]
    fn the_token_is_taken_from_a_bearer_of_any_case_or_once_from_the_query() {
        let g = Guard::new(Some("s3cret-s3cret-s3cret".into()), &[]);
        let read = Purpose::Read;
        assert_eq!(g.check(&headers(&[]), None, read), Access::Refused);
        for auth in ["Bearer s3cret-s3cret-s3cret", "bearer s3cret-s3cret-s3cret"] {
            assert_eq!(
                g.check(&headers(&[("authorization", auth)]), None, Purpose::Act),
                Access::Granted
            );
        }
        assert_eq!(
            g.check(
                &headers(&[("cookie", "outbox_console=s3cret-s3cret-s3cret")]),
                None,
                read
            ),
            Access::Refused,
            "the raw token is no session"
        );
        assert_eq!(
            g.check(&headers(&[]), Some("s3cret-s3cret-s3cret"), read),
            Access::Adopt
        );
        assert_eq!(
            g.check(&headers(&[]), Some("s3cret"), read),
            Access::Refused
        );
        assert_eq!(
            Guard::new(None, &[]).check(&headers(&[]), None, Purpose::Act),
            Access::Granted
        );
    }

    #[test]
    fn a_session_reads_with_its_lax_cookie_and_acts_only_with_its_strict_one() {
        let g = Guard::new(Some("s3cret-s3cret-s3cret".into()), &[]);
        let set = g.start_session(false);
        assert_eq!(set.len(), 2);
        assert!(set[0].starts_with("outbox_console=") && set[0].contains("SameSite=Lax"));
        assert!(set[1].starts_with("outbox_console_act=") && set[1].contains("SameSite=Strict"));
        assert!(set
            .iter()
            .all(|c| !c.contains("s3cret") && c.contains("HttpOnly")));
        let both = headers(&[("cookie", &cookie_header(&set))]);
        let lax_only = headers(&[("cookie", &cookie_header(&set[..1]))]);
        assert_eq!(g.check(&lax_only, None, Purpose::Read), Access::Granted);
        assert_eq!(g.check(&lax_only, None, Purpose::Act), Access::Refused);
        assert_eq!(g.check(&both, None, Purpose::Act), Access::Granted);
        // A read cookie renamed as the act cookie is not one.
        let forged = cookie_header(&set[..1]).replace("outbox_console=", "outbox_console_act=");
        assert_eq!(
            g.check(&headers(&[("cookie", &forged)]), None, Purpose::Act),
            Access::Refused
        );
        // Another console's token signs nothing here.
        let other = Guard::new(Some("another-token-another".into()), &[]);
        assert_eq!(other.check(&both, None, Purpose::Read), Access::Refused);
        // Signed out: refused everywhere, and the browser is told to drop the cookies.
        let cleared = g.end_session(&both);
        assert!(cleared.iter().all(|c| c.contains("Max-Age=0")));
        assert_eq!(g.check(&both, None, Purpose::Read), Access::Refused);
        assert!(g.start_session(true)[0].contains("; Secure"));
    }

    #[test]
    fn only_ip_addresses_localhost_and_allowed_names_are_answered() {
        let g = Guard::new(None, &["Console.Example.".into()]);
        for ok in [
            "127.0.0.1:8080",
            "localhost:8080",
            "LOCALHOST",
            "[::1]:8080",
            "10.1.2.3",
            "console.example:443",
            "console.example.",
        ] {
            assert_eq!(g.refuse_host(&headers(&[("host", ok)])), None, "{ok}");
        }
        for bad in [
            "evil.example:8080",
            "localhost.evil.example",
            "127.0.0.1.nip.io",
        ] {
            let why = g
                .refuse_host(&headers(&[("host", bad)]))
                .unwrap_or_default();
            assert!(why.contains("--allowed-host"), "{bad}: {why}");
        }
        assert!(g.refuse_host(&headers(&[])).is_some(), "no Host");
    }

    #[test]
    fn actions_need_the_csrf_token_and_the_same_origin() {
        let g = Guard::new(None, &[]);
        let csrf = g.csrf().to_string();
        let own = headers(&[
            ("host", "127.0.0.1:8080"),
            ("origin", "http://127.0.0.1:8080"),
        ]);
        assert_eq!(g.refuse_action(&own, Some(&csrf)), None);
        assert!(g.refuse_action(&own, None).is_some());
        assert!(g.refuse_action(&own, Some("guess")).is_some());
        let other = headers(&[
            ("host", "127.0.0.1:8080"),
            ("origin", "http://evil.example"),
        ]);
        assert!(g.refuse_action(&other, Some(&csrf)).is_some());
        let cross = headers(&[("sec-fetch-site", "cross-site")]);
        assert!(g.refuse_action(&cross, Some(&csrf)).is_some());
    }
}
