//! The one TLS and credentials grammar of every broker URL (sinks and inbox sources alike), read
//! from the URL's query by [`crate::options::QueryOptions`]:
//!
//! - `tls_ca=/path/ca.pem`: the CA bundle (PEM) that signs the server's certificate, instead of
//!   the system's roots.
//! - `tls_cert=/path/client.pem` and `tls_key=/path/client.key`: a client certificate and its
//!   key (PEM) for mutual TLS; one without the other is refused.
//! - The server's name is always checked against its certificate: there is no option to turn
//!   that off (a relay that accepts any certificate hands its credentials to whoever answers).
//!
//! Secrets never have to sit in the URL: `password_file=`/`password_env=` (and `token_file=`,
//! `token_env=` for brokers that take a token) read them from a file (trailing newline dropped)
//! or an environment variable. The files named here are read when the URL is parsed, so a
//! missing or unreadable file is one configuration error at start-up naming the connection, the
//! option and the cause, never the secret.

use std::path::{Path, PathBuf};

use crate::options::QueryOptions;
use crate::{Error, Secret};

/// The TLS options every URL that speaks TLS accepts.
pub const TLS_OPTIONS: &[&str] = &["tls_ca", "tls_cert", "tls_key"];

/// The options that take a password from a file or the environment.
pub const PASSWORD_OPTIONS: &[&str] = &["password_file", "password_env"];

/// The options that take a token from a file or the environment.
pub const TOKEN_OPTIONS: &[&str] = &["token_file", "token_env"];

/// TLS settings from a URL: where the CA bundle and the client certificate are. The files are
/// checked to be readable PEM when parsed; their contents are read again by whoever connects
/// (a rotated certificate is picked up at the next connection).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsOptions {
    /// CA bundle (PEM) to verify the server with; `None`: the system's roots.
    pub ca: Option<PathBuf>,
    /// Client certificate chain and private key (PEM), for mutual TLS.
    pub client: Option<ClientCert>,
}

/// A client certificate (chain) and its private key, both PEM files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientCert {
    /// The certificate chain, leaf first.
    pub cert: PathBuf,
    /// The private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
}

impl TlsOptions {
    /// Reads `tls_ca`, `tls_cert` and `tls_key` from `o`. `conn` names the connection in errors
    /// (a URL with its credentials masked). Refuses a certificate without its key (or the
    /// reverse) and a file that cannot be read or holds no PEM block.
    pub fn from_query(o: &QueryOptions, conn: &str) -> Result<Self, Error> {
        let ca = o.non_empty("tls_ca")?.map(PathBuf::from);
        if let Some(ca) = &ca {
            check_pem(conn, "tls_ca", ca, "CERTIFICATE")?;
        }
        let client = match (o.non_empty("tls_cert")?, o.non_empty("tls_key")?) {
            (None, None) => None,
            (Some(cert), Some(key)) => {
                let c = ClientCert {
                    cert: cert.into(),
                    key: key.into(),
                };
                check_pem(conn, "tls_cert", &c.cert, "CERTIFICATE")?;
                check_pem(conn, "tls_key", &c.key, "PRIVATE KEY")?;
                Some(c)
            }
            (Some(_), None) | (None, Some(_)) => {
                return Err(Error::config(format!(
                    "{conn}: tls_cert and tls_key go together (a client certificate needs its \
                     key); give both or neither"
                )))
            }
        };
        Ok(Self { ca, client })
    }

    /// Whether any TLS option was given (a scheme without its own TLS form, `kafka://`, then
    /// speaks TLS).
    pub fn any(&self) -> bool {
        self.ca.is_some() || self.client.is_some()
    }

    /// The CA bundle's bytes, if one was given.
    pub fn ca_pem(&self, conn: &str) -> Result<Option<Vec<u8>>, Error> {
        self.ca
            .as_deref()
            .map(|p| read_file(conn, "tls_ca", p))
            .transpose()
    }

    /// The client certificate's and key's bytes, if given. The key's bytes are a secret: hand
    /// them to the client library only.
    pub fn client_pem(&self, conn: &str) -> Result<Option<(Vec<u8>, Secret)>, Error> {
        let Some(c) = &self.client else {
            return Ok(None);
        };
        let cert = read_file(conn, "tls_cert", &c.cert)?;
        let key = read_file(conn, "tls_key", &c.key)?;
        let key = String::from_utf8(key).map_err(|_| {
            Error::config(format!(
                "{conn}: tls_key {} is not a PEM text file",
                c.key.display()
            ))
        })?;
        Ok(Some((cert, Secret::new(key))))
    }
}

/// The password of a connection: `password_file=` or `password_env=` when given (at most one),
/// else `in_url`, the URL's own. Errors name the connection, the option and the file or
/// variable, never the secret.
pub fn password(
    o: &QueryOptions,
    conn: &str,
    in_url: Option<Secret>,
) -> Result<Option<Secret>, Error> {
    secret_from(o, conn, "password", in_url)
}

/// The token of a connection: `token_file=` or `token_env=`, else `in_url`.
pub fn token(
    o: &QueryOptions,
    conn: &str,
    in_url: Option<Secret>,
) -> Result<Option<Secret>, Error> {
    secret_from(o, conn, "token", in_url)
}

/// A secret called `what` from `{what}_file` or `{what}_env` (not both, and not both with one
/// in the URL), else `in_url`.
pub fn secret_from(
    o: &QueryOptions,
    conn: &str,
    what: &str,
    in_url: Option<Secret>,
) -> Result<Option<Secret>, Error> {
    let file_key = format!("{what}_file");
    let env_key = format!("{what}_env");
    let file = o.non_empty(&file_key)?;
    let env = o.non_empty(&env_key)?;
    let given =
        usize::from(file.is_some()) + usize::from(env.is_some()) + usize::from(in_url.is_some());
    if given > 1 {
        return Err(Error::config(format!(
            "{conn}: give the {what} once: in the URL, {file_key} or {env_key}, not several"
        )));
    }
    if let Some(path) = file {
        let bytes = read_file(conn, &file_key, Path::new(path))?;
        let text = String::from_utf8(bytes)
            .map_err(|_| Error::config(format!("{conn}: {file_key} {path} is not UTF-8 text")))?;
        let value = text.trim_end_matches(['\n', '\r']);
        if value.is_empty() {
            return Err(Error::config(format!("{conn}: {file_key} {path} is empty")));
        }
        return Ok(Some(Secret::new(value)));
    }
    if let Some(name) = env {
        return match std::env::var(name) {
            Ok(v) if !v.is_empty() => Ok(Some(Secret::new(v))),
            Ok(_) => Err(Error::config(format!(
                "{conn}: {env_key}: the environment variable {name} is empty"
            ))),
            Err(_) => Err(Error::config(format!(
                "{conn}: {env_key}: the environment variable {name} is not set"
            ))),
        };
    }
    Ok(in_url)
}

/// Reads a file an option names; the error names the connection, the option, the path and the
/// cause (never the contents).
pub fn read_file(conn: &str, option: &str, path: &Path) -> Result<Vec<u8>, Error> {
    std::fs::read(path).map_err(|e| {
        Error::config(format!(
            "{conn}: {option} {} cannot be read: {e}",
            path.display()
        ))
    })
}

/// Checks that `path` is readable and holds a PEM block whose label ends with `label`
/// (`CERTIFICATE`, `PRIVATE KEY` for every kind of key).
fn check_pem(conn: &str, option: &str, path: &Path, label: &str) -> Result<(), Error> {
    let bytes = read_file(conn, option, path)?;
    let text = String::from_utf8_lossy(&bytes);
    let found = text.lines().any(|l| {
        l.strip_prefix("-----BEGIN ")
            .and_then(|rest| rest.strip_suffix("-----"))
            .is_some_and(|l| l.ends_with(label))
    });
    if found {
        Ok(())
    } else {
        Err(Error::config(format!(
            "{conn}: {option} {} holds no PEM {label} block",
            path.display()
        )))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::options::Role;

    fn opts(query: &str) -> QueryOptions {
        let known: Vec<&str> = TLS_OPTIONS
            .iter()
            .chain(PASSWORD_OPTIONS)
            .chain(TOKEN_OPTIONS)
            .copied()
            .collect();
        QueryOptions::parse(Role::Sink, "x", query, &known).unwrap()
    }

    fn temp(name: &str, body: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("outbox-tls-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join(name);
        std::fs::write(&p, body).unwrap();
        p
    }

    #[test]
    fn tls_files_are_checked_when_parsed() {
        let ca = temp(
            "ca.pem",
            "-----BEGIN CERTIFICATE-----\nAA==\n-----END CERTIFICATE-----\n",
        );
        let key = temp(
            "k.pem",
            "-----BEGIN EC PRIVATE KEY-----\nAA==\n-----END EC PRIVATE KEY-----\n",
        );
        let t = TlsOptions::from_query(
            &opts(&format!(
                "tls_ca={}&tls_cert={}&tls_key={}",
                ca.display(),
                ca.display(),
                key.display()
            )),
            "sink x://h",
        )
        .unwrap();
        assert!(t.any() && t.client.is_some());
        assert!(!TlsOptions::from_query(&opts(""), "c").unwrap().any());
        let e = TlsOptions::from_query(&opts("tls_ca=/nonexistent/ca.pem"), "sink x://h")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("sink x://h: tls_ca /nonexistent/ca.pem cannot be read"),
            "{e}"
        );
        let e = TlsOptions::from_query(&opts(&format!("tls_cert={}", ca.display())), "c")
            .unwrap_err()
            .to_string();
        assert!(e.contains("go together"), "{e}");
        let e = TlsOptions::from_query(&opts(&format!("tls_ca={}", key.display())), "c")
            .unwrap_err()
            .to_string();
        assert!(e.contains("no PEM CERTIFICATE"), "{e}");
    }

    #[test]
    fn secrets_come_from_a_file_or_the_environment_and_never_show() {
        let f = temp("pw", "hunter2\n");
        let p = password(&opts(&format!("password_file={}", f.display())), "c", None)
            .unwrap()
            .unwrap();
        assert_eq!(p.expose(), "hunter2");
        std::env::set_var("OUTBOX_TLS_UNIT_TOKEN", "s3cret-token");
        let t = token(&opts("token_env=OUTBOX_TLS_UNIT_TOKEN"), "c", None)
            .unwrap()
            .unwrap();
        assert_eq!(t.expose(), "s3cret-token");
        let e = token(
            &opts("token_env=OUTBOX_TLS_UNIT_SURELY_UNSET"),
            "sink nats://h",
            None,
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            e,
            "sink nats://h: token_env: the environment variable OUTBOX_TLS_UNIT_SURELY_UNSET is not set"
        );
        let e = password(&opts("password_file=/nonexistent/pw"), "c", None)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("password_file /nonexistent/pw cannot be read"),
            "{e}"
        );
        let e = password(
            &opts(&format!("password_file={}", f.display())),
            "c",
            Some(Secret::new("inurl")),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("not several") && !e.contains("hunter2") && !e.contains("inurl"),
            "{e}"
        );
        assert_eq!(
            password(&opts(""), "c", Some(Secret::new("inurl"))).unwrap(),
            Some(Secret::new("inurl"))
        );
    }
}
