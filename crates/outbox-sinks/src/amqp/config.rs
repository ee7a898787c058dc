//! Configuration of the RabbitMQ (AMQP 0-9-1) sink: the URL, its options and their defaults.

use std::time::Duration;

use outbox_core::options::{Bounds, QueryOptions, Role};
use outbox_core::tls::{self, TlsOptions};
use outbox_core::{Error, Secret};

/// Default wait for the publisher confirms of one call.
pub const DEFAULT_ACK_TIMEOUT: Duration = Duration::from_secs(5);
/// Default largest message body the sink sends: RabbitMQ's own default `max_message_size`
/// (128 MiB). A larger body would make the broker close the channel, failing every message in
/// flight on it, so the sink refuses it first, as an invalid message.
pub const DEFAULT_MAX_MESSAGE_SIZE: u64 = 128 << 20;
/// Default connection name shown by `rabbitmqctl list_connections` and the management UI.
pub const DEFAULT_CONNECTION_NAME: &str = "outbox relay";
/// Longest exchange name, routing key or header name AMQP 0-9-1 carries (a short string).
pub const MAX_SHORT_STRING: usize = 255;

/// Options this sink reads from the URL's query.
pub const OPTIONS: &[&str] = &[
    "exchange",
    "ack_timeout",
    "max_message_size",
    "connection_name",
    "tls_ca",
    "tls_cert",
    "tls_key",
    "password_file",
    "password_env",
    "auth_mechanism",
];
/// Options of the AMQP URI itself, passed on to the client.
pub const URI_OPTIONS: &[&str] = &[
    "heartbeat",
    "connection_timeout",
    "frame_max",
    "channel_max",
];

/// Where and how to publish to RabbitMQ.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AmqpConfig {
    /// The AMQP URI given to the client, credentials included (never logged).
    uri: Secret,
    /// The URI with its credentials masked, for logs and errors.
    pub display: String,
    /// Exchange of destinations that name none (no `/`): `""`, the default exchange, which
    /// routes a message to the queue named by its routing key.
    pub exchange: String,
    /// Longest wait for the publisher confirms of one call; also bounds connecting.
    pub ack_timeout: Duration,
    /// Largest message body sent; larger ones are invalid messages.
    pub max_message_size: u64,
    /// Connection name the broker shows for the relay's connection.
    pub connection_name: String,
    /// `amqps://`: the CA (PEM text) and client certificate, read when the URL was parsed.
    tls: AmqpTls,
}

/// The TLS material of an `amqps://` connection; the key never prints.
#[derive(Clone, Default, PartialEq, Eq)]
struct AmqpTls {
    ca: Option<String>,
    client: Option<(Vec<u8>, Secret)>,
}

impl std::fmt::Debug for AmqpTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AmqpTls")
            .field("ca", &self.ca.is_some())
            .field("client_certificate", &self.client.is_some())
            .finish()
    }
}

impl AmqpConfig {
    /// Parses `amqp[s]://[user:pass@]host[:port][/vhost][?options]`.
    ///
    /// Options: `exchange=NAME` (exchange of destinations without `/`; default the default
    /// exchange), `ack_timeout=5s`, `max_message_size=128MiB`, `connection_name=…`, and the AMQP
    /// URI's own `heartbeat`, `connection_timeout`, `frame_max`, `channel_max`. Any other option
    /// is a config error naming it.
    pub fn from_url(url: &str) -> Result<Self, Error> {
        let known: Vec<&str> = OPTIONS.iter().chain(URI_OPTIONS).copied().collect();
        let (base, o) = QueryOptions::from_url(Role::Sink, url, &known)?;
        Self::from_options(base, &o)
    }

    /// The configuration of the server at `base` (a URL without its query) with the options
    /// `o` parsed by the caller: an inbox source takes these options beside its own, and its
    /// errors then say "source option".
    pub fn from_options(base: &str, o: &QueryOptions) -> Result<Self, Error> {
        let shown = outbox_core::redact::url(base);
        let rest = base
            .strip_prefix("amqp://")
            .or_else(|| base.strip_prefix("amqps://"));
        if rest.is_none_or(|r| r.is_empty() || r.starts_with('/')) {
            return Err(Error::config(format!(
                "sink `{shown}`: expected amqp://[user:pass@]host[:port][/vhost]"
            )));
        }
        let exchange = o.str("exchange").unwrap_or_default();
        valid_exchange(exchange).map_err(|why| {
            Error::config(format!("amqp sink option exchange=`{exchange}`: {why}"))
        })?;
        let role = match o.role() {
            Role::Sink => "sink",
            Role::Source => "source",
        };
        let conn = format!("{role} {shown}");
        let secure = base.starts_with("amqps://");
        let tls = TlsOptions::from_query(o, &conn)?;
        if tls.any() && !secure {
            return Err(Error::config(format!(
                "{conn}: tls_ca, tls_cert and tls_key need TLS: write amqps://"
            )));
        }
        let tls = AmqpTls {
            ca: tls
                .ca_pem(&conn)?
                .map(|pem| String::from_utf8_lossy(&pem).into_owned()),
            client: tls.client_pem(&conn)?,
        };
        // EXTERNAL: the broker takes the client certificate's name as the user (RabbitMQ's
        // rabbitmq_auth_mechanism_ssl); PLAIN (the default) the URL's user and password.
        let mechanism = o.one_of(
            "auth_mechanism",
            &[
                ("plain", "plain"),
                ("amqplain", "amqplain"),
                ("external", "external"),
            ],
        )?;
        if mechanism == Some("external") && tls.client.is_none() {
            return Err(Error::config(format!(
                "{conn}: auth_mechanism=external logs in with a client certificate: give \
                 tls_cert and tls_key"
            )));
        }
        let base = &with_password(base, o, &conn)?;
        // The AMQP URI's own options go to the client, checked as whole numbers first.
        let mut passed = Vec::new();
        if let Some(m) = mechanism {
            passed.push(format!("auth_mechanism={m}"));
        }
        for name in URI_OPTIONS {
            if let Some(n) = o.int(name, Bounds::new(0u64, u64::from(u32::MAX)))? {
                passed.push(format!("{name}={n}"));
            }
        }
        let uri = if passed.is_empty() {
            base.to_string()
        } else {
            format!("{base}?{}", passed.join("&"))
        };
        let cfg = Self {
            uri: Secret::new(uri),
            display: outbox_core::redact::url(base),
            exchange: exchange.to_string(),
            ack_timeout: o
                .duration("ack_timeout", Bounds::TIMEOUT)?
                .unwrap_or(DEFAULT_ACK_TIMEOUT),
            max_message_size: o
                .size("max_message_size", Bounds::new(1, u64::MAX))?
                .unwrap_or(DEFAULT_MAX_MESSAGE_SIZE),
            connection_name: o
                .non_empty("connection_name")?
                .unwrap_or(DEFAULT_CONNECTION_NAME)
                .to_string(),
            tls,
        };
        // The client's own parser has the last word on host, port and vhost.
        cfg.uri
            .expose()
            .parse::<lapin::uri::AMQPUri>()
            .map_err(|e| {
                Error::config(format!(
                    "sink `{shown}`: not a valid AMQP URI: {}",
                    outbox_core::redact::sanitize(&e)
                ))
            })?;
        Ok(cfg)
    }

    /// The AMQP URI with credentials, for the client only.
    pub(crate) fn uri(&self) -> &str {
        self.uri.expose()
    }

    /// Connects to the broker with the URI, its credentials and, for `amqps://`, the CA and
    /// client certificate given.
    pub(crate) async fn open(
        &self,
        props: lapin::ConnectionProperties,
    ) -> Result<lapin::Connection, lapin::Error> {
        let tls = lapin::tcp::OwnedTLSConfig {
            identity: self.tls.client.as_ref().map(|(cert, key)| {
                lapin::tcp::OwnedIdentity::PKCS8 {
                    pem: cert.clone(),
                    key: key.expose().as_bytes().to_vec(),
                }
            }),
            cert_chain: self.tls.ca.clone(),
        };
        let runtime = lapin::runtime::default_runtime()?;
        lapin::Connection::connect_with_config(self.uri(), props, tls, runtime).await
    }
}

/// `base` with the password of `password_file`/`password_env` in its userinfo (percent-encoded),
/// when one is given; `base` as it is otherwise.
fn with_password(base: &str, o: &QueryOptions, conn: &str) -> Result<String, Error> {
    if !(o.has("password_file") || o.has("password_env")) {
        return Ok(base.to_string());
    }
    let (scheme, rest) = base.split_once("://").unwrap_or(("amqp", base));
    let Some((userinfo, host)) = rest.rsplit_once('@') else {
        return Err(Error::config(format!(
            "{conn}: a password needs a user name: amqps://USER@host?password_file=…"
        )));
    };
    let (user, in_url) = match userinfo.split_once(':') {
        Some((u, p)) => (u, Some(Secret::new(p))),
        None => (userinfo, None),
    };
    let password = tls::password(o, conn, in_url)?.unwrap_or_else(|| Secret::new(""));
    let encoded = percent_encoding::utf8_percent_encode(
        password.expose(),
        percent_encoding::NON_ALPHANUMERIC,
    );
    Ok(format!("{scheme}://{user}:{encoded}@{host}"))
}

/// Checks an exchange name: AMQP 0-9-1 allows letters, digits, `-`, `_`, `.` and `:`, at most
/// 255 bytes; the empty name is the default exchange.
pub(crate) fn valid_exchange(name: &str) -> Result<(), String> {
    if name.len() > MAX_SHORT_STRING {
        return Err(format!(
            "the exchange name is {} bytes long; AMQP allows {MAX_SHORT_STRING}",
            name.len()
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':')))
    {
        return Err(format!(
            "`{}` is not allowed in an exchange name (letters, digits, `-`, `_`, `.`, `:`)",
            c.escape_default()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn parses_url_and_options() {
        let c = AmqpConfig::from_url(
            "amqp://guest:guest@127.0.0.1:5672/%2f?exchange=orders&ack_timeout=250ms&heartbeat=10",
        )
        .unwrap();
        assert_eq!(c.exchange, "orders");
        assert_eq!(c.ack_timeout, Duration::from_millis(250));
        assert_eq!(c.max_message_size, DEFAULT_MAX_MESSAGE_SIZE);
        assert_eq!(
            c.uri(),
            "amqp://guest:guest@127.0.0.1:5672/%2f?heartbeat=10"
        );
        assert_eq!(c.display, "amqp://***@127.0.0.1:5672/%2f");
        let d = AmqpConfig::from_url("amqp://h").unwrap();
        assert_eq!(d.exchange, "");
        assert_eq!(d.connection_name, DEFAULT_CONNECTION_NAME);
        let s =
            AmqpConfig::from_url("amqps://h/v?max_message_size=1KiB&connection_name=me").unwrap();
        assert_eq!(
            (s.max_message_size, s.connection_name.as_str()),
            (1024, "me")
        );
    }

    #[test]
    fn credentials_stay_out_of_debug_and_display() {
        let c = AmqpConfig::from_url("amqp://app:hunter2@127.0.0.1/%2f").unwrap();
        assert!(!format!("{c:?}").contains("hunter2"));
        assert!(!c.display.contains("hunter2"));
        let e = AmqpConfig::from_url("amqp://app:hunter2@h/%2f?bogus=1")
            .unwrap_err()
            .to_string();
        assert!(!e.contains("hunter2"), "{e}");
    }

    #[test]
    fn rejects_bad_urls_and_options_naming_them() {
        assert!(AmqpConfig::from_url("http://x").is_err());
        assert!(AmqpConfig::from_url("amqp://").is_err());
        let e = AmqpConfig::from_url("amqp://x?bogus=1")
            .unwrap_err()
            .to_string();
        assert!(e.contains("`bogus`"), "{e}");
        let e = AmqpConfig::from_url("amqp://x?ack_timeout=soon")
            .unwrap_err()
            .to_string();
        assert!(e.contains("ack_timeout"), "{e}");
        let e = AmqpConfig::from_url("amqp://x?exchange=a/b")
            .unwrap_err()
            .to_string();
        assert!(e.contains("exchange"), "{e}");
        assert!(AmqpConfig::from_url("amqp://x?heartbeat=often").is_err());
    }

    #[test]
    fn exchange_names_follow_amqp() {
        for ok in ["", "orders", "amq.topic", "a-b_c.d:e"] {
            assert!(valid_exchange(ok).is_ok(), "{ok}");
        }
        for bad in ["a b", "a/b", "é", "a*", &"x".repeat(256)] {
            assert!(valid_exchange(bad).is_err(), "{bad}");
        }
    }
}
