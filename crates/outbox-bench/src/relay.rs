//! The relay under test: the product's engine, in this process, with a connection pool of its
//! own whose `application_name` names the run, so its backends can be told apart.

use std::sync::Arc;
use std::time::Duration;

use outbox_core::{DestinationTemplate, Store};
use outbox_postgres::PgStore;
use outbox_relay::{Relay, RelayConfig, RelayMetrics};
use serde::Serialize;
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::scratch::Scratch;
use crate::Ctx;

/// How long [`RelayUnderTest::settle`] waits.
const SETTLE: Duration = Duration::from_secs(3);

/// A running relay over one scratch schema, publishing to its stream.
pub struct RelayUnderTest {
    stop: CancellationToken,
    metrics: Arc<RelayMetrics>,
    handle: tokio::task::JoinHandle<()>,
    pool: PgPool,
    /// `application_name` of the relay's connections.
    pub application_name: String,
}

impl RelayUnderTest {
    /// Starts a relay with the bench's settings (workers, batch, listen, poll interval).
    pub async fn start(ctx: &Ctx, scratch: &Scratch) -> anyhow::Result<Self> {
        let sink = outbox_sinks::connect(&ctx.options.nats_url).await?;
        let destination =
            DestinationTemplate::parse(&format!("{}.{{event_type}}", scratch.subject_prefix))?;
        Self::start_with(ctx, scratch, sink, destination).await
    }

    /// The relay publishing to `sink` at `destination` instead of the scratch stream.
    pub async fn start_with(
        ctx: &Ctx,
        scratch: &Scratch,
        sink: Arc<dyn outbox_core::Sink>,
        destination: DestinationTemplate,
    ) -> anyhow::Result<Self> {
        let application_name = format!("outbox_bench_relay_{}", scratch.suffix);
        // The relay's own session settings (JIT off, timeouts), as `outbox relay` has them.
        let options = outbox_postgres::connect_options(&ctx.options.database_url)?
            .application_name(&application_name);
        let pool = PgPoolOptions::new()
            .max_connections(ctx.options.workers.max(1) as u32 * 2 + 2)
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(options)
            .await?;
        let store: Arc<dyn Store> = Arc::new(PgStore::new(pool.clone(), scratch.schema.clone()));
        let relay = Relay::new(store, sink, config(ctx, destination));
        let metrics = relay.metrics();
        let stop = CancellationToken::new();
        let handle = tokio::spawn(relay.run(stop.clone()));
        Ok(Self {
            stop,
            metrics,
            handle,
            pool,
            application_name,
        })
    }

    /// The relay in CDC mode: it reads the slot `outbox_<schema>_relay` (made by
    /// [`crate::cdc`] before the rows were written) and publishes to the scratch stream.
    pub async fn start_cdc(ctx: &Ctx, scratch: &Scratch) -> anyhow::Result<Self> {
        let sink = outbox_sinks::connect(&ctx.options.nats_url).await?;
        let destination =
            DestinationTemplate::parse(&format!("{}.{{event_type}}", scratch.subject_prefix))?;
        let application_name = format!("outbox_bench_relay_{}", scratch.suffix);
        let options = outbox_postgres::connect_options(&ctx.options.database_url)?
            .application_name(&application_name);
        let pool = PgPoolOptions::new()
            .max_connections(2)
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(options)
            .await?;
        let names = outbox_postgres::cdc::CdcNames::new(&scratch.schema, "relay")?;
        let store: Arc<dyn Store> = Arc::new(
            outbox_postgres::cdc::CdcStore::new(pool.clone(), &ctx.options.database_url, names)
                .await?,
        );
        let mut cfg = config(ctx, destination);
        cfg.workers = 1;
        cfg.listen = true;
        cfg.read_ahead = false;
        let relay = Relay::new(store, sink, cfg);
        let metrics = relay.metrics();
        let stop = CancellationToken::new();
        let handle = tokio::spawn(relay.run(stop.clone()));
        Ok(Self {
            stop,
            metrics,
            handle,
            pool,
            application_name,
        })
    }

    /// Waits until the relay has settled: its workers rebalance every second, so a partition
    /// the first worker took and must hand to the second changes owner within about two.
    /// Timed loads start after this, so a start-up hand-over does not land in their tail.
    pub async fn settle(&self) {
        tokio::time::sleep(SETTLE).await;
    }

    /// The relay's live counters.
    pub fn metrics(&self) -> &RelayMetrics {
        &self.metrics
    }

    /// Claim count and time so far.
    pub fn claims(&self) -> ClaimCounter {
        ClaimCounter {
            claims: RelayMetrics::get(&self.metrics.claims),
            micros: RelayMetrics::get(&self.metrics.claim_micros),
        }
    }

    /// Stops the relay (it finishes its batch in hand and gives its partitions back) and
    /// closes its pool.
    pub async fn stop(mut self) {
        self.stop.cancel();
        let _ = (&mut self.handle).await;
        self.pool.close().await;
    }
}

impl Drop for RelayUnderTest {
    /// A run that fails half-way still stops its relay (in the background), so nothing keeps
    /// claiming from a schema about to be dropped.
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

fn config(ctx: &Ctx, destination: DestinationTemplate) -> RelayConfig {
    config_of(&ctx.options, destination)
}

/// The relay's settings from the bench's options, whichever database it runs on.
pub(crate) fn config_of(options: &crate::Options, destination: DestinationTemplate) -> RelayConfig {
    let defaults = RelayConfig::default();
    RelayConfig {
        batch_size: options.batch_size,
        workers: options.workers,
        listen: options.listen,
        read_ahead: options.read_ahead,
        poll_interval: options.poll_interval.unwrap_or(defaults.poll_interval),
        destination,
        member_prefix: "bench".into(),
        ..defaults
    }
}

/// The relay's claim counters at one instant.
#[derive(Debug, Clone, Copy, Default)]
pub struct ClaimCounter {
    claims: u64,
    micros: u64,
}

/// Mean claim cost between two readings.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct ClaimCost {
    /// Claim statements run in the interval, empty ones included.
    pub claims: u64,
    /// Mean time per claim, in milliseconds (`None` when no claim ran).
    pub mean_ms: Option<f64>,
}

impl ClaimCounter {
    /// Claim count and time so far in a relay's metrics.
    pub fn of(metrics: &RelayMetrics) -> Self {
        Self {
            claims: RelayMetrics::get(&metrics.claims),
            micros: RelayMetrics::get(&metrics.claim_micros),
        }
    }

    /// Mean claim cost from `self` to the later reading `to`.
    pub fn until(self, to: ClaimCounter) -> ClaimCost {
        let claims = to.claims.saturating_sub(self.claims);
        let micros = to.micros.saturating_sub(self.micros);
        ClaimCost {
            claims,
            mean_ms: (claims > 0).then(|| micros as f64 / claims as f64 / 1000.0),
        }
    }
}
