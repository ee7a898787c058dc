//! Commit→ack latency measured at the broker, by a consumer independent of the relay.
//!
//! How: the producer stamps, on this process's monotonic clock, the instant just before it
//! sends `COMMIT`, and records it per message id once the commit returned; an ordered,
//! headers-only JetStream consumer of its own on the bench stream stamps the instant each
//! message reaches it and looks the id up (`Nats-Msg-Id`). Latency = receive − that stamp.
//! Nothing is read from the outbox table, and the payload the relay carries is untouched.
//!
//! Why these stamps: one process and one clock, so no skew. A row cannot become visible to the
//! relay before its `COMMIT` was sent, so a sample is never shorter than the truth; it includes
//! the commit's own WAL flush, which is reported beside it (`commit_p50_ms`) for readers who
//! want to subtract it. A stamp taken after `COMMIT` returned would flatter instead: on two
//! busy cores the producer task is sometimes scheduled only after the relay has already
//! published the row (3% of samples in a steady run with LISTEN here). The receive stamp
//! includes the broker's delivery to the consumer, which also errs on the slow side.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use async_nats::jetstream;
use futures::StreamExt;
use serde::Serialize;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// Longest [`Latency::wait_received`] waits for a reader that keeps making progress.
const READ_BACK_LIMIT: Duration = Duration::from_secs(1800);

/// Percentiles of the matched samples, and how trustworthy they are.
#[derive(Debug, Clone, Default, Serialize)]
pub struct LatencyFigures {
    /// Messages received whose commit was recorded (each counted once).
    pub samples: u64,
    /// Median commit→ack-at-the-broker, in milliseconds.
    pub p50_ms: f64,
    /// 99th percentile, in milliseconds.
    pub p99_ms: f64,
    /// Slowest sample, in milliseconds.
    pub max_ms: f64,
    /// Median time `COMMIT` took to return (included in every sample above).
    pub commit_p50_ms: f64,
    /// Deliveries with no commit to match: duplicates, or ids this run did not write.
    pub unmatched: u64,
    /// The same figures per minute of commits, for a run of two minutes or more: a tail that
    /// grows as the run goes on (a cache or a log filling) shows here, where the whole run's
    /// p99 only averages it in.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub by_minute: Vec<WindowFigures>,
}

/// Commit→ack over the commits sent in one window of a run.
#[derive(Debug, Clone, Default, Serialize)]
pub struct WindowFigures {
    /// Seconds from the run's start (its first commit) to the window's start.
    pub from_s: u64,
    /// Samples whose `COMMIT` was sent in the window.
    pub samples: u64,
    /// Median, in milliseconds.
    pub p50_ms: f64,
    /// 99th percentile, in milliseconds.
    pub p99_ms: f64,
    /// Slowest sample, in milliseconds.
    pub max_ms: f64,
}

impl LatencyFigures {
    /// `p50 … ms, p99 … ms, max … ms (COMMIT itself: … ms)` for the text report.
    pub fn line(&self) -> String {
        let mut s = format!(
            "p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms (COMMIT itself p50 {:.1} ms)",
            self.p50_ms, self.p99_ms, self.max_ms, self.commit_p50_ms
        );
        if self.unmatched > 0 {
            s.push_str(&format!(", {} unmatched deliveries", self.unmatched));
        }
        if !self.by_minute.is_empty() {
            let p99: Vec<String> = self
                .by_minute
                .iter()
                .map(|w| format!("{:.1}", w.p99_ms))
                .collect();
            s.push_str(&format!("; p99 by minute: {} ms", p99.join(" ")));
        }
        s
    }
}

/// An instant on a ledger's clock: microseconds since the ledger was made.
#[derive(Debug, Clone, Copy)]
pub struct Stamp(u64);

/// Commit stamps not yet matched, receive stamps not yet matched, and the samples.
#[derive(Default)]
struct Ledger {
    /// Committed ids not received yet: when their COMMIT was sent.
    committed: HashMap<Uuid, u64>,
    /// Received ids whose commit is not recorded (yet): when they arrived.
    early: HashMap<Uuid, u64>,
    /// Matched samples: when the COMMIT was sent and the latency, both in µs.
    samples: Vec<(u64, u64)>,
    /// COMMIT round trips in µs, one per transaction.
    commits: Vec<u64>,
    /// Ids registered ahead of their commit ([`Latency::expect`]), not received yet: their
    /// transaction's number in `expected_sent`.
    expected: HashMap<Uuid, usize>,
    /// Per registered transaction: when its COMMIT was sent (once recorded), and how many of
    /// its ids are not received yet.
    expected_sent: Vec<(Option<u64>, u64)>,
    /// Registered ids received before their commit was recorded: (transaction, when).
    expected_early: Vec<(usize, u64)>,
    /// Registered ids whose commit is recorded and which are not received yet.
    expected_outstanding: u64,
}

/// A transaction's ids registered before its commit ([`Latency::expect`]).
#[derive(Debug, Clone, Copy)]
pub struct Expected(usize);

/// The shared ledger of one run: producers call [`Latency::committed`], the probe's consumer
/// records receipts.
pub struct Latency {
    base: Instant,
    ledger: Mutex<Ledger>,
}

impl Latency {
    fn new() -> Self {
        Self {
            base: Instant::now(),
            ledger: Mutex::new(Ledger::default()),
        }
    }

    /// Now, on this ledger's clock. Take it just before sending `COMMIT`.
    pub fn stamp(&self) -> Stamp {
        Stamp(u64::try_from(self.base.elapsed().as_micros()).unwrap_or(u64::MAX))
    }

    fn ledger(&self) -> MutexGuard<'_, Ledger> {
        // A poisoned ledger only means a task panicked mid-update; the counts stay usable.
        self.ledger.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records that the transaction which wrote `ids` committed; `sent` is the stamp taken
    /// just before its `COMMIT` was sent. Call it once the commit returned.
    pub fn committed(&self, ids: impl IntoIterator<Item = Uuid>, sent: Stamp) {
        let returned = self.stamp().0;
        let mut l = self.ledger();
        l.commits.push(returned.saturating_sub(sent.0));
        for id in ids {
            match l.early.remove(&id) {
                Some(received) => l.samples.push((sent.0, received.saturating_sub(sent.0))),
                None => {
                    l.committed.insert(id, sent.0);
                }
            }
        }
    }

    /// Waits until every recorded commit was received, or nothing more arrived for `stall`, or
    /// [`READ_BACK_LIMIT`] passed; returns how many are still outstanding (0 when all arrived).
    ///
    /// A reader slower than the relay (an emulator serving the reads, an SNS fan-out to a
    /// queue) is given the time it needs while it makes progress; a missing message still ends
    /// the wait after `stall`.
    pub async fn wait_received(&self, stall: Duration) -> u64 {
        let give_up = tokio::time::Instant::now() + READ_BACK_LIMIT;
        let mut last = self.outstanding();
        let mut last_progress = tokio::time::Instant::now();
        loop {
            let left = self.outstanding();
            let now = tokio::time::Instant::now();
            if left < last {
                last = left;
                last_progress = now;
            }
            if left == 0 || now >= give_up || now >= last_progress + stall {
                return left;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Registers the ids of a transaction before its `COMMIT`, so that recording the commit
    /// ([`Latency::committed_expected`]) costs nothing per id. For a big transaction: recording
    /// a million ids after the commit held the ledger's lock while it inserted every one, with
    /// the reader blocked on it, and stalled the runtime the relay under test shares.
    /// Register them as they are written, a chunk at a time ([`Latency::expect_more`]), so the
    /// ledger is never held for long.
    pub fn expect(&self) -> Expected {
        let mut l = self.ledger();
        l.expected_sent.push((None, 0));
        Expected(l.expected_sent.len() - 1)
    }

    /// Registers more ids of the transaction `tx`, before its commit.
    pub fn expect_more(&self, tx: Expected, ids: impl IntoIterator<Item = Uuid>) {
        let mut l = self.ledger();
        let mut n = 0;
        for id in ids {
            l.expected.insert(id, tx.0);
            n += 1;
        }
        if let Some(slot) = l.expected_sent.get_mut(tx.0) {
            slot.1 += n;
        }
    }

    /// Records that the transaction registered as `tx` committed; `sent` is the stamp taken
    /// just before its `COMMIT` was sent. Call it once the commit returned.
    pub fn committed_expected(&self, tx: Expected, sent: Stamp) {
        let returned = self.stamp().0;
        let mut l = self.ledger();
        l.commits.push(returned.saturating_sub(sent.0));
        let Some(slot) = l.expected_sent.get_mut(tx.0) else {
            return;
        };
        slot.0 = Some(sent.0);
        let left = slot.1;
        l.expected_outstanding += left;
        let (mine, others): (Vec<_>, Vec<_>) = std::mem::take(&mut l.expected_early)
            .into_iter()
            .partition(|(t, _)| *t == tx.0);
        l.expected_early = others;
        for (_, at) in mine {
            l.samples.push((sent.0, at.saturating_sub(sent.0)));
        }
    }

    /// Records that `id` reached the broker (or, for the bench's discarding sink, was
    /// acknowledged) now.
    pub fn received(&self, id: Uuid) {
        let at = self.stamp().0;
        let mut l = self.ledger();
        if let Some(sent) = l.committed.remove(&id) {
            l.samples.push((sent, at.saturating_sub(sent)));
            return;
        }
        let Some(tx) = l.expected.remove(&id) else {
            l.early.insert(id, at);
            return;
        };
        let slot = &mut l.expected_sent[tx];
        slot.1 = slot.1.saturating_sub(1);
        match slot.0 {
            Some(sent) => {
                l.expected_outstanding = l.expected_outstanding.saturating_sub(1);
                l.samples.push((sent, at.saturating_sub(sent)));
            }
            None => l.expected_early.push((tx, at)),
        }
    }

    /// Messages whose commit and receipt are both recorded: rows of this ledger that reached
    /// the broker (receipts of ids it never records, as another load's, are not counted).
    pub fn delivered(&self) -> u64 {
        self.ledger().samples.len() as u64
    }

    /// Committed messages not received yet.
    pub fn outstanding(&self) -> u64 {
        let l = self.ledger();
        l.committed.len() as u64 + l.expected_outstanding
    }

    /// Percentiles over every sample so far.
    pub fn figures(&self) -> LatencyFigures {
        let l = self.ledger();
        let mut s: Vec<u64> = l.samples.iter().map(|&(_, us)| us).collect();
        s.sort_unstable();
        let mut c = l.commits.clone();
        c.sort_unstable();
        LatencyFigures {
            samples: s.len() as u64,
            p50_ms: ms(percentile(&s, 0.50)),
            p99_ms: ms(percentile(&s, 0.99)),
            max_ms: ms(s.last().copied().unwrap_or(0)),
            commit_p50_ms: ms(percentile(&c, 0.50)),
            unmatched: l.early.len() as u64,
            by_minute: by_minute(&l.samples),
        }
    }
}

/// Width of the windows in [`LatencyFigures::by_minute`], in µs (a minute).
const WINDOW_US: u64 = 60_000_000;

fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

/// Figures per minute of commit time, from the first commit; none unless the samples span at
/// least two minutes. A last minute holding under half the samples of a full one (the load
/// stopped early in it) is left out: its few samples would read as a trend.
fn by_minute(samples: &[(u64, u64)]) -> Vec<WindowFigures> {
    let Some(first) = samples.iter().map(|&(sent, _)| sent).min() else {
        return Vec::new();
    };
    let mut windows: Vec<Vec<u64>> = Vec::new();
    for &(sent, us) in samples {
        let i = ((sent - first) / WINDOW_US) as usize;
        if i >= windows.len() {
            windows.resize_with(i + 1, Vec::new);
        }
        windows[i].push(us);
    }
    let full = windows.first().map_or(0, Vec::len);
    if windows.last().is_some_and(|w| w.len() * 2 < full) {
        windows.pop();
    }
    if windows.len() < 2 {
        return Vec::new();
    }
    windows
        .into_iter()
        .enumerate()
        .map(|(i, mut w)| {
            w.sort_unstable();
            WindowFigures {
                from_s: i as u64 * WINDOW_US / 1_000_000,
                samples: w.len() as u64,
                p50_ms: ms(percentile(&w, 0.50)),
                p99_ms: ms(percentile(&w, 0.99)),
                max_ms: ms(w.last().copied().unwrap_or(0)),
            }
        })
        .collect()
}

/// Nearest-rank percentile of sorted `s` (0 when empty).
fn percentile(s: &[u64], p: f64) -> u64 {
    if s.is_empty() {
        return 0;
    }
    let rank = (p * s.len() as f64).ceil() as usize;
    s[rank.clamp(1, s.len()) - 1]
}

/// An independent consumer on the bench stream feeding a [`Latency`] ledger.
pub struct Probe {
    latency: Arc<Latency>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Probe {
    /// Starts an ordered, headers-only consumer from the start of `stream`. Start it before
    /// anything is published.
    pub async fn start(js: &jetstream::Context, stream: &str) -> anyhow::Result<Self> {
        let consumer = js
            .get_stream(stream)
            .await
            .context("opening the bench stream for the latency probe")?
            .create_consumer(jetstream::consumer::pull::OrderedConfig {
                headers_only: true,
                ..Default::default()
            })
            .await
            .context("creating the latency probe's consumer")?;
        let mut messages = consumer.messages().await?;
        let latency = Arc::new(Latency::new());
        let stop = CancellationToken::new();
        let (l, s) = (latency.clone(), stop.clone());
        let task = tokio::spawn(async move {
            loop {
                let next = tokio::select! {
                    m = messages.next() => m,
                    _ = s.cancelled() => return,
                };
                match next {
                    Some(Ok(m)) => {
                        let id = m
                            .headers
                            .as_ref()
                            .and_then(|h| h.get("Nats-Msg-Id"))
                            .and_then(|v| v.as_str().parse::<Uuid>().ok());
                        if let Some(id) = id {
                            l.received(id);
                        }
                    }
                    // The ordered consumer recreates itself after a gap; keep reading.
                    Some(Err(error)) => tracing::warn!(%error, "latency probe: consumer error"),
                    None => return,
                }
            }
        });
        Ok(Self {
            latency,
            stop,
            task,
        })
    }

    /// Feeds the ledger from a sink's own reader (any broker). Receipts are stamped when a poll
    /// returns, so latency is coarser than the NATS probe's by up to the poll's wait.
    pub fn from_reader(mut reader: Box<dyn outbox_sinks::read::Reader>) -> Self {
        let latency = Arc::new(Latency::new());
        let stop = CancellationToken::new();
        let (l, s) = (latency.clone(), stop.clone());
        let task = tokio::spawn(async move {
            while !s.is_cancelled() {
                let polled = tokio::select! {
                    p = reader.poll(Duration::from_millis(20)) => p,
                    _ = s.cancelled() => break,
                };
                for d in polled.delivered {
                    l.received(d.id);
                }
            }
            reader.cleanup().await;
        });
        Self {
            latency,
            stop,
            task,
        }
    }

    /// A probe with no consumer of its own: whoever holds [`Probe::latency`] records the
    /// receipts (the bench's discarding sink, at its acknowledgement).
    pub fn recorded_elsewhere() -> Self {
        Self {
            latency: Arc::new(Latency::new()),
            stop: CancellationToken::new(),
            task: tokio::spawn(async {}),
        }
    }

    /// The ledger producers record commits into.
    pub fn latency(&self) -> Arc<Latency> {
        self.latency.clone()
    }

    /// Waits until every recorded commit was received ([`Latency::wait_received`]); returns
    /// how many are still outstanding (0 when all arrived).
    pub async fn drain(&self, stall: Duration) -> u64 {
        self.latency.wait_received(stall).await
    }

    /// Stops the consumer; returns the figures.
    pub async fn finish(mut self) -> LatencyFigures {
        self.stop.cancel();
        let _ = (&mut self.task).await;
        self.latency.figures()
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reader that keeps delivering is waited for past `stall`; one that stops is not.
    #[tokio::test]
    async fn the_read_back_waits_while_messages_keep_arriving() {
        let latency = Arc::new(Latency::new());
        let ids: Vec<Uuid> = (0..4).map(|_| Uuid::now_v7()).collect();
        latency.committed(ids.clone(), latency.stamp());
        let feeder = latency.clone();
        let arriving = ids[..3].to_vec();
        tokio::spawn(async move {
            for id in arriving {
                tokio::time::sleep(Duration::from_millis(300)).await;
                feeder.received(id);
            }
        });
        let started = tokio::time::Instant::now();
        let left = latency.wait_received(Duration::from_millis(500)).await;
        // Three arrived 300 ms apart, the last after 900 ms: a fixed 500 ms wait would have
        // left 3. The fourth never came.
        assert_eq!(left, 1);
        assert!(started.elapsed() >= Duration::from_millis(900));
        assert!(started.elapsed() < READ_BACK_LIMIT);
    }

    /// Samples are grouped by when their commit was sent; a short last window is left out, and
    /// a run inside one window reports none.
    #[test]
    fn figures_per_window_follow_the_commit_time() {
        let min = 60_000_000u64;
        // Minute 0: 100 samples of 1..=100 ms; minute 1: 100 of 10 ms but one of 500 ms;
        // minute 2: 10 samples (the load stopped), left out.
        let mut samples: Vec<(u64, u64)> = (1..=100).map(|i| ((i - 1) * 1000, i * 1000)).collect();
        samples.extend((0..99).map(|i| (min + i * 1000, 10_000)));
        samples.push((min + 500, 500_000));
        samples.extend((0..10).map(|i| (2 * min + i, 1_000)));
        let w = by_minute(&samples);
        assert_eq!(w.len(), 2);
        assert_eq!((w[0].from_s, w[0].samples, w[0].p99_ms), (0, 100, 99.0));
        assert_eq!((w[1].from_s, w[1].samples, w[1].p99_ms), (60, 100, 10.0));
        assert_eq!(w[1].max_ms, 500.0);
        assert!(by_minute(&samples[..100]).is_empty());
        assert!(by_minute(&[]).is_empty());
    }

    #[test]
    fn nearest_rank_percentiles() {
        let s: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&s, 0.5), 50);
        assert_eq!(percentile(&s, 0.99), 99);
        assert_eq!(percentile(&s, 1.0), 100);
        assert_eq!(percentile(&[7], 0.99), 7);
        assert_eq!(percentile(&[], 0.5), 0);
    }

    /// Ids registered before their commit are outstanding only once it is recorded, and a
    /// receipt that came between the commit and its recording still gives a sample.
    #[test]
    fn ids_registered_before_their_commit_are_matched_either_way() {
        let l = Latency::new();
        let ids: Vec<Uuid> = (0..3).map(|_| Uuid::now_v7()).collect();
        let tx = l.expect();
        l.expect_more(tx, ids[..2].iter().copied());
        l.expect_more(tx, [ids[2]]);
        assert_eq!(l.outstanding(), 0, "not committed yet");
        let sent = l.stamp();
        l.received(ids[0]); // arrived before the commit was recorded
        l.committed_expected(tx, sent);
        assert_eq!((l.outstanding(), l.delivered()), (2, 1));
        l.received(ids[1]);
        l.received(ids[2]);
        let f = l.figures();
        assert_eq!((l.outstanding(), f.samples, f.unmatched), (0, 3, 0));
    }

    #[test]
    fn receipts_match_commits_in_either_order() {
        let l = Latency::new();
        let (a, b, c) = (Uuid::now_v7(), Uuid::now_v7(), Uuid::now_v7());
        let sent = l.stamp();
        l.committed([a], sent);
        l.received(a);
        let sent = l.stamp();
        l.received(b); // before the producer recorded its commit
        l.committed([b, c], sent);
        l.received(a); // a duplicate
        let f = l.figures();
        assert_eq!(f.samples, 2);
        assert_eq!(f.unmatched, 1);
        assert_eq!(l.outstanding(), 1);
    }
}
