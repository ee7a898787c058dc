//! The guarantee checker behind `outbox verify`, as a library: a workload of producers, relays
//! as real OS processes, faults on a seeded schedule, an independent reader of the broker (the
//! sink's own [`outbox_sinks::read::Reader`]) and a pure checker of what arrived against what
//! was committed.
//!
//! Producers commit business (ledger) rows and their events in one transaction, several of them
//! on the same keys, rolling some back on purpose ([`workload`]); relays run as processes of the
//! `outbox` binary ([`relays`]); faults ([`faults`]) are `kill -9` of a relay, SIGSTOP past the
//! lease then SIGCONT (the fencing case), broker stop/start and database restart. [`checker`]
//! compares what arrived with the ledger and [`report`] holds the verdict.
//!
//! With `--through-inbox` the run goes on to the receiving side: `outbox inbox` daemons consume
//! the broker into an inbox, handler processes apply each message's effect, the faults hit them
//! too, and [`effects`] judges every effect applied exactly once and in per-key order.

mod args;
pub mod checker;
pub mod effects;
pub mod faults;
pub mod inbox;
pub mod logins;
pub mod mysql_producers;
pub mod proxy;
pub mod relays;
pub mod report;
mod run;
pub mod workload;

pub use args::{Args, Format, Profile};
pub use report::Report;
pub use run::{run, Outcome, Settings};
