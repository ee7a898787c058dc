//! The binlog stream's TLS, from the same URL options the pool (sqlx) takes: `ssl-mode`
//! (`DISABLED`, `PREFERRED` — the default, as the pool's —, `REQUIRED`, `VERIFY_CA`,
//! `VERIFY_IDENTITY`; `sslmode` too), `ssl-ca`, `ssl-cert` and `ssl-key` (`sslca`, `sslcert`,
//! `sslkey` too). mysql_async makes the upgrade itself (the SSLRequest packet after the server's
//! greeting, the TLS handshake, then the login), on rustls and ring, the process's one TLS stack.
//!
//! The modes mean what they mean for the pool: `PREFERRED` upgrades when the server offers TLS
//! and checks nothing (as MySQL's own client); `REQUIRED` insists on TLS and checks nothing;
//! `VERIFY_CA` checks the certificate against `ssl-ca` (without it, the Mozilla roots
//! mysql_async carries, where the pool takes the system's); `VERIFY_IDENTITY` checks the URL's
//! host against it too. mysql_async 0.37 waives a host mismatch under `VERIFY_CA` by matching an
//! error text rustls 0.23 no longer writes, so `VERIFY_CA` checks the host as well: stricter than
//! asked, never looser.
//!
//! The files are read here, at each connection (a rotated certificate is taken at the next
//! reconnection), so a missing one is a configuration error naming the option and the path.
//! The key is a PEM file of any kind rustls signs with (PKCS#8, PKCS#1, SEC1: RSA, ECDSA,
//! Ed25519), as for the pool.

use std::path::Path;

use mysql_async::{ClientIdentity, SslOpts};
use outbox_core::Error;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::PrivateKeyDer;

/// How the binlog connection asks for TLS (the URL's `ssl-mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum SslMode {
    /// Plaintext, even when the server offers TLS.
    Disabled,
    /// TLS when the server offers it, nothing checked; plaintext otherwise.
    Preferred,
    /// TLS or no connection; nothing checked.
    Required,
    /// TLS, the certificate signed by `ssl-ca` (or a public root).
    VerifyCa,
    /// As `VerifyCa`, and the URL's host named in the certificate.
    VerifyIdentity,
}

impl SslMode {
    fn parse(value: &str, shown: &str) -> Result<Self, Error> {
        Ok(match value.to_ascii_lowercase().as_str() {
            "disabled" => Self::Disabled,
            "preferred" => Self::Preferred,
            "required" => Self::Required,
            "verify_ca" => Self::VerifyCa,
            "verify_identity" => Self::VerifyIdentity,
            _ => {
                return Err(Error::config(format!(
                    "database URL `{shown}`: ssl-mode={value} is not one of DISABLED, PREFERRED, \
                     REQUIRED, VERIFY_CA, VERIFY_IDENTITY"
                )))
            }
        })
    }

    /// As the URL spells it, for errors.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Disabled => "DISABLED",
            Self::Preferred => "PREFERRED",
            Self::Required => "REQUIRED",
            Self::VerifyCa => "VERIFY_CA",
            Self::VerifyIdentity => "VERIFY_IDENTITY",
        }
    }
}

/// Where and how the binlog connection goes: the URL for mysql_async (without the pool's
/// options, which it would refuse as unknown) and the TLS settings taken out of it.
#[derive(Debug)]
pub(crate) struct Target {
    /// `mysql://…` with sqlx's own options removed; mysql_async's own are kept.
    pub url: String,
    pub mode: SslMode,
    ca: Option<String>,
    cert: Option<String>,
    key: Option<String>,
}

/// sqlx's options that mysql_async does not know (it refuses a URL with an unknown one): the
/// TLS ones are taken into [`Target`], the rest mean nothing to a binlog stream.
const POOL_ONLY: &[&str] = &[
    "charset",
    "collation",
    "statement-cache-capacity",
    "timezone",
    "time-zone",
];

impl Target {
    /// Reads `url` (`mysql://` or `mariadb://`). `shown` is the URL with its secrets masked.
    pub(crate) fn parse(url: &str, shown: &str) -> Result<Self, Error> {
        let rest = url
            .split_once("://")
            .map(|(_, rest)| rest)
            .ok_or_else(|| Error::config(format!("database URL `{shown}` is not a MySQL URL")))?;
        let (base, query) = rest.split_once('?').unwrap_or((rest, ""));
        let mut kept = Vec::new();
        let mut target = Self {
            url: String::new(),
            mode: SslMode::Preferred,
            ca: None,
            cert: None,
            key: None,
        };
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let value = || decode(v);
            match k {
                "ssl-mode" | "sslmode" => target.mode = SslMode::parse(&value(), shown)?,
                "ssl-ca" | "sslca" => target.ca = Some(value()),
                "ssl-cert" | "sslcert" => target.cert = Some(value()),
                "ssl-key" | "sslkey" => target.key = Some(value()),
                _ if POOL_ONLY.contains(&k) => {}
                _ => kept.push(pair),
            }
        }
        if target.cert.is_some() != target.key.is_some() {
            return Err(Error::config(format!(
                "database URL `{shown}`: ssl-cert and ssl-key go together (a client certificate \
                 needs its key); give both or neither"
            )));
        }
        target.url = if kept.is_empty() {
            format!("mysql://{base}")
        } else {
            format!("mysql://{base}?{}", kept.join("&"))
        };
        Ok(target)
    }

    /// The TLS settings mysql_async takes, `None` for `DISABLED`. Reads the files named (their
    /// errors name the option and the path, never a key's contents).
    pub(crate) fn ssl_opts(&self, shown: &str) -> Result<Option<SslOpts>, Error> {
        if self.mode == SslMode::Disabled {
            return Ok(None);
        }
        let conn = format!("database URL `{shown}`");
        let verify = self.mode >= SslMode::VerifyCa;
        let mut ssl = SslOpts::default()
            .with_danger_accept_invalid_certs(!verify)
            .with_danger_skip_domain_validation(self.mode != SslMode::VerifyIdentity);
        if let Some(ca) = &self.ca {
            // The CA named is the one trusted (as MySQL's client does), not the public roots too.
            let pem = outbox_core::tls::read_file(&conn, "ssl-ca", Path::new(ca))?;
            ssl = ssl
                .with_root_certs(vec![pem.into()])
                .with_disable_built_in_roots(true);
        }
        if let (Some(cert), Some(key)) = (&self.cert, &self.key) {
            let chain = outbox_core::tls::read_file(&conn, "ssl-cert", Path::new(cert))?;
            let key = client_key(&conn, Path::new(key))?;
            ssl = ssl.with_client_identity(Some(ClientIdentity::new(chain.into(), key.into())));
        }
        Ok(Some(ssl))
    }
}

/// The client key at `path`, checked to be a PEM private key (mysql_async would read a file
/// that is not PEM text as PKCS#1 DER and fail later, with less to say).
fn client_key(conn: &str, path: &Path) -> Result<Vec<u8>, Error> {
    let bytes = outbox_core::tls::read_file(conn, "ssl-key", path)?;
    if PrivateKeyDer::from_pem_slice(&bytes).is_err() {
        return Err(Error::config(format!(
            "{conn}: ssl-key {} holds no PEM private key (PKCS#8, PKCS#1 or SEC1)",
            path.display()
        )));
    }
    Ok(bytes)
}

/// Percent-decodes a URL query value (a path with a space or a `%`).
fn decode(v: &str) -> String {
    let bytes = v.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| char::from(b).to_digit(16);
        match (bytes[i], bytes.get(i + 1), bytes.get(i + 2)) {
            (b'%', Some(&h), Some(&l)) if hex(h).is_some() && hex(l).is_some() => {
                let (h, l) = (hex(h).unwrap_or(0), hex(l).unwrap_or(0));
                out.push(u8::try_from(h * 16 + l).unwrap_or(b'?'));
                i += 3;
            }
            (b'+', _, _) => {
                out.push(b' ');
                i += 1;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn target(url: &str) -> Target {
        Target::parse(url, "shown").unwrap()
    }

    #[test]
    fn the_pools_tls_options_are_taken_out_and_the_rest_kept() {
        let t = target(
            "mysql://u:p@h:3312/db?ssl-mode=verify_identity&ssl-ca=/a%20b/ca.pem\
             &ssl-cert=/c.pem&ssl-key=/c.key&prefer_socket=false&charset=utf8mb4",
        );
        assert_eq!(t.mode, SslMode::VerifyIdentity);
        assert_eq!(t.ca.as_deref(), Some("/a b/ca.pem"));
        assert_eq!(t.cert.as_deref(), Some("/c.pem"));
        assert_eq!(t.key.as_deref(), Some("/c.key"));
        assert_eq!(t.url, "mysql://u:p@h:3312/db?prefer_socket=false");
        assert_eq!(target("mariadb://h/db").url, "mysql://h/db");
    }

    #[test]
    fn preferred_is_the_default_as_for_the_pool_and_every_mode_is_read() {
        assert_eq!(target("mysql://h/db").mode, SslMode::Preferred);
        for (v, m) in [
            ("DISABLED", SslMode::Disabled),
            ("preferred", SslMode::Preferred),
            ("REQUIRED", SslMode::Required),
            ("VERIFY_CA", SslMode::VerifyCa),
            ("VERIFY_IDENTITY", SslMode::VerifyIdentity),
        ] {
            assert_eq!(target(&format!("mysql://h/db?sslmode={v}")).mode, m);
        }
        assert!(target("mysql://h/db?ssl-mode=DISABLED")
            .ssl_opts("shown")
            .unwrap()
            .is_none());
    }

    #[test]
    fn a_bad_mode_or_a_certificate_without_its_key_is_refused() {
        let e = Target::parse("mysql://h/db?ssl-mode=verify-full", "shown").unwrap_err();
        assert!(e.to_string().contains("VERIFY_IDENTITY"), "{e}");
        let e = Target::parse("mysql://h/db?ssl-cert=/c.pem", "shown").unwrap_err();
        assert!(e.to_string().contains("go together"), "{e}");
    }

    #[test]
    fn a_missing_file_names_the_option_and_the_path() {
        let t = target("mysql://h/db?ssl-mode=VERIFY_CA&ssl-ca=/nonexistent/ca.pem");
        let e = t.ssl_opts("shown").unwrap_err().to_string();
        assert!(e.contains("ssl-ca /nonexistent/ca.pem"), "{e}");
    }

    #[test]
    fn a_key_file_that_is_no_pem_key_is_refused_by_name() {
        let dir = std::env::temp_dir().join(format!("outbox-tls-{}", fastrand::u64(..)));
        std::fs::create_dir_all(&dir).unwrap();
        let cert = dir.join("c.pem");
        let key = dir.join("c.key");
        std::fs::write(
            &cert,
            "-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        std::fs::write(&key, "not a key").unwrap();
        let t = target(&format!(
            "mysql://h/db?ssl-mode=REQUIRED&ssl-cert={}&ssl-key={}",
            cert.display(),
            key.display()
        ));
        let e = t.ssl_opts("shown").unwrap_err().to_string();
        assert!(e.contains("holds no PEM private key"), "{e}");
        assert!(e.contains("c.key"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
