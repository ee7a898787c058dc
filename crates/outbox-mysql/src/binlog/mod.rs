//! Reading the outbox's rows from the binlog, in commit order: the first part of the binlog
//! route (docs/engine-mysql.md, "The binlog route"), in which writers keep no counter and the
//! relay learns commit order from the server's row binlog instead.
//!
//! - [`server`] says whether a server's binlog can be read this way (row format, full row
//!   images) and where it ends, in words an operator can act on.
//! - [`BinlogReader`] follows the binlog from a position and hands back each committed
//!   transaction's outbox rows, whole, in commit order; rolled-back transactions never reach
//!   the binlog, so they never appear. A position the server no longer holds (the binlog was
//!   purged) is its own error, [`ReadError::Purged`], since the caller must then find the
//!   rows another way.
//!
//! - [`route`] turns the route on for an outbox (`outbox migrate --binlog`): the writers'
//!   trigger goes, and positions move to `outbox_sequence`.
//! - [`sequencer`] gives each committed row its partition and position there, in commit order,
//!   from this reader; the polling engine relays by them (`MysqlStore::binlog`). `session`
//!   holds one lease's work, `seal` the seal (rows the binlog did not carry, taken from the
//!   table) and the canary that finds the writers still open.
//! - `tls`: the stream's TLS, from the pool's URL options (`ssl-mode`, `ssl-ca`, `ssl-cert`,
//!   `ssl-key`).
//! - [`status`] is what `outbox status` and the metrics show of the sequencer.

mod decode;
mod position;
mod reader;
pub mod route;
mod seal;
pub mod sequencer;
pub mod server;
mod session;
pub mod status;
mod tls;
mod xa;

pub use position::BinlogPosition;
pub use reader::{BinlogReader, BinlogRow, Committed, Item, ReadError, ReadOptions};
