//! Configuration of the NATS JetStream sink.

use std::time::Duration;

use outbox_core::options::{Bounds, QueryOptions, Role};
use outbox_core::{Error, Secret};

/// Default wait for a JetStream publish acknowledgement.
pub const DEFAULT_ACK_TIMEOUT: Duration = Duration::from_secs(5);

/// Where and how to publish to JetStream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NatsConfig {
    /// Server URL without credentials, e.g. `nats://127.0.0.1:4222`.
    pub url: String,
    /// Longest wait for one acknowledgement before the attempt counts as failed (retried).
    pub ack_timeout: Duration,
    /// Credentials from the URL: `nats://user:pass@host` or `nats://token@host`.
    pub auth: Option<NatsAuth>,
}

/// How to authenticate to the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NatsAuth {
    /// User and password.
    UserPassword(String, Secret),
    /// A token.
    Token(Secret),
}

impl NatsConfig {
    /// Parses `nats://[user:pass@|token@]host:port[?ack_timeout=5s]`.
    pub fn from_url(url: &str) -> Result<Self, Error> {
        let (base, query) = url.split_once('?').unwrap_or((url, ""));
        let scheme = if base.starts_with("tls://") {
            "tls"
        } else {
            "nats"
        };
        let options = QueryOptions::parse(Role::Sink, scheme, query, &["ack_timeout"])?;
        if !(base.starts_with("nats://") || base.starts_with("tls://"))
            || base.len() <= "nats://".len()
        {
            return Err(Error::config(format!(
                "sink `{}`: expected nats://host:port",
                outbox_core::redact::url(url)
            )));
        }
        let (scheme, rest) = base.split_once("://").unwrap_or(("nats", base));
        let (auth, host) = match rest.rsplit_once('@') {
            Some((userinfo, host)) => {
                let auth = match userinfo.split_once(':') {
                    Some((user, pass)) => {
                        NatsAuth::UserPassword(user.to_string(), Secret::new(pass))
                    }
                    None => NatsAuth::Token(Secret::new(userinfo)),
                };
                (Some(auth), host)
            }
            None => (None, rest),
        };
        let cfg = Self {
            url: format!("{scheme}://{host}"),
            ack_timeout: options
                .duration("ack_timeout", Bounds::TIMEOUT)?
                .unwrap_or(DEFAULT_ACK_TIMEOUT),
            auth,
        };
        Ok(cfg)
    }
}

impl NatsConfig {
    /// Client options carrying the credentials, to connect to [`NatsConfig::url`] (which has
    /// none). Never hand a URL with credentials to the client: it logs the URLs it tries, and
    /// its debug log prints the user name (a token) in full.
    pub fn connect_options(&self) -> async_nats::ConnectOptions {
        match &self.auth {
            Some(NatsAuth::UserPassword(user, pass)) => {
                async_nats::ConnectOptions::with_user_and_password(
                    user.clone(),
                    pass.expose().to_string(),
                )
            }
            Some(NatsAuth::Token(token)) => {
                async_nats::ConnectOptions::with_token(token.expose().to_string())
            }
            None => async_nats::ConnectOptions::new(),
        }
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
    fn rejects_bad_urls_and_options() {
        assert!(NatsConfig::from_url("http://x").is_err());
        assert!(NatsConfig::from_url("nats://x?bogus=1").is_err());
        assert!(NatsConfig::from_url("nats://x?ack_timeout=soon").is_err());
    }
}
