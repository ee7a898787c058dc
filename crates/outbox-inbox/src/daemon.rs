//! The ingest daemon behind `outbox inbox --database-url URL --source URL`: takes messages from
//! a broker into `inbox_messages` (and the processing queue) and acknowledges the broker only
//! after the insert committed.
//!
//! Loop: fetch a batch (up to `batch` messages, in the broker's order) → record it in **one**
//! transaction (`ingest_many`: `ON CONFLICT DO NOTHING`, new ones queued in the same
//! transaction) → commit → acknowledge the batch → fetch the next. Nothing is fetched before the
//! previous batch committed, so the database sets the pace (backpressure): a slow or restarting
//! database slows fetching, never piles messages up in memory. A batch whose commit fails is
//! retried as it is (same messages, same order) until it commits; a batch that cannot be
//! committed (shutdown, the daemon killed) is never acknowledged, so the broker delivers it
//! again, and the inbox's primary key absorbs whatever part of it had been recorded.
//!
//! **One daemon per source at a time** (PostgreSQL): a daemon holds a session-level advisory
//! lock on (schema, source) on the connection it ingests through, and others wait as standbys.
//! A killed daemon's connection closes and the lock goes with it; a standby takes over at once
//! and first brings back what the dead one fetched and never acknowledged
//! ([`crate::source::Source::recover`]), so a key's messages are ingested in the broker's order
//! across crashes. On SQLite run one daemon per file.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use outbox_core::{Backoff, ErrorKind, Result};
use outbox_db::Session;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::message::InboxMessage;
use crate::source::{AckToken, Source, SourceRetention};
use crate::telemetry::DaemonMetrics;
use crate::tx::InboxTx;

/// Default messages per batch (one transaction and one acknowledgement round per batch).
pub const DEFAULT_BATCH: usize = 500;

/// How the daemon fetches and waits.
#[derive(Debug, Clone)]
pub struct DaemonConfig {
    /// Messages per fetch and per transaction.
    pub batch: usize,
    /// Longest wait between fetches when the source is idle (it polls adaptively: at once
    /// after a full batch, 1 ms after a partial one, doubling while empty).
    pub poll_interval: Duration,
    /// The inbox retention (`processed_messages` and processed `inbox_messages`), to warn at
    /// start-up when the source keeps messages longer.
    pub retention: Duration,
}

impl Default for DaemonConfig {
    fn default() -> Self {
        Self {
            batch: DEFAULT_BATCH,
            poll_interval: Duration::from_millis(100),
            retention: crate::processor::DEFAULT_RETENTION,
        }
    }
}

/// Counters of a running daemon.
#[derive(Debug, Default)]
pub struct IngestMetrics {
    /// Messages fetched from the source (redeliveries included).
    pub fetched: AtomicU64,
    /// Messages recorded in the inbox for the first time.
    pub recorded: AtomicU64,
    /// Messages already in the inbox (redeliveries absorbed).
    pub duplicates: AtomicU64,
    /// Batches committed.
    pub batches: AtomicU64,
    /// Acknowledgement rounds that failed (their messages come again and are absorbed).
    pub ack_failures: AtomicU64,
    /// Beaten at every step of the daemon's loop (a fetch, a batch's commit attempt, its
    /// acknowledgement, a wait), for the `/livez` probe: a step is bounded by the source's
    /// fetch wait, the database's statement timeout or a backoff of at most 10 s.
    pub pulse: Arc<outbox_relay::Pulse>,
}

impl IngestMetrics {
    /// A counter's value.
    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}

/// The database the daemon writes to: an inbox, on any backend.
#[derive(Debug, Clone)]
pub struct InboxDb {
    db: crate::InboxDatabase,
}

impl InboxDb {
    /// The daemon's view of `db`.
    pub fn new(db: crate::InboxDatabase) -> Self {
        Self { db }
    }
}

/// The message `retention` of the inbox against what the source keeps, as a warning, if any.
pub fn retention_warning(
    source: &str,
    kept: SourceRetention,
    retention: Duration,
) -> Option<String> {
    let show = |d: Duration| humanize(d);
    match kept {
        SourceRetention::For(d) if d > retention => Some(format!(
            "source {source} keeps messages for {} but the inbox forgets processed messages \
             after {}: a message the broker delivers again after that would be processed \
             again; raise --retention above the source's longest redelivery window",
            show(d),
            show(retention)
        )),
        SourceRetention::Unlimited => Some(format!(
            "source {source} keeps messages without a time limit and the inbox forgets \
             processed messages after {}: acknowledged messages are not delivered again, but \
             a consumer reset to an earlier position would have messages older than that \
             processed again; set the stream's max_age, or raise --retention",
            show(retention)
        )),
        _ => None,
    }
}

fn humanize(d: Duration) -> String {
    let s = d.as_secs();
    if s >= 86_400 && s.is_multiple_of(86_400) {
        format!("{}d", s / 86_400)
    } else if s >= 3600 && s.is_multiple_of(3600) {
        format!("{}h", s / 3600)
    } else if s >= 60 && s.is_multiple_of(60) {
        format!("{}m", s / 60)
    } else {
        format!("{:?}", d)
    }
}

impl InboxDb {
    /// Records `messages` in one transaction on the session's connection; returns (recorded
    /// now, duplicates).
    async fn ingest(&self, session: &mut Session, messages: &[InboxMessage]) -> Result<(u64, u64)> {
        let mut tx = session.begin().await?;
        let flags = tx.ingest_messages(self.db.schema(), messages).await?;
        tx.commit().await?;
        let recorded = flags.iter().filter(|f| **f).count() as u64;
        Ok((recorded, flags.len() as u64 - recorded))
    }

    /// Connects and takes the source's lock, waiting as a standby while another daemon holds
    /// it. `None` when shut down first.
    async fn lock(
        &self,
        source: &str,
        shutdown: &CancellationToken,
        pulse: &outbox_relay::Pulse,
    ) -> Result<Option<Session>> {
        let name = format!(
            "outbox-inbox-source:{}:{source}",
            self.db.schema().tables().as_str()
        );
        let mut standby_logged = false;
        let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(10));
        loop {
            // Standing by, or waiting for the database, is a step of the loop like any other.
            pulse.beat();
            if shutdown.is_cancelled() {
                return Ok(None);
            }
            let delay = match self.db.tables().lock_session(&name).await {
                Ok(Some(session)) => {
                    if standby_logged {
                        info!(source, "took over the source: this daemon ingests now");
                    }
                    return Ok(Some(session));
                }
                Ok(None) => {
                    if !standby_logged {
                        info!(source, "another daemon ingests this source; standing by");
                        standby_logged = true;
                    }
                    // Standing by: look again every second.
                    backoff.succeeded();
                    Duration::from_secs(1)
                }
                Err(e) if e.kind() == ErrorKind::Config || e.kind() == ErrorKind::Schema => {
                    return Err(e)
                }
                Err(e) => {
                    let delay = backoff.failed();
                    warn!(source, error = %e, retry_in = ?delay, "database unreachable");
                    delay
                }
            };
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = shutdown.cancelled() => return Ok(None),
            }
        }
    }
}

/// Runs the daemon until `shutdown`: see the module documentation. Returns an error only for
/// what no retry can fix (configuration, a missing schema); outages are waited out.
pub async fn run(
    db: InboxDb,
    mut source: Box<dyn Source>,
    config: DaemonConfig,
    metrics: Arc<IngestMetrics>,
    shutdown: CancellationToken,
) -> Result<()> {
    let name = source.name().to_string();
    let m = DaemonMetrics::new(&name);
    let pulse = metrics.pulse.clone();
    info!(source = %source.describe(), batch = config.batch, "inbox ingest starting");
    match source.retention().await {
        Ok(kept) => {
            if let Some(w) = retention_warning(&name, kept, config.retention) {
                warn!("{w}");
            }
        }
        Err(e) => debug!(error = %e, "the source's retention is unknown"),
    }
    'session: loop {
        let Some(mut session) = db.lock(&name, &shutdown, &pulse).await? else {
            return Ok(());
        };
        // What a dead predecessor (or this daemon, before it lost its connection) fetched and
        // never acknowledged comes first.
        let mut backoff = Backoff::RECONNECT;
        loop {
            pulse.beat();
            match source.recover().await {
                Ok(()) => break,
                Err(e) => {
                    let wait = backoff.failed();
                    warn!(source = %name, error = %e, retry_in = ?wait, "source recovery failed");
                    tokio::select! {
                        _ = tokio::time::sleep(wait) => {}
                        _ = shutdown.cancelled() => return Ok(()),
                    }
                }
            }
        }
        let mut poll = Duration::ZERO;
        let mut fetch_backoff = Backoff::RECONNECT;
        while !shutdown.is_cancelled() {
            pulse.beat();
            if !poll.is_zero() {
                tokio::select! {
                    _ = tokio::time::sleep(poll) => {}
                    _ = shutdown.cancelled() => break,
                }
            }
            // Only the holder of the source lock may take messages from the broker. A database
            // restart ends the lock with its connection, and a standby may take over at once;
            // a daemon that fetched after that would take messages from under the new holder,
            // which goes on with newer ones while these wait for redelivery (seen: five
            // messages fetched by a daemon whose pull had hung through the restart came back
            // 2 s late, after 800 newer ones). One `SELECT 1` per batch rules that out.
            if !session.alive().await {
                warn!(source = %name, "lost the database connection and the source lock with it; fetching nothing until it is taken again");
                continue 'session;
            }
            // Nothing fetched is acknowledged before it commits, so a fetch may be dropped
            // half-way when asked to stop: the broker delivers it again.
            let fetched = tokio::select! {
                r = source.fetch(config.batch) => r,
                _ = shutdown.cancelled() => break,
            };
            pulse.beat();
            let batch = match fetched {
                Ok(b) => {
                    fetch_backoff.succeeded();
                    b
                }
                Err(e) => {
                    poll = fetch_backoff.failed();
                    warn!(source = %name, error = %e, retry_in = ?poll, "fetch failed");
                    continue;
                }
            };
            if batch.is_empty() {
                poll = (poll * 2)
                    .max(Duration::from_millis(1))
                    .min(config.poll_interval);
                continue;
            }
            poll = if batch.len() >= config.batch {
                Duration::ZERO
            } else {
                Duration::from_millis(1)
            };
            let n = batch.len() as u64;
            IngestMetrics::add(&metrics.fetched, n);
            m.received.increment(n);
            let (messages, acks): (Vec<InboxMessage>, Vec<AckToken>) =
                batch.into_iter().map(|d| (d.message, d.ack)).unzip();
            // Commit before anything is acknowledged; retry the batch as it is while the
            // connection (and with it the source lock) holds.
            let mut retry = Backoff::RECONNECT;
            let span = crate::spans::ReceiveSpan::start(&name, &messages);
            let (recorded, duplicates) = loop {
                let started = Instant::now();
                let ingested = db.ingest(&mut session, &messages).await;
                pulse.beat();
                match ingested {
                    Ok(r) => {
                        m.ingest_duration.record(started.elapsed().as_secs_f64());
                        break r;
                    }
                    Err(e) if e.kind() == ErrorKind::Config || e.kind() == ErrorKind::Schema => {
                        return Err(e)
                    }
                    Err(e) => {
                        let wait = retry.failed();
                        warn!(source = %name, error = %e, messages = n, retry_in = ?wait,
                              "recording the batch failed; it is not acknowledged until it commits");
                        tokio::select! {
                            _ = tokio::time::sleep(wait) => {}
                            // Unacknowledged: the broker delivers the batch again.
                            _ = shutdown.cancelled() => return Ok(()),
                        }
                        if !session.alive().await {
                            // The source lock went with the connection; another daemon may
                            // hold the source by now. Leave the batch unacknowledged and
                            // start over: lock (or stand by), recover, fetch.
                            warn!(source = %name, "lost the database connection and the source lock with it; the batch in hand is left to the broker");
                            continue 'session;
                        }
                    }
                }
            };
            span.end(Ok((recorded, duplicates)));
            IngestMetrics::add(&metrics.recorded, recorded);
            IngestMetrics::add(&metrics.duplicates, duplicates);
            IngestMetrics::add(&metrics.batches, 1);
            m.duplicates.increment(duplicates);
            let acked = source.ack(acks).await;
            pulse.beat();
            if let Err(e) = acked {
                IngestMetrics::add(&metrics.ack_failures, 1);
                m.ack_failures.increment(1);
                warn!(source = %name, error = %e, "acknowledging failed; those messages come again and are absorbed");
            }
            debug!(source = %name, fetched = n, recorded, duplicates, "batch ingested");
        }
        return Ok(());
    }
}

/// Runs [`crate::InboxDatabase::maintain`] now and every `every` until `shutdown`.
pub async fn housekeeping(
    db: crate::InboxDatabase,
    retention: Duration,
    every: Duration,
    shutdown: CancellationToken,
) {
    loop {
        match db.maintain(retention).await {
            Ok((m, p)) if m.segments_created + m.segments_dropped + p.total() > 0 => {
                info!(
                    segments_created = m.segments_created,
                    segments_dropped = m.segments_dropped,
                    inbox_rows_deleted = p.total(),
                    "inbox housekeeping"
                )
            }
            Ok(_) => {}
            Err(error) => warn!(%error, "inbox housekeeping failed; will try again"),
        }
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = shutdown.cancelled() => return,
        }
    }
}

impl IngestMetrics {
    fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retention_shorter_than_the_source_warns() {
        let day = Duration::from_secs(86_400);
        let w = retention_warning("nats:S", SourceRetention::For(day * 14), day * 7)
            .unwrap_or_default();
        assert!(w.contains("14d") && w.contains("7d"), "{w}");
        assert!(retention_warning("nats:S", SourceRetention::For(day), day * 7).is_none());
        assert!(retention_warning("nats:S", SourceRetention::Unlimited, day).is_some());
        assert!(retention_warning("redis:s", SourceRetention::Unknown, day).is_none());
    }
}
