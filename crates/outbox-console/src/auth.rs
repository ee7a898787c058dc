//! Who may read and who may act: the console token (`--token` / `OUTBOX_CONSOLE_TOKEN`) on every
//! request, and, for actions, a same-origin check and a CSRF token bound to this process.
//!
//! The token arrives as `Authorization: Bearer <token>`, as the `outbox_console` cookie, or once
//! as `?token=` in a link: the console then sets the cookie (HttpOnly, SameSite=Strict) and
//! redirects to the same page without it, so it does not stay in the address bar or history.
//! Actions are POSTs that must carry the CSRF token the console put in its own forms and must
//! not come from another site (`Sec-Fetch-Site`, else `Origin` against `Host`).

use hyper::header::{AUTHORIZATION, COOKIE, HOST, ORIGIN};
use hyper::HeaderMap;

/// The cookie that carries the console token.
pub const COOKIE_NAME: &str = "outbox_console";

/// The secrets of one console process.
#[derive(Clone)]
pub struct Guard {
    token: Option<String>,
    csrf: String,
}

impl std::fmt::Debug for Guard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guard")
            .field("token", &self.token.as_ref().map(|_| "<set>"))
            .finish_non_exhaustive()
    }
}

/// Whether a request may go on.
#[derive(Debug, PartialEq, Eq)]
pub enum Access {
    /// It may.
    Granted,
    /// It carried the token in its query: set the cookie and redirect to the page without it.
    Adopt,
    /// No token, or a wrong one.
    Refused,
}

impl Guard {
    /// A guard for `token` (`None`: every request may read) with a fresh random CSRF token.
    pub fn new(token: Option<String>) -> Self {
        let csrf = format!(
            "{}{}",
            uuid::Uuid::new_v4().simple(),
            uuid::Uuid::new_v4().simple()
        );
        Self {
            token: token.filter(|t| !t.is_empty()),
            csrf,
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

    /// Whether a request with `headers` and query `token` may go on.
    pub fn check(&self, headers: &HeaderMap, query_token: Option<&str>) -> Access {
        let Some(want) = &self.token else {
            return Access::Granted;
        };
        let bearer = headers
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        let cookie = headers
            .get_all(COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(';'))
            .filter_map(|c| c.trim().strip_prefix(COOKIE_NAME)?.strip_prefix('='))
            .find(|c| same(c, want));
        if bearer.is_some_and(|b| same(b, want)) || cookie.is_some() {
            Access::Granted
        } else if query_token.is_some_and(|q| same(q, want)) {
            Access::Adopt
        } else {
            Access::Refused
        }
    }

    /// The `Set-Cookie` value that carries the token from now on.
    pub fn cookie(&self) -> Option<String> {
        self.token
            .as_ref()
            .map(|t| format!("{COOKIE_NAME}={t}; Path=/; HttpOnly; SameSite=Strict; Max-Age=43200"))
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
            if own != Some(host) {
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

/// Compares two secrets in time that depends on their length only.
fn same(a: &str, b: &str) -> bool {
    a.len() == b.len()
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

    #[test]
    fn the_token_is_taken_from_a_bearer_a_cookie_or_once_from_the_query() {
        let g = Guard::new(Some("s3cret".into()));
        assert_eq!(g.check(&headers(&[]), None), Access::Refused);
        assert_eq!(
            g.check(&headers(&[("authorization", "Bearer s3cret")]), None),
            Access::Granted
        );
        assert_eq!(
            g.check(&headers(&[("cookie", "a=b; outbox_console=s3cret")]), None),
            Access::Granted
        );
        assert_eq!(
            g.check(&headers(&[("cookie", "outbox_console=wrong")]), None),
            Access::Refused
        );
        assert_eq!(g.check(&headers(&[]), Some("s3cret")), Access::Adopt);
        assert_eq!(g.check(&headers(&[]), Some("s3cre")), Access::Refused);
        assert_eq!(Guard::new(None).check(&headers(&[]), None), Access::Granted);
    }

    #[test]
    fn actions_need_the_csrf_token_and_the_same_origin() {
        let g = Guard::new(None);
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
