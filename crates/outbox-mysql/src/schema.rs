//! Validated database names: the only text ever spliced into SQL.

use outbox_core::{Error, Result};

/// The MySQL database (MySQL's "schema") that holds the outbox tables, checked to be a plain
/// lower-case identifier (`[a-z_][a-z0-9_]*`, at most 64 characters, MySQL's limit), so it can
/// be written into SQL unquoted.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Schema(String);

impl Schema {
    /// Validates `name`.
    pub fn new(name: &str) -> Result<Self> {
        if outbox_core::identifier::is_plain(name, 64) {
            Ok(Self(name.to_string()))
        } else {
            Err(Error::config(format!(
                "database `{name}` is not a plain identifier: use lower-case letters, digits \
                 and `_`, starting with a letter or `_`, at most 64 characters"
            )))
        }
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// `sql` with `{schema}` replaced by this name.
    pub fn render(&self, sql: &str) -> String {
        sql.replace("{schema}", &self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_identifiers_pass() {
        assert!(Schema::new("app_outbox1").is_ok());
        for bad in ["", "App", "1app", "a-b", "a;drop", "a`b", &"a".repeat(65)] {
            assert!(Schema::new(bad).is_err(), "{bad}");
        }
        assert_eq!(
            Schema::new("x").map(|s| s.render("{schema}.outbox")).ok(),
            Some("x.outbox".to_string())
        );
    }
}
