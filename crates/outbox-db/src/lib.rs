//! One way to open an outbox database from its URL, for every command and tool.
//!
//! [`open`] reads the URL's scheme ([`Backend`]), connects, and returns a [`Database`]: the
//! backend's store behind one type, with what commands need (`migrate`, the relay's
//! [`Store`](outbox_core::Store), where the tables live) and business transactions
//! ([`Transaction`]) that write an application's rows and enqueue messages in one commit on
//! any of the three databases.
//!
//! Crates built on the outbox go through this one too: [`SqlxBackend`] is what they do with a
//! caller's typed sqlx pool or transaction, [`Migrations`] their own tables beside an outbox,
//! [`Session`] a lock held by a connection, [`Database::sibling`] another outbox table set (the
//! inbox's processing queue). They name no backend crate.
//!
//! Adding a backend: a [`Backend`] variant and its schemes in
//! `backend.rs`, a [`Database`] variant, an [`SqlxBackend`] impl, and one arm in each `match`
//! the compiler then points at (here, and where other crates match [`SqlxTransaction`]).

mod backend;
mod database;
mod migrations;
mod roles;
mod routes;
mod session;
mod sql;
mod sqlx_backend;
pub mod tools;
mod transaction;
pub mod url;

pub use backend::{Backend, ACCEPTED_SCHEMES};
pub use database::{open, open_with_deadline, Database};
pub use migrations::Migrations;
/// A validated schema name (a plain lower-case identifier): the only text spliced into SQL.
pub use outbox_postgres::Schema;
pub use roles::{MysqlGrants, MYSQL_GRANTS};
pub use routes::{
    check_schema_name, AdoptedTable, CdcNames, CdcOptions, CdcSetup, DEFAULT_PARK_AFTER,
};
pub use session::Session;
pub use sql::{Param, Row};
pub use sqlx_backend::SqlxBackend;
pub use transaction::{SqlxTransaction, Transaction};
pub use url::url_as;
