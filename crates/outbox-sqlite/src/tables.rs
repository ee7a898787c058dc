//! Which table set a SQLite store serves: the application's `outbox…` tables, or another set
//! under its own prefix in the same file (the inbox's processing queue is `inbox_queue…`).

use outbox_core::{Error, Result};

/// The default prefix: the tables `outbox`, `outbox_partitions`, `outbox_members`, …
pub const DEFAULT_PREFIX: &str = "outbox";

/// The names of one outbox table set in a SQLite file: `<prefix>` (the messages),
/// `<prefix>_partitions`, `<prefix>_members`, `<prefix>_migrations`, `<prefix>_redrives` and
/// their indexes. The prefix is checked to be a plain lower-case identifier, the only text ever
/// spliced into SQL; every statement of this crate is written for `outbox` and renamed here.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Tables(String);

impl Default for Tables {
    fn default() -> Self {
        Self(DEFAULT_PREFIX.to_string())
    }
}

impl Tables {
    /// Tables named after `prefix` (`[a-z_][a-z0-9_]*`, at most 40 characters).
    pub fn new(prefix: &str) -> Result<Self> {
        if outbox_core::identifier::is_plain(prefix, 40) {
            Ok(Self(prefix.to_string()))
        } else {
            Err(Error::config(format!(
                "table prefix `{prefix}` is not a plain identifier: use lower-case letters, \
                 digits and `_`, starting with a letter or `_`, at most 40 characters"
            )))
        }
    }

    /// The prefix, which is also the name of the message table.
    pub fn prefix(&self) -> &str {
        &self.0
    }

    /// `sql`, written for the default tables, renamed for these.
    pub fn render(&self, sql: &str) -> String {
        if self.0 == DEFAULT_PREFIX {
            sql.to_string()
        } else {
            sql.replace(DEFAULT_PREFIX, &self.0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_are_renamed_for_another_prefix() {
        let t = Tables::new("inbox_queue").unwrap();
        assert_eq!(
            t.render("SELECT 1 FROM outbox AS o JOIN outbox_partitions INDEXED BY outbox_pending_idx"),
            "SELECT 1 FROM inbox_queue AS o JOIN inbox_queue_partitions INDEXED BY inbox_queue_pending_idx"
        );
        assert_eq!(Tables::default().render("outbox"), "outbox");
        for bad in ["", "Outbox", "a-b", "a;b", "9a", &"x".repeat(41)] {
            assert!(Tables::new(bad).is_err(), "{bad}");
        }
    }
}
