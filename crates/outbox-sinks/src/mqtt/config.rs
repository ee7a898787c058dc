//! Configuration of the MQTT sink: the URL, its options and their defaults.

use std::time::Duration;

use outbox_core::options::{Bounds, QueryOptions, Role};
use outbox_core::tls::{self, TlsOptions};
use outbox_core::{Error, Secret};

/// Default wait for the PUBACKs of one call.
pub const DEFAULT_ACK_TIMEOUT: Duration = Duration::from_secs(5);
/// Default largest payload sent: 256 MiB, the most an MQTT packet can carry (the broker may
/// announce less in its CONNACK, and then that is the limit).
pub const DEFAULT_MAX_MESSAGE_SIZE: u64 = 256 << 20;
/// Default keep-alive: how often the client pings an idle connection.
pub const DEFAULT_KEEP_ALIVE: Duration = Duration::from_secs(30);
const DEFAULT_PORT: u16 = 1883;
const DEFAULT_TLS_PORT: u16 = 8883;

/// Options this sink reads from the URL's query: its own, TLS and the password.
pub const OPTIONS: &[&str] = &[
    "client_id",
    "ack_timeout",
    "max_message_size",
    "keep_alive",
    "tls_ca",
    "tls_cert",
    "tls_key",
    "password_file",
    "password_env",
];

/// Where and how to publish over MQTT v5.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MqttConfig {
    /// Broker host.
    pub host: String,
    /// Broker port (1883 unless given).
    pub port: u16,
    /// User name and password from the URL.
    pub credentials: Option<(String, Secret)>,
    /// Client id; `None`: `outbox-relay-<random>`, unique per sink (two clients with one id
    /// disconnect each other).
    pub client_id: Option<String>,
    /// Longest wait for the PUBACKs of one call (also bounds connecting).
    pub ack_timeout: Duration,
    /// Largest payload sent; larger ones are invalid messages.
    pub max_message_size: u64,
    /// Keep-alive interval.
    pub keep_alive: Duration,
    /// The URL with its credentials masked, for logs and errors.
    pub display: String,
    /// `Some` for `mqtts://`: the CA and client certificate, read when the URL was parsed
    /// (`None` of each: the system's roots, no client certificate).
    pub tls: Option<MqttTls>,
}

/// The TLS material of an `mqtts://` connection.
#[derive(Clone, PartialEq, Eq)]
pub struct MqttTls {
    /// The CA bundle (PEM); `None`: the system's roots.
    pub ca: Option<Vec<u8>>,
    /// The client certificate (PEM) and its key.
    pub client: Option<(Vec<u8>, Secret)>,
}

impl std::fmt::Debug for MqttTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MqttTls")
            .field("ca", &self.ca.is_some())
            .field("client_certificate", &self.client.is_some())
            .finish()
    }
}

impl MqttConfig {
    /// Parses `mqtt[s]://[user:pass@]host[:port][?client_id=…&ack_timeout=5s&max_message_size=256MiB&keep_alive=30s&tls_ca=…&tls_cert=…&tls_key=…&password_file=…]`.
    /// Any other option is a config error naming it.
    pub fn from_url(url: &str) -> Result<Self, Error> {
        let (base, o) = QueryOptions::from_url(Role::Sink, url, OPTIONS)?;
        Self::from_options(base, &o)
    }

    /// The configuration of the broker at `base` (a URL without its query) with the options
    /// `o` parsed by the caller: an inbox source takes these options beside its own, and its
    /// errors then say "source option".
    pub fn from_options(base: &str, o: &QueryOptions) -> Result<Self, Error> {
        let shown = outbox_core::redact::url(base);
        let bad = || {
            Error::config(format!(
                "`{shown}`: expected mqtt[s]://[user:pass@]host[:port]"
            ))
        };
        let secure = base.starts_with("mqtts://");
        let rest = base
            .strip_prefix("mqtt://")
            .or_else(|| base.strip_prefix("mqtts://"))
            .ok_or_else(bad)?;
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        let (userinfo, hostport) = match rest.rsplit_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, rest),
        };
        if hostport.contains('/') {
            return Err(bad());
        }
        let (host, port) = match hostport.rsplit_once(':') {
            Some((h, p)) => (h, p.parse::<u16>().map_err(|_| bad())?),
            None => (
                hostport,
                if secure {
                    DEFAULT_TLS_PORT
                } else {
                    DEFAULT_PORT
                },
            ),
        };
        if host.is_empty() {
            return Err(bad());
        }
        let role = match o.role() {
            Role::Sink => "sink",
            Role::Source => "source",
        };
        let conn = format!("{role} {shown}");
        let mut credentials = userinfo.map(|u| match u.split_once(':') {
            Some((user, pass)) => (user.to_string(), Secret::new(pass)),
            None => (u.to_string(), Secret::new("")),
        });
        if o.has("password_file") || o.has("password_env") {
            let Some((user, in_url)) = credentials.take() else {
                return Err(Error::config(format!(
                    "{conn}: a password needs a user name: mqtt[s]://USER@host?password_file=…"
                )));
            };
            let in_url = Some(in_url).filter(|p| !p.expose().is_empty());
            credentials = tls::password(o, &conn, in_url)?.map(|p| (user, p));
        }
        let tls = TlsOptions::from_query(o, &conn)?;
        if tls.any() && !secure {
            return Err(Error::config(format!(
                "{conn}: tls_ca, tls_cert and tls_key need TLS: write mqtts://"
            )));
        }
        if tls.client.is_some() && tls.ca.is_none() {
            return Err(Error::config(format!(
                "{conn}: a client certificate (tls_cert, tls_key) needs tls_ca, the CA that \
                 signed the broker's certificate"
            )));
        }
        let client_id = o.non_empty("client_id")?;
        if let Some(id) = client_id.filter(|id| id.len() > 65_535) {
            return Err(o.invalid("client_id", id, "at most 65,535 bytes"));
        }
        Ok(Self {
            host: host.to_string(),
            port,
            credentials,
            client_id: client_id.map(str::to_string),
            ack_timeout: o
                .duration("ack_timeout", Bounds::TIMEOUT)?
                .unwrap_or(DEFAULT_ACK_TIMEOUT),
            max_message_size: o
                .size("max_message_size", Bounds::new(1, u64::MAX))?
                .unwrap_or(DEFAULT_MAX_MESSAGE_SIZE),
            // MQTT keeps it in whole seconds, up to 65,535.
            keep_alive: o
                .whole_seconds(
                    "keep_alive",
                    Bounds::new(Duration::from_secs(1), Duration::from_secs(65_535)),
                )?
                .unwrap_or(DEFAULT_KEEP_ALIVE),
            display: outbox_core::redact::url(base),
            tls: if secure {
                Some(MqttTls {
                    ca: tls.ca_pem(&conn)?,
                    client: tls.client_pem(&conn)?,
                })
            } else {
                None
            },
        })
    }

    /// Client options for `client_id`: MQTT v5, the credentials, the keep-alive, a connect
    /// timeout of at least a second, and `max_packet` as the largest packet accepted.
    /// With `mqtts://`, TLS with the CA and client certificate given.
    pub fn options(&self, client_id: String, max_packet: u32) -> rumqttc::v5::MqttOptions {
        let mut o = rumqttc::v5::MqttOptions::new(client_id, self.host.clone(), self.port);
        o.set_keep_alive(self.keep_alive)
            .set_connection_timeout(self.ack_timeout.as_secs().max(1))
            .set_max_packet_size(Some(max_packet));
        // Every call waits for the PUBACK of its last publish, so no small packet may sit in a
        // socket buffer waiting for a delayed ACK (about 40 ms each time). Nagle's algorithm is
        // the client's default; off here. The broker's side is the broker's setting: Mosquitto
        // leaves it on unless `set_tcp_nodelay true`, which measured as the larger stall
        // (docs/sinks.md).
        let mut net = rumqttc::NetworkOptions::new();
        net.set_tcp_nodelay(true);
        o.set_network_options(net);
        if let Some((user, pass)) = &self.credentials {
            o.set_credentials(user.clone(), pass.expose().to_string());
        }
        if let Some(tls) = &self.tls {
            crate::install_tls_provider();
            let configuration = match &tls.ca {
                None => rumqttc::TlsConfiguration::default(),
                Some(ca) => rumqttc::TlsConfiguration::Simple {
                    ca: ca.clone(),
                    alpn: None,
                    client_auth: tls
                        .client
                        .as_ref()
                        .map(|(cert, key)| (cert.clone(), key.expose().as_bytes().to_vec())),
                },
            };
            o.set_transport(rumqttc::Transport::tls_with_config(configuration));
        }
        o
    }

    /// `client_id`, or `prefix` and a random suffix.
    pub(crate) fn client_id_or(&self, prefix: &str) -> String {
        self.client_id
            .clone()
            .unwrap_or_else(|| format!("{prefix}-{:012x}", fastrand::u64(..) & 0xffff_ffff_ffff))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn parses_url_and_options() {
        let c = MqttConfig::from_url(
            "mqtt://app:hunter2@127.0.0.1:1884?client_id=relay-1&ack_timeout=250ms&keep_alive=10s",
        )
        .unwrap();
        assert_eq!((c.host.as_str(), c.port), ("127.0.0.1", 1884));
        assert_eq!(c.client_id.as_deref(), Some("relay-1"));
        assert_eq!(c.ack_timeout, Duration::from_millis(250));
        assert_eq!(c.keep_alive, Duration::from_secs(10));
        assert_eq!(c.credentials.as_ref().unwrap().0, "app");
        assert!(!format!("{c:?}").contains("hunter2"));
        assert!(!c.display.contains("hunter2"));
        let d = MqttConfig::from_url("mqtt://broker").unwrap();
        assert_eq!((d.port, d.client_id.clone()), (1883, None));
        assert!(d.client_id_or("outbox-relay").starts_with("outbox-relay-"));
    }

    #[test]
    fn rejects_bad_urls_and_options_naming_them() {
        for bad in [
            "http://x",
            "mqtt://",
            "mqtt://h:port",
            "mqtt://h/topic",
            "ws://h",
        ] {
            assert!(MqttConfig::from_url(bad).is_err(), "{bad}");
        }
        let e = MqttConfig::from_url("mqtt://h?qos=2")
            .unwrap_err()
            .to_string();
        assert!(e.contains("`qos`"), "{e}");
        let e = MqttConfig::from_url("mqtt://u:hunter2@h?bogus=1")
            .unwrap_err()
            .to_string();
        assert!(!e.contains("hunter2"), "{e}");
        assert!(MqttConfig::from_url("mqtt://h?keep_alive=10ms").is_err());
    }
}
