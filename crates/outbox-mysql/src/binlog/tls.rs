//! The binlog stream's TLS, from the same URL options the pool (sqlx) takes: `ssl-mode`
//! (`DISABLED`, `PREFERRED` — the default, as the pool's —, `REQUIRED`, `VERIFY_CA`,
//! `VERIFY_IDENTITY`; `sslmode` too), `ssl-ca`, `ssl-cert` and `ssl-key` (`sslca`, `sslcert`,
//! `sslkey` too). mysql_async makes the upgrade itself (the SSLRequest packet after the server's
//! greeting, the TLS handshake, then the login), on rustls and ring, the process's one TLS stack.
//!
//! The modes mean what they mean for the pool: `PREFERRED` upgrades when the server offers TLS
//! and checks nothing (as MySQL's own client); `REQUIRED` insists on TLS and checks nothing;
//! `VERIFY_CA` checks the certificate against `ssl-ca` (the Mozilla roots without it);
//! `VERIFY_IDENTITY` checks the URL's host against it too.
//!
//! The files are read here, at each connection (a rotated certificate is taken at the next
//! reconnection), so a missing one is a configuration error naming the option and the path.
//! mysql_async loads RSA client keys only: a PKCS#8 RSA key is handed over as PKCS#1, and an EC
//! or Ed25519 key is refused with that reason (the pool takes every kind).

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
            let key_der = rsa_key(&conn, Path::new(key))?;
            ssl = ssl.with_client_identity(Some(ClientIdentity::new(chain.into(), key_der.into())));
        }
        Ok(Some(ssl))
    }
}

/// The client key at `path` as PKCS#1 DER, the one form mysql_async's rustls loader takes
/// (DER that is not UTF-8 is read as PKCS#1).
fn rsa_key(conn: &str, path: &Path) -> Result<Vec<u8>, Error> {
    let bytes = outbox_core::tls::read_file(conn, "ssl-key", path)?;
    let shown = path.display();
    let key = PrivateKeyDer::from_pem_slice(&bytes)
        .or_else(|_| PrivateKeyDer::try_from(bytes.as_slice()).map(|k| k.clone_key()))
        .map_err(|_| {
            Error::config(format!(
                "{conn}: ssl-key {shown} holds no private key (PEM or DER)"
            ))
        })?;
    let not_rsa = || {
        Error::config(format!(
            "{conn}: ssl-key {shown} is not an RSA key: the binlog stream's driver (mysql_async) \
             loads RSA client keys only; give the binlog's user an RSA client certificate (the \
             pool takes EC keys too)"
        ))
    };
    match key {
        PrivateKeyDer::Pkcs1(k) => Ok(k.secret_pkcs1_der().to_vec()),
        PrivateKeyDer::Pkcs8(k) => pkcs1_of_pkcs8(k.secret_pkcs8_der()).ok_or_else(not_rsa),
        _ => Err(not_rsa()),
    }
}

/// The DER OID of rsaEncryption (1.2.840.113549.1.1.1), as a PKCS#8 key's algorithm names it.
const RSA_ENCRYPTION: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01];

/// The PKCS#1 key a PKCS#8 `PrivateKeyInfo` wraps, when its algorithm is RSA:
/// `SEQUENCE { INTEGER version, SEQUENCE { OID, params }, OCTET STRING pkcs1, … }`.
fn pkcs1_of_pkcs8(der: &[u8]) -> Option<Vec<u8>> {
    let (0x30, info, _) = tlv(der)? else {
        return None;
    };
    let (0x02, _, rest) = tlv(info)? else {
        return None;
    };
    let (0x30, algorithm, rest) = tlv(rest)? else {
        return None;
    };
    let (0x06, oid, _) = tlv(algorithm)? else {
        return None;
    };
    if oid != RSA_ENCRYPTION {
        return None;
    }
    let (0x04, pkcs1, _) = tlv(rest)? else {
        return None;
    };
    Some(pkcs1.to_vec())
}

/// One DER tag-length-value: its tag, its contents and what follows it.
fn tlv(der: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = der.split_first()?;
    let (&first, mut rest) = rest.split_first()?;
    let len = if first < 0x80 {
        usize::from(first)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let (bytes, after) = rest.split_at(n);
        rest = after;
        bytes.iter().fold(0usize, |l, &b| (l << 8) | usize::from(b))
    };
    if rest.len() < len {
        return None;
    }
    let (value, after) = rest.split_at(len);
    Some((tag, value, after))
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
    fn der_is_walked_and_a_non_rsa_pkcs8_is_refused() {
        // SEQUENCE { INTEGER 0, SEQUENCE { OID rsaEncryption, NULL }, OCTET STRING 01 02 }
        let mut alg = vec![0x06, 0x09];
        alg.extend_from_slice(RSA_ENCRYPTION);
        alg.extend_from_slice(&[0x05, 0x00]);
        let mut body = vec![0x02, 0x01, 0x00, 0x30, u8::try_from(alg.len()).unwrap()];
        body.extend_from_slice(&alg);
        body.extend_from_slice(&[0x04, 0x02, 0x01, 0x02]);
        let mut der = vec![0x30, u8::try_from(body.len()).unwrap()];
        der.extend_from_slice(&body);
        assert_eq!(pkcs1_of_pkcs8(&der), Some(vec![0x01, 0x02]));
        // The same with id-ecPublicKey's first byte changed: not RSA.
        let at = der.iter().position(|&b| b == 0x2a).unwrap();
        der[at] = 0x2b;
        assert_eq!(pkcs1_of_pkcs8(&der), None);
        assert_eq!(pkcs1_of_pkcs8(&[0x30, 0x85]), None);
    }
}
