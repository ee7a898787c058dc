//! Configuration of the NATS JetStream sink.

use std::time::Duration;

use outbox_core::options::{Bounds, QueryOptions, Role};
use outbox_core::tls::{self, TlsOptions};
use outbox_core::{Error, Secret};

/// Default wait for a JetStream publish acknowledgement.
pub const DEFAULT_ACK_TIMEOUT: Duration = Duration::from_secs(5);

/// The options `nats://` and `tls://` accept: the sink's own, TLS and credentials.
pub const OPTIONS: &[&str] = &[
    "ack_timeout",
    "tls_ca",
    "tls_cert",
    "tls_key",
    "password_file",
    "password_env",
    "token_file",
    "token_env",
    "creds_file",
    "nkey_file",
];

/// Where and how to publish to JetStream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NatsConfig {
    /// Server URL without credentials, e.g. `nats://127.0.0.1:4222`.
    pub url: String,
    /// Longest wait for one acknowledgement before the attempt counts as failed (retried).
    pub ack_timeout: Duration,
    /// How to authenticate, from the URL's userinfo or its options.
    pub auth: Option<NatsAuth>,
    /// CA and client certificate (`tls_ca`, `tls_cert`, `tls_key`). Any of them, or the
    /// `tls://` scheme, makes TLS required: the client never falls back to plaintext.
    pub tls: TlsOptions,
}

/// How to authenticate to the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NatsAuth {
    /// User and password (`nats://user:pass@…`, or `nats://user@…?password_file=…`).
    UserPassword(String, Secret),
    /// A token (`nats://token@…`, or `token_file=`/`token_env=`).
    Token(Secret),
    /// The contents of a credentials file (`creds_file=`): a user JWT and its NKey seed, as
    /// `nsc` writes them for an operator/account/user setup (Synadia Cloud's `.creds`).
    Credentials(Secret),
    /// An NKey seed (`nkey_file=`, a file holding `SU…`).
    NKey(Secret),
}

impl NatsConfig {
    /// Parses `nats://[user:pass@|token@]host:port[?ack_timeout=5s&tls_ca=…&creds_file=…]`
    /// (`tls://` for TLS with the system's roots).
    pub fn from_url(url: &str) -> Result<Self, Error> {
        let (base, query) = url.split_once('?').unwrap_or((url, ""));
        let scheme = if base.starts_with("tls://") {
            "tls"
        } else {
            "nats"
        };
        let options = QueryOptions::parse(Role::Sink, scheme, query, OPTIONS)?;
        Self::from_options(base, &options)
    }

    /// The configuration of the server at `base` (a URL without its query) with the options
    /// `o` parsed by the caller: an inbox source takes these options beside its own.
    pub fn from_options(base: &str, options: &QueryOptions) -> Result<Self, Error> {
        if !(base.starts_with("nats://") || base.starts_with("tls://"))
            || base.len() <= "nats://".len()
        {
            return Err(Error::config(format!(
                "`{}`: expected nats://host:port",
                outbox_core::redact::url(base)
            )));
        }
        let conn = format!("{} {}", role_word(options), outbox_core::redact::url(base));
        let (scheme, rest) = base.split_once("://").unwrap_or(("nats", base));
        let (userinfo, host) = match rest.rsplit_once('@') {
            Some((userinfo, host)) => (Some(userinfo), host),
            None => (None, rest),
        };
        let secret_options = ["password", "token", "creds", "nkey"]
            .iter()
            .filter(|w| options.has(&format!("{w}_file")) || options.has(&format!("{w}_env")))
            .count();
        if secret_options > 1 {
            return Err(Error::config(format!(
                "{conn}: give one way to authenticate: a password, a token, creds_file or \
                 nkey_file, not several"
            )));
        }
        let auth = if options.has("password_file") || options.has("password_env") {
            let user = userinfo.map(|u| u.split_once(':').map_or(u, |(user, _)| user));
            let Some(user) = user.filter(|u| !u.is_empty()) else {
                return Err(Error::config(format!(
                    "{conn}: a password needs a user name: nats://USER@host?password_file=…"
                )));
            };
            let in_url = userinfo
                .and_then(|u| u.split_once(':'))
                .map(|(_, p)| Secret::new(p));
            tls::password(options, &conn, in_url)?
                .map(|p| NatsAuth::UserPassword(user.to_string(), p))
        } else if options.has("token_file") || options.has("token_env") {
            tls::token(options, &conn, userinfo.map(Secret::new))?.map(NatsAuth::Token)
        } else if let Some(path) = options.non_empty("creds_file")? {
            refuse_userinfo(&conn, userinfo, "creds_file")?;
            let creds = read_text(&conn, "creds_file", path)?;
            // The client's own parser checks the file now, not at the first connection.
            async_nats::ConnectOptions::with_credentials(creds.expose()).map_err(|e| {
                Error::config(format!(
                    "{conn}: creds_file {path} is not a NATS credentials file (a user JWT and \
                     an NKey seed): {}",
                    outbox_core::redact::sanitize(&e.to_string())
                ))
            })?;
            Some(NatsAuth::Credentials(creds))
        } else if let Some(path) = options.non_empty("nkey_file")? {
            refuse_userinfo(&conn, userinfo, "nkey_file")?;
            let seed = read_text(&conn, "nkey_file", path)?;
            if !seed.expose().starts_with('S') {
                return Err(Error::config(format!(
                    "{conn}: nkey_file {path} holds no NKey seed (a seed starts with `S`)"
                )));
            }
            Some(NatsAuth::NKey(seed))
        } else {
            userinfo.map(|userinfo| match userinfo.split_once(':') {
                Some((user, pass)) => NatsAuth::UserPassword(user.to_string(), Secret::new(pass)),
                None => NatsAuth::Token(Secret::new(userinfo)),
            })
        };
        let tls = TlsOptions::from_query(options, &conn)?;
        let scheme = if tls.any() { "tls" } else { scheme };
        Ok(Self {
            url: format!("{scheme}://{host}"),
            ack_timeout: options
                .duration("ack_timeout", Bounds::TIMEOUT)?
                .unwrap_or(DEFAULT_ACK_TIMEOUT),
            auth,
            tls,
        })
    }
}

fn role_word(o: &QueryOptions) -> &'static str {
    match o.role() {
        Role::Sink => "sink",
        Role::Source => "source",
    }
}

fn refuse_userinfo(conn: &str, userinfo: Option<&str>, option: &str) -> Result<(), Error> {
    match userinfo {
        Some(_) => Err(Error::config(format!(
            "{conn}: {option} authenticates on its own; remove the user or token from the URL"
        ))),
        None => Ok(()),
    }
}

/// A secret file's text, trailing newlines dropped.
fn read_text(conn: &str, option: &str, path: &str) -> Result<Secret, Error> {
    let bytes = tls::read_file(conn, option, std::path::Path::new(path))?;
    let text = String::from_utf8(bytes)
        .map_err(|_| Error::config(format!("{conn}: {option} {path} is not UTF-8 text")))?;
    Ok(Secret::new(text.trim_end_matches(['\n', '\r'])))
}

impl NatsConfig {
    /// Client options carrying the credentials and TLS settings, to connect to
    /// [`NatsConfig::url`] (which has no credentials). Never hand a URL with credentials to the
    /// client: it logs the URLs it tries, and its debug log prints the user name (a token) in
    /// full.
    pub fn connect_options(&self) -> async_nats::ConnectOptions {
        let mut o = match &self.auth {
            Some(NatsAuth::UserPassword(user, pass)) => {
                async_nats::ConnectOptions::with_user_and_password(
                    user.clone(),
                    pass.expose().to_string(),
                )
            }
            Some(NatsAuth::Token(token)) => {
                async_nats::ConnectOptions::with_token(token.expose().to_string())
            }
            // Checked when parsed; an error here cannot happen, and would connect without
            // credentials, which the server then refuses with its own error.
            Some(NatsAuth::Credentials(creds)) => {
                async_nats::ConnectOptions::with_credentials(creds.expose())
                    .unwrap_or_else(|_| async_nats::ConnectOptions::new())
            }
            Some(NatsAuth::NKey(seed)) => {
                async_nats::ConnectOptions::with_nkey(seed.expose().to_string())
            }
            None => async_nats::ConnectOptions::new(),
        };
        // A server may ask for TLS on a nats:// URL too (its INFO says so).
        crate::install_tls_provider();
        if self.url.starts_with("tls://") {
            o = o.require_tls(true);
        }
        if let Some(ca) = &self.tls.ca {
            o = o.add_root_certificates(ca.clone());
        }
        if let Some(c) = &self.tls.client {
            o = o.add_client_certificate(c.cert.clone(), c.key.clone());
        }
        o
    }

    /// A client for readers and tools beside the sink (the benchmark's stream setup, the
    /// verify and demo observers): connects once, fails at once when the server is down, and
    /// keeps the credentials out of every URL the client sees.
    pub async fn connect_client(&self) -> Result<async_nats::Client, Error> {
        self.connect_options()
            .connection_timeout(std::time::Duration::from_secs(5))
            .connect(&self.url)
            .await
            .map_err(|e| {
                Error::with_source(
                    outbox_core::ErrorKind::Connection,
                    format!(
                        "nats: cannot connect to {}: {e}",
                        outbox_core::redact::url(&self.url)
                    ),
                    e,
                )
            })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn parses_url_and_options() {
        let c = NatsConfig::from_url("nats://127.0.0.1:4222?ack_timeout=250ms").unwrap();
        assert_eq!(c.url, "nats://127.0.0.1:4222");
        assert_eq!(c.ack_timeout, Duration::from_millis(250));
    }

    #[test]
    fn credentials_move_out_of_the_url_and_stay_hidden() {
        let c = NatsConfig::from_url("nats://app:hunter2@127.0.0.1:4222").unwrap();
        assert_eq!(c.url, "nats://127.0.0.1:4222");
        assert_eq!(
            c.auth,
            Some(NatsAuth::UserPassword("app".into(), Secret::new("hunter2")))
        );
        assert!(!format!("{c:?}").contains("hunter2"));
        let t = NatsConfig::from_url("nats://s3cret@127.0.0.1:4222").unwrap();
        assert_eq!(t.auth, Some(NatsAuth::Token(Secret::new("s3cret"))));
    }

    #[test]
    fn credentials_come_from_files_and_the_environment() {
        let dir = std::env::temp_dir().join(format!("outbox-nats-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let pass = dir.join("pass");
        std::fs::write(&pass, "hunter2\n").unwrap();
        let c = NatsConfig::from_url(&format!(
            "nats://relay@h:4222?password_file={}",
            pass.display()
        ))
        .unwrap();
        assert_eq!(
            c.auth,
            Some(NatsAuth::UserPassword(
                "relay".into(),
                Secret::new("hunter2")
            ))
        );
        let seed = dir.join("seed");
        std::fs::write(&seed, "not a seed").unwrap();
        for (url, says) in [
            (
                format!("nats://h:4222?password_file={}", pass.display()),
                "needs a user name",
            ),
            (
                format!("nats://h:4222?nkey_file={}", seed.display()),
                "holds no NKey seed",
            ),
            (
                format!("nats://h:4222?nkey_file={}&token_env=X", seed.display()),
                "one way to authenticate",
            ),
            (
                format!("nats://tok@h:4222?creds_file={}", pass.display()),
                "remove the user or token",
            ),
            (
                format!("nats://h:4222?creds_file={}", pass.display()),
                "not a NATS credentials file",
            ),
        ] {
            let e = NatsConfig::from_url(&url).unwrap_err().to_string();
            assert!(e.contains(says), "{url}: {e}");
            assert!(!e.contains("hunter2"), "{e}");
        }
        let t = NatsConfig::from_url("nats://h:4222?tls_ca=/nonexistent/ca.pem")
            .unwrap_err()
            .to_string();
        assert!(
            t.contains("tls_ca /nonexistent/ca.pem cannot be read"),
            "{t}"
        );
    }

    #[test]
    fn rejects_bad_urls_and_options() {
        assert!(NatsConfig::from_url("http://x").is_err());
        assert!(NatsConfig::from_url("nats://x?bogus=1").is_err());
        assert!(NatsConfig::from_url("nats://x?ack_timeout=soon").is_err());
    }
}
