//! Configuration of the HTTP webhook sink: the endpoint URL, and the sink's options in the URL's
//! fragment (a fragment is never sent to a server, so the endpoint's own query stays its own).

use std::time::Duration;

use base64::Engine as _;
use outbox_core::options::{Bounds, QueryOptions, Role};
use outbox_core::tls::TlsOptions;
use outbox_core::{Error, Secret};

/// Default longest wait for one request's response.
pub const DEFAULT_ACK_TIMEOUT: Duration = Duration::from_secs(10);
/// Default requests in flight at once.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 32;
/// Default largest batch, in messages, of `mode=batch`.
pub const DEFAULT_MAX_BATCH: usize = 100;
/// Where the endpoint URL takes the rendered destination.
pub const DESTINATION_PLACEHOLDER: &str = "{destination}";

const OPTIONS: &[&str] = &[
    "mode",
    "max_batch",
    "ack_timeout",
    "max_in_flight",
    "secret",
    "secret_env",
    "secret_file",
    "tls_ca",
    "tls_cert",
    "tls_key",
];

/// The raw bytes of a signing key; never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct SigningKey(Vec<u8>);

impl SigningKey {
    /// The key itself.
    pub fn bytes(&self) -> &[u8] {
        &self.0
    }
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SigningKey(***)")
    }
}

/// One message per request, or a JSON array of messages per request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `POST` of the payload as it is, the message's metadata in headers.
    Single,
    /// `POST` of a JSON array of messages (id, destination, key, headers, payload).
    Batch,
}

/// Where and how to POST.
#[derive(Clone, PartialEq, Eq)]
pub struct HttpConfig {
    /// The endpoint without credentials or fragment; may hold `{destination}`.
    pub endpoint: String,
    /// `user:password` of the URL, sent as HTTP Basic authentication (never logged).
    pub basic_auth: Option<(String, Secret)>,
    /// One message or a batch per request.
    pub mode: Mode,
    /// Largest batch of `mode=batch`.
    pub max_batch: usize,
    /// Longest wait for one response (connecting included).
    pub ack_timeout: Duration,
    /// Requests in flight at once.
    pub max_in_flight: usize,
    /// The Standard Webhooks signing key (the bytes behind `whsec_…`); `None`: unsigned.
    pub signing_key: Option<SigningKey>,
    /// `#tls_ca=` (trust only that CA, not the system's roots) and `#tls_cert=`/`#tls_key=`
    /// (a client certificate: mutual TLS to the receiver). The receiver's name is always
    /// checked.
    pub tls: TlsOptions,
}

impl std::fmt::Debug for HttpConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpConfig")
            .field("endpoint", &outbox_core::redact::url(&self.endpoint))
            .field("basic_auth", &self.basic_auth.as_ref().map(|(u, _)| u))
            .field("mode", &self.mode)
            .field("max_batch", &self.max_batch)
            .field("ack_timeout", &self.ack_timeout)
            .field("max_in_flight", &self.max_in_flight)
            .field("signed", &self.signing_key.is_some())
            .field("tls", &self.tls)
            .finish()
    }
}

impl HttpConfig {
    /// Parses `http[s]://[user:pass@]host[:port]/path[?query][#option=value&…]`: the options
    /// (`mode`, `max_batch`, `ack_timeout`, `max_in_flight`, and one of `secret`, `secret_env`,
    /// `secret_file`) go after `#`. Any other option is a config error naming it.
    pub fn from_url(url: &str) -> Result<Self, Error> {
        let shown = outbox_core::redact::url(url);
        let (base, fragment) = url.split_once('#').unwrap_or((url, ""));
        let parsed = reqwest::Url::parse(&base.replace(DESTINATION_PLACEHOLDER, "destination"))
            .map_err(|e| Error::config(format!("sink `{shown}`: not a valid URL: {e}")))?;
        if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none() {
            return Err(Error::config(format!(
                "sink `{shown}`: expected http[s]://host[:port]/path"
            )));
        }
        // Credentials leave the endpoint: they go in the Authorization header only.
        let basic_auth = if parsed.username().is_empty() {
            None
        } else {
            let decode = |s: &str| {
                percent_encoding::percent_decode_str(s)
                    .decode_utf8()
                    .map(|c| c.into_owned())
                    .map_err(|_| {
                        Error::config(format!(
                            "sink `{shown}`: the credentials are not valid percent-encoded UTF-8"
                        ))
                    })
            };
            Some((
                decode(parsed.username())?,
                Secret::new(decode(parsed.password().unwrap_or(""))?),
            ))
        };
        let endpoint = match base.split_once("://") {
            Some((scheme, rest)) => match rest.rfind('@').filter(|at| {
                // Only an `@` before the path belongs to the userinfo.
                rest.find('/').is_none_or(|slash| *at < slash)
            }) {
                Some(at) => format!("{scheme}://{}", &rest[at + 1..]),
                None => base.to_string(),
            },
            None => base.to_string(),
        };
        let scheme = parsed.scheme();
        let o = QueryOptions::parse(Role::Sink, scheme, fragment, OPTIONS)?;
        let secrets = ["secret", "secret_env", "secret_file"]
            .iter()
            .filter(|k| o.has(k))
            .count();
        if secrets > 1 {
            return Err(Error::config(
                "http sink: give one of secret, secret_env and secret_file, not several",
            ));
        }
        let signing_key = if let Some(value) = o.str("secret") {
            Some(signing_key(value, "secret")?)
        } else if let Some(name) = o.str("secret_env") {
            let v = std::env::var(name).map_err(|_| {
                Error::config(format!(
                    "http sink option secret_env=`{name}`: that environment variable is not set"
                ))
            })?;
            Some(signing_key(v.trim(), &format!("${name}"))?)
        } else if let Some(path) = o.str("secret_file") {
            let v = std::fs::read_to_string(path).map_err(|e| {
                Error::config(format!(
                    "http sink option secret_file=`{path}`: cannot read it: {e}"
                ))
            })?;
            Some(signing_key(v.trim(), path)?)
        } else {
            None
        };
        let tls =
            TlsOptions::from_query(&o, &format!("sink {}", outbox_core::redact::url(&endpoint)))?;
        if tls.any() && scheme != "https" {
            return Err(Error::config(format!(
                "sink `{shown}`: tls_ca, tls_cert and tls_key need TLS: write https://"
            )));
        }
        let whole = Bounds::new(1usize, usize::MAX);
        Ok(Self {
            endpoint,
            basic_auth,
            mode: o
                .one_of("mode", &[("single", Mode::Single), ("batch", Mode::Batch)])?
                .unwrap_or(Mode::Single),
            max_batch: o.int("max_batch", whole)?.unwrap_or(DEFAULT_MAX_BATCH),
            ack_timeout: o
                .duration("ack_timeout", Bounds::TIMEOUT)?
                .unwrap_or(DEFAULT_ACK_TIMEOUT),
            max_in_flight: o
                .int("max_in_flight", whole)?
                .unwrap_or(DEFAULT_MAX_IN_FLIGHT),
            signing_key,
            tls,
        })
    }
}

/// The key of a Standard Webhooks secret: `whsec_` (optional) and the key in base64. The
/// error names where the secret came from, never the secret.
fn signing_key(secret: &str, from: &str) -> Result<SigningKey, Error> {
    let b64 = secret.strip_prefix("whsec_").unwrap_or(secret);
    let key = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .ok()
        .filter(|k| k.len() >= 16)
        .ok_or_else(|| {
            Error::config(format!(
                "http sink: the signing secret from {from} is not `whsec_` and at least 16 bytes \
                 in base64 (the Standard Webhooks form)"
            ))
        })?;
    Ok(SigningKey(key))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

    #[test]
    fn parses_endpoint_options_and_credentials() {
        let c = HttpConfig::from_url(&format!(
            "https://app:p%40ss@hooks.example.com/in/{{destination}}?tenant=7#mode=batch&max_batch=50&ack_timeout=2s&secret={SECRET}"
        ))
        .unwrap();
        assert_eq!(
            c.endpoint,
            "https://hooks.example.com/in/{destination}?tenant=7"
        );
        assert_eq!(c.mode, Mode::Batch);
        assert_eq!(c.max_batch, 50);
        assert_eq!(c.ack_timeout, Duration::from_secs(2));
        let (user, pass) = c.basic_auth.clone().unwrap();
        assert_eq!((user.as_str(), pass.expose()), ("app", "p@ss"));
        assert!(c.signing_key.is_some());
        let shown = format!("{c:?}");
        assert!(
            !shown.contains("p@ss") && !shown.contains("MfKQ9r8"),
            "{shown}"
        );
        let d = HttpConfig::from_url("http://127.0.0.1:8080/hook").unwrap();
        assert_eq!(d.mode, Mode::Single);
        assert_eq!(d.ack_timeout, DEFAULT_ACK_TIMEOUT);
        assert!(d.signing_key.is_none() && d.basic_auth.is_none());
    }

    #[test]
    fn bad_urls_and_options_are_config_errors_without_secrets() {
        for url in [
            "http://",
            "ftp://h/x",
            "http://h/x#mode=stream",
            "http://h/x#bogus=1",
            "http://h/x#max_batch=0",
            "http://h/x#secret=short",
            "http://h/x#secret_env=OUTBOX_TEST_SURELY_UNSET",
        ] {
            let e = HttpConfig::from_url(url).unwrap_err();
            assert_eq!(e.kind(), outbox_core::ErrorKind::Config, "{url}");
        }
        let e = HttpConfig::from_url(&format!("http://h/x#secret={SECRET}&secret_file=/nope"))
            .unwrap_err();
        assert!(!e.to_string().contains("MfKQ9r8"), "{e}");
        let e = HttpConfig::from_url("http://h/x#secret=not-base64-and-secret!").unwrap_err();
        assert!(!e.to_string().contains("not-base64-and-secret"), "{e}");
    }
}
