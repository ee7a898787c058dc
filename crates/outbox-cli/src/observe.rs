//! `--metrics-addr`: installs the metrics recorder and binds the address before the command
//! builds anything that records, then serves `outbox-observe`'s endpoints beside it.

use std::net::SocketAddr;

use anyhow::Context as _;
use outbox_observe::{Exporter, Server, Target};
use outbox_relay::telemetry::MetricDef;
use tokio_util::sync::CancellationToken;

/// Every metric `outbox relay` exports.
pub const RELAY_METRICS: [&[MetricDef]; 4] = [
    outbox_relay::telemetry::CATALOGUE,
    outbox_observe::RELAY_CATALOGUE,
    outbox_observe::CDC_CATALOGUE,
    outbox_observe::BINLOG_CATALOGUE,
];

/// Every metric `outbox inbox` exports.
pub const INBOX_METRICS: [&[MetricDef]; 2] = [
    outbox_inbox::telemetry::DAEMON_CATALOGUE,
    outbox_observe::INBOX_CATALOGUE,
];

/// The recorder installed and the address bound, not yet serving.
pub struct Observe {
    exporter: Exporter,
    server: Server,
}

/// Installs the recorder with `catalogues` and binds `addr`.
pub async fn start(addr: SocketAddr, catalogues: &[&[MetricDef]]) -> anyhow::Result<Observe> {
    let exporter = Exporter::install(catalogues)?;
    let server = outbox_observe::bind(addr)
        .await
        .with_context(|| format!("--metrics-addr {addr}: cannot listen there"))?;
    Ok(Observe { exporter, server })
}

impl Observe {
    /// Serves `target` until `shutdown`, on a task of its own.
    pub fn serve(self, target: Target, shutdown: CancellationToken) -> tokio::task::JoinHandle<()> {
        tokio::spawn(outbox_observe::serve(
            self.server,
            self.exporter,
            std::sync::Arc::new(target),
            shutdown,
        ))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    /// (name, type, labels) of every row of the metric tables of docs/operations.md.
    fn documented() -> BTreeSet<(String, String, String)> {
        include_str!("../../../docs/operations.md")
            .lines()
            .filter_map(|l| {
                let cells: Vec<&str> = l.split('|').map(str::trim).collect();
                let name = cells.get(1)?.strip_prefix("`outbox_")?.strip_suffix('`')?;
                Some((
                    format!("outbox_{name}"),
                    cells.get(2)?.to_string(),
                    cells.get(3)?.to_string(),
                ))
            })
            .collect()
    }

    #[test]
    fn docs_operations_lists_every_exported_metric_with_its_type_and_labels() {
        let code: BTreeSet<(String, String, String)> = RELAY_METRICS
            .iter()
            .chain(INBOX_METRICS.iter())
            .chain([outbox_inbox::telemetry::PROCESSOR_CATALOGUE].iter())
            .flat_map(|c| c.iter())
            .map(|d| {
                (
                    d.name.to_string(),
                    d.kind.as_str().to_string(),
                    d.labels.join(", "),
                )
            })
            .collect();
        let docs = documented();
        let missing: Vec<_> = code.difference(&docs).collect();
        let extra: Vec<_> = docs.difference(&code).collect();
        assert!(
            missing.is_empty() && extra.is_empty(),
            "docs/operations.md is out of date: not documented (or documented otherwise): \
             {missing:?}; documented but not exported: {extra:?}"
        );
    }

    #[test]
    fn every_name_follows_the_conventions() {
        for d in RELAY_METRICS
            .iter()
            .chain(INBOX_METRICS.iter())
            .chain([outbox_inbox::telemetry::PROCESSOR_CATALOGUE].iter())
            .flat_map(|c| c.iter())
        {
            assert!(d.name.starts_with("outbox_"), "{}", d.name);
            assert_eq!(
                d.name.ends_with("_total"),
                d.kind == outbox_relay::telemetry::MetricKind::Counter,
                "{}: counters, and only they, end in _total",
                d.name
            );
            assert!(
                !d.name.contains("millis") && !d.name.ends_with("_ms"),
                "{}: base units",
                d.name
            );
            assert_eq!(
                d.buckets.is_empty(),
                d.kind != outbox_relay::telemetry::MetricKind::Histogram,
                "{}: histograms, and only they, have buckets",
                d.name
            );
        }
    }
}
