//! CDC mode: the relay reads the outbox from PostgreSQL's write-ahead log by logical
//! replication (`pgoutput`) instead of polling the table. Messages arrive in commit order with
//! no query on an idle database, and writers may skip the table with [`emit`](emit::emit).
//! See docs/cdc.md.

pub mod checks;
mod decode;
pub mod emit;
pub mod pgoutput;
pub mod salvage;
pub mod setup;
mod store;
mod stream;
pub mod sync;

pub use setup::{CdcNames, CdcSetup, DEFAULT_GROUP, MESSAGE_PREFIX};
pub use store::{CdcStore, DEFAULT_PARK_AFTER};
pub use stream::{url_password, FEEDBACK_INTERVAL};
