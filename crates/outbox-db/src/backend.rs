//! Which backend a database URL names, decided from its scheme alone (no I/O).

use outbox_core::{Error, Result};

/// The schemes [`Backend::of`] accepts, as shown in error messages.
pub const ACCEPTED_SCHEMES: &str =
    "postgres://…, postgresql://…, mysql://…, mariadb://… or sqlite://path";

/// A database engine the outbox runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Backend {
    /// PostgreSQL: `postgres://…` or `postgresql://…`; the outbox lives in one schema.
    Postgres,
    /// SQLite: `sqlite://path` or `sqlite:path`; `sqlite://` alone is `./outbox.db`
    /// ([`outbox_sqlite::DEFAULT_PATH`]). The outbox is the whole file.
    Sqlite,
    /// MySQL 8.0.29+ or MariaDB 10.6+: `mysql://…` or `mariadb://…`; the outbox lives in one
    /// database (MySQL's "schema").
    Mysql,
}

impl Backend {
    /// The backend `url` names. Schemes are matched without regard to case (RFC 3986).
    ///
    /// Fails with [`ErrorKind::Config`](outbox_core::ErrorKind::Config), naming the URL without
    /// its password and the accepted schemes, when the scheme is missing or unsupported.
    pub fn of(url: &str) -> Result<Self> {
        let Some((scheme, _)) = url.split_once(':') else {
            return Err(Error::config(format!(
                "database URL `{}` has no scheme; use {ACCEPTED_SCHEMES}",
                shown(url)
            )));
        };
        match scheme.to_ascii_lowercase().as_str() {
            "postgres" | "postgresql" => Ok(Self::Postgres),
            "sqlite" => Ok(Self::Sqlite),
            "mysql" | "mariadb" => Ok(Self::Mysql),
            other => Err(Error::config(format!(
                "database URL `{}`: unsupported scheme `{other}`; use {ACCEPTED_SCHEMES}",
                shown(url)
            ))),
        }
    }

    /// A short name for messages: `PostgreSQL`, `SQLite`, `MySQL`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Postgres => "PostgreSQL",
            Self::Sqlite => "SQLite",
            Self::Mysql => "MySQL",
        }
    }
}

/// `url` safe to print. [`outbox_core::redact::url`] masks `scheme://user:secret@host`; a URL
/// typed without `//` (`user:secret@host/db`, a slip this function exists to catch) has its
/// userinfo masked too.
pub(crate) fn shown(url: &str) -> String {
    if !url.contains("://") {
        if let (Some(colon), Some(at)) = (url.find(':'), url.rfind('@')) {
            if colon < at {
                return outbox_core::redact::url(&format!("{}:***{}", &url[..colon], &url[at..]));
            }
        }
    }
    outbox_core::redact::url(url)
}

#[cfg(test)]
mod tests {
    use outbox_core::ErrorKind;

    use super::*;

    #[test]
    fn postgres_schemes_name_postgres_in_any_case() {
        for url in [
            "postgres://app@db/x",
            "postgresql://app:pw@db:5432/x?sslmode=require",
            "POSTGRES://db/x",
        ] {
            assert_eq!(Backend::of(url).ok(), Some(Backend::Postgres), "{url}");
        }
    }

    #[test]
    fn sqlite_urls_with_or_without_a_path_name_sqlite() {
        for url in [
            "sqlite://",
            "sqlite:",
            "sqlite://./x.db",
            "sqlite:x.db",
            "sqlite:///tmp/x.db",
        ] {
            assert_eq!(Backend::of(url).ok(), Some(Backend::Sqlite), "{url}");
        }
    }

    #[test]
    fn unsupported_scheme_is_a_config_error_naming_the_url_and_the_accepted_schemes() {
        let e = Backend::of("oracle://scott:tiger@db/orcl").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Config);
        let text = e.to_string();
        assert!(text.contains("oracle"), "{text}");
        assert!(text.contains(ACCEPTED_SCHEMES), "{text}");
        assert!(!text.contains("tiger"), "password leaked: {text}");
    }

    #[test]
    fn mysql_and_mariadb_schemes_name_mysql() {
        for url in ["mysql://app:pw@db/x", "mariadb://db:3306/x", "MySQL://db/x"] {
            assert_eq!(Backend::of(url).ok(), Some(Backend::Mysql), "{url}");
        }
    }

    #[test]
    fn a_url_without_a_scheme_is_a_config_error() {
        let e = Backend::of("/var/lib/outbox.db").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Config);
        assert!(e.to_string().contains("no scheme"), "{e}");
    }

    #[test]
    fn a_url_typed_without_slashes_does_not_echo_its_password() {
        let e = Backend::of("app:hunter2@db/x").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Config);
        assert!(!e.to_string().contains("hunter2"), "password leaked: {e}");
        assert!(e.to_string().contains("app:***@db/x"), "{e}");
    }
}
