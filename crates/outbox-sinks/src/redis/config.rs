//! Configuration of the Redis Streams sink: the URL, its options and their defaults.

use std::time::Duration;

use outbox_core::options::{Bounds, QueryOptions, Role};
use outbox_core::tls::{self, TlsOptions};
use outbox_core::{Error, Secret};

/// Default wait for the replies of one call's pipeline.
pub const DEFAULT_ACK_TIMEOUT: Duration = Duration::from_secs(5);
/// Default largest payload sent: Redis's own `proto-max-bulk-len` (512 MiB). A larger bulk
/// string makes the server drop the connection, failing every message in flight on it, so the
/// sink refuses it first, as an invalid message.
pub const DEFAULT_MAX_MESSAGE_SIZE: u64 = 512 << 20;

/// The options `redis://` and `rediss://` accept: the sink's own, TLS and the password.
pub const OPTIONS: &[&str] = &[
    "maxlen",
    "dedupe",
    "ack_timeout",
    "max_message_size",
    "tls_ca",
    "tls_cert",
    "tls_key",
    "password_file",
    "password_env",
];

/// The options a Redis connection takes whoever reads them (sink or inbox source).
pub const CONNECTION_OPTIONS: &[&str] = &[
    "tls_ca",
    "tls_cert",
    "tls_key",
    "password_file",
    "password_env",
];

/// Where and how to append to Redis streams.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisConfig {
    /// The URL given to the client, credentials included (never logged).
    url: Secret,
    /// The URL with its credentials masked, for logs and errors.
    pub display: String,
    /// How to reach and log in to the server: TLS and the password from a file or variable.
    pub connection: RedisConnection,
    /// `MAXLEN ~ N` on every `XADD`: the stream is trimmed to about this many entries
    /// (approximately, in whole macro nodes, which is cheap). `None`: never trimmed.
    pub maxlen: Option<u64>,
    /// Dedupe window: when set, each message also writes a marker key that lives this long,
    /// and a message whose marker exists is not appended again (see the sink).
    pub dedupe: Option<Duration>,
    /// Longest wait for the replies of one call (also bounds connecting).
    pub ack_timeout: Duration,
    /// Largest payload sent; larger ones are invalid messages.
    pub max_message_size: u64,
}

/// A dedupe window: above zero, at most 30 days (each message keeps a marker key that long).
const DEDUPE_BOUNDS: Bounds<Duration> = Bounds::new(
    Duration::from_millis(1),
    Duration::from_secs(30 * 24 * 3600),
);

impl RedisConfig {
    /// Parses `redis[s]://[user:pass@]host[:port][/db][?maxlen=N&dedupe=2m&ack_timeout=5s&max_message_size=512MiB&tls_ca=…&password_file=…]`.
    /// Any other option is a config error naming it.
    pub fn from_url(url: &str) -> Result<Self, Error> {
        let shown = outbox_core::redact::url(url);
        let (base, o) = QueryOptions::from_url(Role::Sink, url, OPTIONS)?;
        let rest = base
            .strip_prefix("redis://")
            .or_else(|| base.strip_prefix("rediss://"));
        if rest.is_none_or(|r| r.is_empty() || r.starts_with('/')) {
            return Err(Error::config(format!(
                "sink `{shown}`: expected redis[s]://[user:pass@]host[:port][/db]"
            )));
        }
        let connection = RedisConnection::from_options(base, &o)?;
        let cfg = Self {
            url: Secret::new(base),
            display: outbox_core::redact::url(base),
            connection,
            maxlen: o.int("maxlen", Bounds::new(1, u64::MAX))?,
            dedupe: o.duration("dedupe", DEDUPE_BOUNDS)?,
            ack_timeout: o
                .duration("ack_timeout", Bounds::TIMEOUT)?
                .unwrap_or(DEFAULT_ACK_TIMEOUT),
            max_message_size: o
                .size("max_message_size", Bounds::new(1, u64::MAX))?
                .unwrap_or(DEFAULT_MAX_MESSAGE_SIZE),
        };
        // The client's own parser has the last word on host, port, database and credentials.
        cfg.client()?;
        Ok(cfg)
    }

    /// A client for the URL (credentials included); connects nothing yet.
    pub(crate) fn client(&self) -> Result<redis::Client, Error> {
        self.connection.client(self.url.expose())
    }
}

/// TLS and credentials of a Redis connection beyond its URL: `tls_ca`, `tls_cert`, `tls_key`
/// (with `rediss://`) and `password_file`/`password_env` (an ACL user's password, the user
/// named in the URL: `redis://relay@host?password_file=…`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RedisConnection {
    tls: TlsOptions,
    password: Option<Secret>,
    display: String,
}

impl RedisConnection {
    /// Reads the connection options of the server at `base` (a URL without its query) from
    /// `o`, checking the files they name now.
    pub fn from_options(base: &str, o: &QueryOptions) -> Result<Self, Error> {
        let display = outbox_core::redact::url(base);
        let role = match o.role() {
            Role::Sink => "sink",
            Role::Source => "source",
        };
        let conn = format!("{role} {display}");
        let tls = TlsOptions::from_query(o, &conn)?;
        if tls.any() && !base.starts_with("rediss://") {
            return Err(Error::config(format!(
                "{conn}: tls_ca, tls_cert and tls_key need TLS: write rediss://"
            )));
        }
        let in_url = redis::IntoConnectionInfo::into_connection_info(base)
            .ok()
            .and_then(|i| i.redis_settings().password().map(Secret::new));
        let password = if o.has("password_file") || o.has("password_env") {
            tls::password(o, &conn, in_url)?
        } else {
            None
        };
        Ok(Self {
            tls,
            password,
            display,
        })
    }

    /// A client for `url` (the URL these options were read with), with the certificates and
    /// password; connects nothing yet.
    pub fn client(&self, url: &str) -> Result<redis::Client, Error> {
        let bad = |e: redis::RedisError| {
            Error::config(format!(
                "`{}`: not a valid Redis URL: {}",
                self.display,
                outbox_core::redact::sanitize(&e.to_string())
            ))
        };
        let mut info = redis::IntoConnectionInfo::into_connection_info(url).map_err(bad)?;
        if let Some(p) = &self.password {
            let settings = info.redis_settings().clone().set_password(p.expose());
            info = info.set_redis_settings(settings);
        }
        if !url.starts_with("rediss://") {
            return redis::Client::open(info).map_err(bad);
        }
        crate::install_tls_provider();
        let client_tls =
            self.tls
                .client_pem(&self.display)?
                .map(|(cert, key)| redis::ClientTlsConfig {
                    client_cert: cert,
                    client_key: key.expose().as_bytes().to_vec(),
                });
        let certs = redis::TlsCertificates {
            client_tls,
            root_cert: self.tls.ca_pem(&self.display)?,
        };
        redis::Client::build_with_tls(info, certs).map_err(bad)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn parses_url_and_options() {
        let c = RedisConfig::from_url(
            "redis://app:hunter2@127.0.0.1:6379/2?maxlen=100000&dedupe=2m&ack_timeout=250ms",
        )
        .unwrap();
        assert_eq!(c.maxlen, Some(100_000));
        assert_eq!(c.dedupe, Some(Duration::from_secs(120)));
        assert_eq!(c.ack_timeout, Duration::from_millis(250));
        assert_eq!(c.display, "redis://***@127.0.0.1:6379/2");
        assert!(!format!("{c:?}").contains("hunter2"));
        let d = RedisConfig::from_url("redis://127.0.0.1").unwrap();
        assert_eq!((d.maxlen, d.dedupe), (None, None));
        assert_eq!(d.max_message_size, DEFAULT_MAX_MESSAGE_SIZE);
    }

    #[test]
    fn rejects_bad_urls_and_options_naming_them() {
        assert!(RedisConfig::from_url("http://x").is_err());
        assert!(RedisConfig::from_url("redis://").is_err());
        let e = RedisConfig::from_url("redis://x?bogus=1")
            .unwrap_err()
            .to_string();
        assert!(e.contains("`bogus`"), "{e}");
        let e = RedisConfig::from_url("redis://x?maxlen=-1")
            .unwrap_err()
            .to_string();
        assert!(e.contains("maxlen"), "{e}");
        assert!(RedisConfig::from_url("redis://x?dedupe=forever").is_err());
        let e = RedisConfig::from_url("redis://u:hunter2@x?bogus=1")
            .unwrap_err()
            .to_string();
        assert!(!e.contains("hunter2"), "{e}");
    }
}
