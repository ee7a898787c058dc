//! The relay under test: the product's engine, in this process, with a connection pool of its
//! own whose `application_name` names the run, so its backends can be told apart, and a tokio
//! runtime of its own whose threads carry one name, so its CPU can be told from the producers'
//! and the read-back consumer's (see [`crate::cpu::thread_ticks`]).

use std::sync::Arc;
use std::time::Duration;

use outbox_core::{DestinationTemplate, Store};
use outbox_db::SqlxBackend as _;
use outbox_relay::{Relay, RelayConfig, RelayMetrics};
use serde::Serialize;
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::scratch::Scratch;
use crate::Ctx;

/// How long [`RelayUnderTest::settle`] waits.
const SETTLE: Duration = Duration::from_secs(3);

/// The name of the relay runtime's threads (at most 15 bytes: Linux's `comm`).
pub const THREAD_NAME: &str = "relay-under-tes";

/// Threads of the polling relay's runtime: as many as `outbox relay` has on this machine's two
/// cores.
const POLLING_THREADS: usize = 2;
/// Threads of the CDC relay's runtime: one, as `outbox relay --mode cdc` has.
const CDC_THREADS: usize = 1;

/// A running relay over one scratch schema, publishing to its stream.
pub struct RelayUnderTest {
    stop: CancellationToken,
    metrics: Arc<RelayMetrics>,
    handle: tokio::task::JoinHandle<()>,
    pool: PgPool,
    /// Where the relay, its sink's connection and its replication stream run. Shut down in
    /// the background (a runtime cannot be dropped inside another's task).
    runtime: Option<tokio::runtime::Runtime>,
    /// `application_name` of the relay's connections.
    pub application_name: String,
}

/// A runtime for one relay under test, its `threads` named [`THREAD_NAME`].
fn relay_runtime(threads: usize) -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .thread_name(THREAD_NAME)
        .enable_all()
        .build()?)
}

/// Runs `f` on `runtime` (this task's when `None`): connections made there are driven by that
/// runtime's threads, so their CPU counts as the relay's.
async fn on<T: Send + 'static>(
    runtime: Option<&tokio::runtime::Runtime>,
    f: impl std::future::Future<Output = anyhow::Result<T>> + Send + 'static,
) -> anyhow::Result<T> {
    match runtime {
        Some(rt) => rt.spawn(f).await?,
        None => f.await,
    }
}

/// The relay's pool, with the relay's own session settings (JIT off, timeouts) as
/// `outbox relay` has them, named `application_name`.
async fn relay_pool(url: String, application_name: String, size: u32) -> anyhow::Result<PgPool> {
    let options =
        outbox_db::tools::postgres::connect_options(&url)?.application_name(&application_name);
    Ok(PgPoolOptions::new()
        .max_connections(size)
        .acquire_timeout(Duration::from_secs(10))
        .connect_with(options)
        .await?)
}

impl RelayUnderTest {
    /// Starts a relay with the bench's settings (workers, batch, listen, poll interval), on a
    /// runtime of its own with its own NATS connection.
    pub async fn start(ctx: &Ctx, scratch: &Scratch) -> anyhow::Result<Self> {
        let runtime = relay_runtime(POLLING_THREADS)?;
        let url = ctx.options.nats_url.clone();
        let sink = on(Some(&runtime), async move {
            Ok(outbox_sinks::connect(&url).await?)
        })
        .await?;
        let destination =
            DestinationTemplate::parse(&format!("{}.{{event_type}}", scratch.subject_prefix))?;
        Self::start_on(ctx, scratch, sink, destination, Some(runtime)).await
    }

    /// The relay publishing to `sink` at `destination` instead of the scratch stream, on this
    /// task's runtime.
    pub async fn start_with(
        ctx: &Ctx,
        scratch: &Scratch,
        sink: Arc<dyn outbox_core::Sink>,
        destination: DestinationTemplate,
    ) -> anyhow::Result<Self> {
        Self::start_on(ctx, scratch, sink, destination, None).await
    }

    /// The polling relay on `runtime` (this task's when `None`).
    async fn start_on(
        ctx: &Ctx,
        scratch: &Scratch,
        sink: Arc<dyn outbox_core::Sink>,
        destination: DestinationTemplate,
        runtime: Option<tokio::runtime::Runtime>,
    ) -> anyhow::Result<Self> {
        let application_name = format!("outbox_bench_relay_{}", scratch.suffix);
        let size = ctx.options.workers.max(1) as u32 * 2 + 2;
        let pool = on(
            runtime.as_ref(),
            relay_pool(
                ctx.options.database_url.clone(),
                application_name.clone(),
                size,
            ),
        )
        .await?;
        let store: Arc<dyn Store> =
            sqlx::Postgres::database(pool.clone(), scratch.schema.as_str())?.store();
        let relay = Relay::new(store, sink, config(ctx, destination));
        Ok(Self::run(relay, pool, application_name, runtime))
    }

    /// The relay in CDC mode, on a runtime of its own: it reads the slot
    /// `outbox_<schema>_relay` (made by [`crate::cdc`] before the rows were written) and
    /// publishes to the scratch stream.
    pub async fn start_cdc(ctx: &Ctx, scratch: &Scratch) -> anyhow::Result<Self> {
        let runtime = relay_runtime(CDC_THREADS)?;
        let destination =
            DestinationTemplate::parse(&format!("{}.{{event_type}}", scratch.subject_prefix))?;
        let application_name = format!("outbox_bench_relay_{}", scratch.suffix);
        let names = outbox_db::CdcNames::new(&scratch.schema, "relay")?;
        let (nats, url, app) = (
            ctx.options.nats_url.clone(),
            ctx.options.database_url.clone(),
            application_name.clone(),
        );
        let (sink, pool, store) = on(Some(&runtime), async move {
            let sink = outbox_sinks::connect(&nats).await?;
            let pool = relay_pool(url.clone(), app, 2).await?;
            let store =
                outbox_db::tools::postgres::CdcStore::new(pool.clone(), &url, names).await?;
            Ok((sink, pool, store))
        })
        .await?;
        let mut cfg = config(ctx, destination);
        cfg.workers = 1;
        cfg.listen = true;
        cfg.read_ahead = false;
        let relay = Relay::new(Arc::new(store), sink, cfg);
        Ok(Self::run(relay, pool, application_name, Some(runtime)))
    }

    /// Spawns `relay` on `runtime` (or this task's).
    fn run(
        relay: Relay,
        pool: PgPool,
        application_name: String,
        runtime: Option<tokio::runtime::Runtime>,
    ) -> Self {
        let metrics = relay.metrics();
        let stop = CancellationToken::new();
        let task = relay.run(stop.clone());
        let handle = match &runtime {
            Some(rt) => rt.spawn(task),
            None => tokio::spawn(task),
        };
        Self {
            stop,
            metrics,
            handle,
            pool,
            runtime,
            application_name,
        }
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
    /// claiming from a schema about to be dropped. The relay's own runtime ends with it: after
    /// [`RelayUnderTest::stop`], or at once, its tasks dropped, when the run failed.
    fn drop(&mut self) {
        self.stop.cancel();
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
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
