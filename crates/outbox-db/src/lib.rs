//! One way to open an outbox database from its URL, for every command and tool.
//!
//! [`open`] reads the URL's scheme ([`Backend`]), connects, and returns a [`Database`]: the
//! backend's store behind one type, with what commands need (`migrate`, the relay's
//! [`Store`](outbox_core::Store), where the tables live) and business transactions
//! ([`Transaction`]) that write an application's rows and enqueue messages in one commit on
//! either backend.
//!
//! Adding a backend (MySQL/MariaDB is the next one): a [`Backend`] variant and its schemes in
//! `backend.rs`, a [`Database`] variant, and one arm in each `match` the compiler then points at.

mod backend;
mod database;
mod sql;
mod transaction;

pub use backend::{Backend, ACCEPTED_SCHEMES};
pub use database::{open, open_with_deadline, Database};
pub use sql::{Param, Row};
pub use transaction::Transaction;
