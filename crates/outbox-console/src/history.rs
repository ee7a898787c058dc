//! The last hour in memory, for the overview's charts: a sampler reads the store's cheap figures
//! ([`Store::gauges`], one statement whose cost does not grow with the backlog) at an interval,
//! and keeps an hour of samples. The console keeps no state on disk: a restarted console starts
//! a new hour.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use outbox_core::Store;
use tokio_util::sync::CancellationToken;
use tracing::debug;

/// How far back the charts reach.
pub const SPAN: Duration = Duration::from_secs(3600);

/// One reading.
#[derive(Debug, Clone, Copy)]
struct Sample {
    at: Instant,
    /// Messages published: PostgreSQL's running total; SQLite's count of those still kept
    /// (falls when they are deleted by age).
    published: i64,
    pending: i64,
    oldest_age: f64,
}

/// One reading: the cheap scrape figures ([`Store::gauges`]), and the published count from
/// them where the store keeps a running total (PostgreSQL), else from [`Store::stats`].
async fn sample(store: &dyn Store) -> outbox_core::Result<Sample> {
    let g = store.gauges().await?;
    let published = match g.published {
        Some(p) => p,
        None => store.stats().await?.published,
    };
    Ok(Sample {
        at: Instant::now(),
        published,
        pending: g.pending,
        oldest_age: g.oldest_pending_age_seconds.unwrap_or(0.0),
    })
}

/// The samples of the last [`SPAN`].
#[derive(Debug, Default)]
pub struct History {
    samples: Mutex<VecDeque<Sample>>,
}

impl History {
    /// Samples `store` every `every` until `stop`.
    pub fn spawn(store: Arc<dyn Store>, every: Duration, stop: CancellationToken) -> Arc<History> {
        let history = Arc::new(History::default());
        let h = history.clone();
        tokio::spawn(async move {
            loop {
                match sample(&*store).await {
                    Ok(s) => h.push(s),
                    Err(e) => debug!(error = %e, "console: a sample failed"),
                }
                if stop
                    .run_until_cancelled(tokio::time::sleep(every))
                    .await
                    .is_none()
                {
                    return;
                }
            }
        });
        history
    }

    fn push(&self, s: Sample) {
        let mut samples = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        samples.push_back(s);
        while samples
            .front()
            .is_some_and(|f| s.at.duration_since(f.at) > SPAN)
        {
            samples.pop_front();
        }
    }

    /// Messages published per second between samples, as (seconds ago, rate). A drop of the
    /// published count (storage dropped by retention) counts as no publication.
    pub fn rate(&self) -> Vec<(f64, f64)> {
        let samples = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        samples
            .iter()
            .zip(samples.iter().skip(1))
            .map(|(a, b)| {
                let secs = b.at.duration_since(a.at).as_secs_f64().max(1e-3);
                let n = (b.published - a.published).max(0) as f64;
                (now.duration_since(b.at).as_secs_f64(), n / secs)
            })
            .collect()
    }

    /// Seconds since the published count last rose between two samples; `None` when it has
    /// not risen in what the console has sampled.
    pub fn since_last_publish(&self) -> Option<f64> {
        let samples = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        samples
            .iter()
            .zip(samples.iter().skip(1))
            .rev()
            .find(|(a, b)| b.published > a.published)
            .map(|(_, b)| b.at.elapsed().as_secs_f64())
    }

    /// Seconds since the oldest sample kept (0 before the first).
    pub fn reach(&self) -> f64 {
        let samples = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        samples
            .front()
            .map_or(0.0, |s| s.at.elapsed().as_secs_f64())
    }

    /// The lag (age of the oldest pending message, seconds) at each sample.
    pub fn lag(&self) -> Vec<(f64, f64)> {
        self.series(|s| s.oldest_age)
    }

    /// Pending messages at each sample.
    pub fn pending(&self) -> Vec<(f64, f64)> {
        self.series(|s| s.pending as f64)
    }

    fn series(&self, f: impl Fn(&Sample) -> f64) -> Vec<(f64, f64)> {
        let samples = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        samples
            .iter()
            .map(|s| (now.duration_since(s.at).as_secs_f64(), f(s)))
            .collect()
    }
}
