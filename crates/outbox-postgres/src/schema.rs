//! Validated schema names: the only text ever spliced into SQL.

use outbox_core::{Error, Result};

/// Default schema.
pub const DEFAULT_SCHEMA: &str = "public";

/// A PostgreSQL schema name checked to be a plain lower-case identifier
/// (`[a-z_][a-z0-9_]*`, at most 63 bytes), so it can be written into SQL unquoted.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Schema(String);

impl Schema {
    /// Validates `name`.
    pub fn new(name: &str) -> Result<Self> {
        if outbox_core::identifier::is_plain(name, 63) {
            Ok(Self(name.to_string()))
        } else {
            Err(Error::config(format!(
                "schema `{name}` is not a plain identifier: use lower-case letters, digits and `_`, \
                 starting with a letter or `_`, at most 63 characters"
            )))
        }
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The LISTEN/NOTIFY channel of this schema's outbox: `outbox_` and a 64-bit FNV-1a hash
    /// of the schema name in hex, 23 bytes whatever the schema's length (PostgreSQL truncates
    /// or rejects channel names over 63 bytes).
    pub fn channel(&self) -> String {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in self.0.bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        format!("outbox_{h:016x}")
    }

    /// `sql` with `{schema}` and `{channel}` filled in.
    pub fn render(&self, sql: &str) -> String {
        sql.replace("{schema}", &self.0)
            .replace("{channel}", &self.channel())
    }
}

impl Default for Schema {
    fn default() -> Self {
        Self(DEFAULT_SCHEMA.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channels_are_short_and_distinct() {
        let long = Schema::new(&"s".repeat(63)).unwrap();
        assert!(long.channel().len() <= 63);
        assert_ne!(
            Schema::new("a").unwrap().channel(),
            Schema::new("b").unwrap().channel()
        );
    }

    #[test]
    fn plain_identifiers_pass() {
        assert!(Schema::new("public").is_ok());
        assert!(Schema::new("_x9").is_ok());
    }

    #[test]
    fn injection_and_odd_names_fail() {
        for bad in [
            "",
            "Public",
            "a-b",
            "a;drop table x",
            "9a",
            "a b",
            &"x".repeat(64),
        ] {
            let e = Schema::new(bad).unwrap_err();
            assert_eq!(e.kind(), outbox_core::ErrorKind::Config, "{bad}");
        }
    }
}
