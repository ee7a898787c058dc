//! [`Exporter`]: the process's `metrics` recorder, a Prometheus one, rendered on each scrape.

use metrics::{Recorder, SharedString};
use metrics_exporter_prometheus::{
    BuildError, Matcher, PrometheusBuilder, PrometheusHandle, PrometheusRecorder,
};
use outbox_relay::telemetry::{MetricDef, MetricKind};

/// Why the recorder could not be installed.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    /// A histogram's buckets were refused (empty).
    #[error("metrics: {0}")]
    Build(#[from] BuildError),
    /// The process already has a `metrics` recorder (installed twice, or by the application).
    #[error("metrics: the process already has a metrics recorder installed")]
    AlreadyInstalled,
}

/// Renders the process's metrics in the Prometheus text format (version 0.0.4).
#[derive(Clone)]
pub struct Exporter {
    handle: PrometheusHandle,
}

impl std::fmt::Debug for Exporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exporter").finish_non_exhaustive()
    }
}

impl Exporter {
    /// Installs a Prometheus recorder as the process's `metrics` recorder, with the buckets and
    /// the help text of every metric of `catalogues`. Install it before building the relay (or
    /// the inbox): their handles are registered with whatever recorder is installed when they
    /// are built. Once per process.
    pub fn install(catalogues: &[&[MetricDef]]) -> Result<Self, InstallError> {
        let recorder = Self::recorder(catalogues)?;
        let handle = recorder.handle();
        metrics::set_global_recorder(recorder).map_err(|_| InstallError::AlreadyInstalled)?;
        Ok(Self { handle })
    }

    /// An exporter whose recorder is not the process's: it renders only its descriptions. For
    /// tests that run several relays in one process and read only the probes.
    pub fn detached(catalogues: &[&[MetricDef]]) -> Result<Self, InstallError> {
        let recorder = Self::recorder(catalogues)?;
        Ok(Self {
            handle: recorder.handle(),
        })
    }

    fn recorder(catalogues: &[&[MetricDef]]) -> Result<PrometheusRecorder, InstallError> {
        let mut builder = PrometheusBuilder::new();
        for def in catalogues.iter().flat_map(|c| c.iter()) {
            if def.kind == MetricKind::Histogram {
                // Buckets make a true histogram; without them the exporter would render a
                // summary.
                builder = builder
                    .set_buckets_for_metric(Matcher::Full(def.name.to_string()), def.buckets)?;
            }
        }
        let recorder = builder.build_recorder();
        for def in catalogues.iter().flat_map(|c| c.iter()) {
            let help = SharedString::const_str(def.help);
            match def.kind {
                MetricKind::Counter => recorder.describe_counter(def.name.into(), None, help),
                MetricKind::Gauge => recorder.describe_gauge(def.name.into(), None, help),
                MetricKind::Histogram => recorder.describe_histogram(def.name.into(), None, help),
            }
        }
        Ok(recorder)
    }

    /// Everything recorded, in the Prometheus text format.
    pub fn render(&self) -> String {
        self.handle.render()
    }

    /// Folds the histograms' recent observations into their buckets: the server runs it every
    /// few seconds, so that observations do not pile up between scrapes (or without any).
    pub fn run_upkeep(&self) {
        self.handle.run_upkeep();
    }
}
