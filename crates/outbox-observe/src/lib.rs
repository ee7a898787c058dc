//! Operations over HTTP for `outbox relay` and `outbox inbox` (`--metrics-addr`): one address
//! serving `/metrics` (Prometheus text format), `/livez` and `/readyz`.
//!
//! - **Metrics** are rendered by `metrics-exporter-prometheus` from the process's `metrics`
//!   recorder ([`Exporter::install`]) on each scrape: the engine's counters and histograms as
//!   its workers recorded them, and, set just before rendering, the figures read from the store
//!   in one statement (`Store::gauges`, whose cost does not grow with the backlog), the
//!   circuits and the partitions owned. Nothing is formatted by hand.
//! - **Probes**: `/livez` fails when a loop of the process has not finished a step within its
//!   bound (a wedged worker: restart it); `/readyz` fails when the database does not answer,
//!   a worker holds no lease, or every sink's circuit has been open for longer than
//!   `--unready-after` (take it out of rotation and alert; a restart does not bring a broker
//!   back). See `docs/operations.md`.
//! - **Traces** (`--otlp-endpoint`): the relay's publish spans and the inbox's receive and
//!   process spans, exported over OTLP/HTTP ([`install_tracing`]).

mod catalogue;
mod exporter;
mod otlp;
mod server;
mod target;

pub use catalogue::{
    StoreNames, BINLOG_CATALOGUE, CDC_CATALOGUE, INBOX, INBOX_CATALOGUE, RELAY, RELAY_CATALOGUE,
};
pub use exporter::{Exporter, InstallError};
pub use otlp::{install as install_tracing, traces_url, OtlpError, Tracing};
pub use server::{bind, serve, Server};
pub use target::{Loop, Target, DEFAULT_UNREADY_AFTER};
