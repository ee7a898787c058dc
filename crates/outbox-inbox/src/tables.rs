//! Where the inbox lives on PostgreSQL: the schema of its tables, and the schema of its
//! processing queue (an outbox table set of its own).

use outbox_core::{Error, Result};
use outbox_db::Schema;

/// The dedupe consumer name the [`crate::InboxProcessor`] claims messages under in
/// `processed_messages`: a message with a `processed_messages` row for it was handled.
pub const PROCESSOR_CONSUMER: &str = "inbox";

/// The suffix of the processing queue's schema: `<schema>_inbox` by default.
pub const QUEUE_SUFFIX: &str = "_inbox";

/// The two schemas of a PostgreSQL inbox.
///
/// - `tables` holds `inbox_messages`, `processed_messages`, `idempotency_keys` and the
///   `inbox_message_states` view: what applications read and write in their own transactions
///   (default `public`, beside the outbox).
/// - `queue` holds the processing queue: the outbox's own insert-only engine (`outbox`,
///   `outbox_positions`, `outbox_parked`, …), made by the outbox migration, which the
///   [`crate::InboxProcessor`] drains with the relay engine. Default `<tables>_inbox`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InboxSchema {
    tables: Schema,
    queue: Schema,
}

impl Default for InboxSchema {
    fn default() -> Self {
        Self {
            tables: Schema::default(),
            queue: Schema::new(&format!("{}{QUEUE_SUFFIX}", Schema::default().as_str()))
                .unwrap_or_default(),
        }
    }
}

impl InboxSchema {
    /// Tables in `schema`, the queue in `<schema>_inbox`. Both names are validated (plain
    /// lower-case identifiers), so `schema` may have at most 57 characters.
    pub fn new(schema: &str) -> Result<Self> {
        let queue = format!("{schema}{QUEUE_SUFFIX}");
        Self::with_queue(schema, &queue)
    }

    /// Tables in `schema`, the queue in `queue` (which must differ from `schema`: the queue
    /// is an outbox table set, and `schema` may hold the application's own outbox).
    pub fn with_queue(schema: &str, queue: &str) -> Result<Self> {
        let tables = Schema::new(schema)?;
        let queue = Schema::new(queue).map_err(|e| {
            Error::config(format!(
                "the inbox queue's schema `{queue}`: {e} (it is `<schema>{QUEUE_SUFFIX}` unless given)"
            ))
        })?;
        if tables == queue {
            return Err(Error::config(format!(
                "the inbox queue needs a schema of its own, not `{}`, which holds the inbox \
                 tables (and maybe an outbox)",
                tables.as_str()
            )));
        }
        Ok(Self { tables, queue })
    }

    /// The schema of the inbox tables.
    pub fn tables(&self) -> &Schema {
        &self.tables
    }

    /// The schema of the processing queue.
    pub fn queue(&self) -> &Schema {
        &self.queue
    }

    /// `sql` with `{schema}` and `{queue}` filled in.
    pub(crate) fn render(&self, sql: &str) -> String {
        self.tables.render(&self.render_queue(sql))
    }

    /// `sql` with `{queue}` filled in (`{schema}` is left to the database it runs on).
    pub(crate) fn render_queue(&self, sql: &str) -> String {
        sql.replace("{queue}", self.queue.as_str())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_queue_lives_beside_the_tables() {
        let s = InboxSchema::default();
        assert_eq!(
            (s.tables().as_str(), s.queue().as_str()),
            ("public", "public_inbox")
        );
        let s = InboxSchema::new("app").unwrap();
        assert_eq!(s.queue().as_str(), "app_inbox");
        assert_eq!(
            s.render("{schema}.inbox_messages JOIN {queue}.outbox_parked"),
            "app.inbox_messages JOIN app_inbox.outbox_parked"
        );
    }

    #[test]
    fn bad_or_clashing_names_are_config_errors() {
        assert!(
            InboxSchema::new(&"s".repeat(58)).is_err(),
            "queue name too long"
        );
        assert!(InboxSchema::new(&"s".repeat(57)).is_ok());
        assert!(InboxSchema::with_queue("a", "a").is_err());
        assert!(InboxSchema::new("Bad").is_err());
    }
}
