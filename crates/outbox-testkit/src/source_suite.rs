//! The inbox source conformance suite: behaviour every source of `outbox inbox` must show
//! against its real broker, written once and run per source (after the sink suite). A test
//! file expands [`source_conformance_suite!`](crate::source_conformance_suite) with a
//! [`SourceFixture`] and the `outbox` binary's command, and gets one `#[tokio::test]` per case.
//!
//! Messages are published by the relay's own sink for the broker (`outbox_sinks::connect`),
//! with the relay's headers ([`crate::relay::envelope`]); the source is the daemon's own
//! (`outbox_inbox::source::open`). Two cases use the source directly (every message once, in
//! order, and acknowledging drains the broker; what a dead consumer took comes back first);
//! two run the `outbox inbox` daemon as users do (a bad source URL; `kill -9` mid-stream). What
//! a fixture knows of its broker (making a channel, a consumer that dies, whether the broker
//! is drained) is its own; the cases are here. New source behaviour goes here, not into one
//! broker's tests.

// Test code: a failed expectation should panic with its message.
#![allow(clippy::unwrap_used)]

use std::collections::{HashMap, HashSet};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use outbox_core::{Envelope, Sink};
use outbox_inbox::source::{Delivery, Source, SourceOptions};
use uuid::Uuid;

use crate::inbox_backends::{MysqlInbox, PgInbox, SqliteInbox};
use crate::inbox_suite::InboxBackend;
use crate::process::{sigterm, try_wait_exit, wait_exit};

/// Generous limits: the cases wait for outcomes, they do not time them.
const WAIT: Duration = Duration::from_secs(120);

/// The password every [`Mistake`] that carries one uses; no error may show it.
pub const SECRET: &str = "hunter2";

/// The event type of every test message ([`crate::relay::envelope`]).
pub const MESSAGE_TYPE: &str = "changed";

/// The order a source keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// One sequence for the whole channel (a NATS stream, a Redis stream, a RabbitMQ queue, an
    /// MQTT session): what a dead consumer took comes back before anything else.
    Total,
    /// Per key only (Kafka partitions, SQS FIFO message groups): what a dead consumer took
    /// comes back before anything newer of its key.
    PerKey,
    /// None (an SQS standard queue): every message, in any order.
    None,
}

/// The size of the source-level cases' workloads.
#[derive(Debug, Clone, Copy)]
pub struct Scale {
    /// Keys.
    pub keys: usize,
    /// Messages per key.
    pub per_key: usize,
    /// How many messages the dead consumer takes.
    pub dead_takes: usize,
    /// The source's batch (messages per fetch).
    pub batch: usize,
}

/// The size of the daemon case's workload.
#[derive(Debug, Clone, Copy)]
pub struct DaemonScale {
    /// Keys.
    pub keys: usize,
    /// Messages per key published before the first daemon starts.
    pub per_key: usize,
    /// The first daemon is killed once this many messages are in the inbox.
    pub kill_after: i64,
    /// Messages per key published while no daemon runs.
    pub more_per_key: usize,
    /// The daemon's `--batch-size`.
    pub batch: usize,
}

/// A source URL the daemon must refuse, and what its error must say.
#[derive(Debug, Clone)]
pub struct Mistake {
    /// The URL (with [`SECRET`] in it where it has a password or an option value).
    pub url: String,
    /// A part of the error message that names the problem.
    pub says: String,
}

impl Mistake {
    /// `url` must fail with an error containing `says`.
    pub fn new(url: impl Into<String>, says: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            says: says.into(),
        }
    }
}

/// What a case needs to know about one source and its broker.
#[async_trait]
pub trait SourceFixture: Send + Sync {
    /// A fresh channel on the shared broker, with a random suffix (a stream, a topic, a queue,
    /// an MQTT session), ready to be published to.
    async fn channel(&self, tag: &str) -> Box<dyn Channel>;

    /// The order the source keeps.
    fn order(&self) -> Order {
        Order::Total
    }

    /// The source-level workload: 5 keys × 40, the dead consumer takes 30, batches of 100.
    fn scale(&self) -> Scale {
        Scale {
            keys: 5,
            per_key: 40,
            dead_takes: 30,
            batch: 100,
        }
    }

    /// The daemon case's workload: 20 keys × 150 (3,000), killed after 600, 20 × 10 more
    /// while down, batches of 100.
    fn daemon_scale(&self) -> DaemonScale {
        DaemonScale {
            keys: 20,
            per_key: 150,
            kill_after: 600,
            more_per_key: 10,
            batch: 100,
        }
    }

    /// Source URLs the daemon must refuse.
    fn mistakes(&self) -> Vec<Mistake>;
}

/// One channel of a broker: where the relay's sink publishes and where the source reads.
#[async_trait]
pub trait Channel: Send {
    /// The source URL the daemon reads it with (its default consumer, group or session).
    fn source_url(&self) -> String;

    /// The URL of the relay's sink that publishes to it.
    fn sink_url(&self) -> String;

    /// The destination the sink publishes to (a subject, topic, queue, stream).
    fn destination(&self) -> String;

    /// A consumer of the daemon's group, durable or session that takes the first `n`
    /// messages and dies without acknowledging them. Returns their ids in the order taken.
    /// By default the source itself, opened with a batch of `n` on
    /// [`Channel::dead_consumer_url`] and dropped.
    async fn take_and_die(&mut self, n: usize) -> Vec<Uuid> {
        let url = self.dead_consumer_url();
        let mut source = open(&url, n).await;
        source.recover().await.unwrap();
        let got = fetch_until(source.as_mut(), n, n, WAIT).await;
        assert_eq!(got.len(), n, "the dead consumer's messages");
        got.iter().map(|d| d.message.id).collect()
    }

    /// The source URL of the dead consumer (another consumer name where the broker has them).
    fn dead_consumer_url(&self) -> String {
        self.source_url()
    }

    /// Waits until the broker holds nothing for the daemon's consumer (nothing undelivered,
    /// nothing unacknowledged) and `published` messages went through; panics after a limit.
    /// Called once no consumer runs.
    async fn assert_drained(&mut self, published: usize);

    /// Waits, while a restarted daemon runs, until what a killed consumer had taken and never
    /// acknowledged has come back and been taken again. Brokers that redeliver at once need
    /// nothing (the default); SQS redelivers only after the visibility timeout, which can end
    /// after everything else was ingested.
    async fn await_redelivery(&mut self) {}

    /// Removes the channel from the broker.
    async fn cleanup(self: Box<Self>);
}

/// Expands to a module `$name` with one `#[tokio::test]` per source case, each with a fresh
/// fixture from `$fixture()`; `$outbox()` is the `outbox` binary's command (a clean
/// environment). The daemon case runs on PostgreSQL; `also [case, …]` adds cases beyond the
/// four (`…_in_sqlite`, `…_in_mysql`: the daemon case into SQLite, into MariaDB).
#[macro_export]
macro_rules! source_conformance_suite {
    ($name:ident, $fixture:path, $outbox:path $(; also [$($also:ident),* $(,)?])?) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            $crate::__source_cases!($fixture, $outbox;
                messages_arrive_once_each_in_order_and_ack_drains_them
                what_a_dead_consumer_took_comes_back_first
                a_bad_source_url_is_a_clear_error_without_the_password
                the_daemon_killed_mid_stream_and_restarted_loses_nothing_and_records_nothing_twice
                $($($also)*)?
            );
        }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __source_cases {
    ($fixture:path, $outbox:path; $($case:ident)*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                $crate::source_suite::$case(&$fixture(), $outbox).await;
            }
        )*
    };
}

/// The daemon's source for `url`, fetching `batch` at a time.
pub async fn open(url: &str, batch: usize) -> Box<dyn Source> {
    outbox_inbox::source::open(url, &SourceOptions { batch })
        .await
        .unwrap_or_else(|e| panic!("open the source {url}: {e}"))
}

/// Fetches from `source`, `batch` at a time, until `n` deliveries came (or `limit` passed:
/// then panics); acknowledges nothing. Empty fetches and fetch errors (a broker still
/// settling) are waited through.
pub async fn fetch_until(
    source: &mut dyn Source,
    n: usize,
    batch: usize,
    limit: Duration,
) -> Vec<Delivery> {
    let deadline = Instant::now() + limit;
    let mut got = Vec::new();
    while got.len() < n {
        assert!(
            Instant::now() < deadline,
            "{} of {n} messages from {} within {limit:?}",
            got.len(),
            source.describe()
        );
        match source.fetch(batch.min(n - got.len())).await {
            Ok(more) => got.extend(more),
            Err(e) => {
                eprintln!("fetch from {}: {e}; again", source.describe());
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    got
}

/// One delivery as the cases check it.
#[derive(Debug, Clone)]
pub struct Got {
    /// The message id.
    pub id: Uuid,
    /// Its key.
    pub key: String,
    /// `n` of its payload.
    pub n: i64,
}

/// Fetches `batch` at a time and acknowledges each batch, until `distinct` distinct messages
/// came; every delivery, in order. Checks each one's type, key and payload against `sent`.
async fn read_acking(
    source: &mut dyn Source,
    sent: &HashMap<Uuid, Envelope>,
    distinct: usize,
    batch: usize,
) -> Vec<Got> {
    let deadline = Instant::now() + WAIT;
    let mut out: Vec<Got> = Vec::new();
    let mut seen = HashSet::new();
    while seen.len() < distinct {
        assert!(
            Instant::now() < deadline,
            "{} of {distinct} messages from {} within {WAIT:?}",
            seen.len(),
            source.describe()
        );
        let got = match source.fetch(batch).await {
            Ok(got) => got,
            Err(e) => {
                eprintln!("fetch from {}: {e}; again", source.describe());
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        let mut acks = Vec::new();
        for d in got {
            let m = &d.message;
            let e = sent
                .get(&m.id)
                .unwrap_or_else(|| panic!("{} delivered an unknown message {}", m.source, m.id));
            assert_eq!(m.message_type, MESSAGE_TYPE, "{}", m.id);
            assert_eq!(m.key, e.key, "{}", m.id);
            let n = m.payload["n"].as_i64().unwrap();
            assert_eq!(
                m.payload,
                serde_json::from_slice::<serde_json::Value>(&e.payload).unwrap()
            );
            assert!(!m.source.is_empty());
            seen.insert(m.id);
            out.push(Got {
                id: m.id,
                key: m.key.clone(),
                n,
            });
            acks.push(d.ack);
        }
        source.ack(acks).await.unwrap();
    }
    out
}

/// Asserts that each key's messages came as n = `from[key]`, `from[key]` + 1, … with no gap
/// and no repeat.
fn assert_in_key_order(got: &[Got], from: &HashMap<String, i64>) {
    let mut next = from.clone();
    for g in got {
        let expect = next.entry(g.key.clone()).or_insert(0);
        assert_eq!(
            g.n, *expect,
            "key {}: got n = {}, expected {expect}",
            g.key, g.n
        );
        *expect += 1;
    }
}

/// `per_key` messages for each of `keys` keys (`k0`, `k1`, …) to `destination`, interleaved,
/// `n` counting from `first`: envelopes as the relay hands them to its sink.
pub fn workload(destination: &str, keys: usize, per_key: usize, first: usize) -> Vec<Envelope> {
    (first..first + per_key)
        .flat_map(|n| {
            (0..keys).map(move |k| crate::relay::envelope(destination, &format!("k{k}"), n as u64))
        })
        .collect()
}

/// Publishes `msgs` to `ch` through the relay's own sink, in order, as the relay calls it: each
/// call holds a key at most once (a sink may send a call's messages concurrently), and at most
/// ten messages. A call that fails (a sink still connecting) is made again.
pub async fn publish(ch: &dyn Channel, msgs: &[Envelope]) {
    let url = ch.sink_url();
    let sink = outbox_sinks::connect(&url)
        .await
        .unwrap_or_else(|e| panic!("the relay's sink {url}: {e}"));
    publish_with(sink.as_ref(), msgs).await;
}

/// [`publish`] through `sink`.
pub async fn publish_with(sink: &dyn Sink, msgs: &[Envelope]) {
    let mut start = 0;
    while start < msgs.len() {
        let mut end = start;
        let mut keys = HashSet::new();
        while end < msgs.len() && end - start < 10 && keys.insert(msgs[end].key.as_str()) {
            end += 1;
        }
        let call = &msgs[start..end];
        let deadline = Instant::now() + WAIT;
        loop {
            let results = sink.publish(call).await;
            if results.iter().all(Result::is_ok) {
                break;
            }
            assert!(Instant::now() < deadline, "publishing: {results:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        start = end;
    }
}

/// Once everything was read and acknowledged: a further fetch gets nothing (nothing more,
/// nothing again), and while it waits the source's client sends the last acknowledgements
/// (an MQTT client queues its PUBACKs for its event loop). Then the source goes away.
async fn nothing_more(mut source: Box<dyn Source>, batch: usize) {
    let more = source.fetch(batch).await.unwrap();
    assert!(
        more.is_empty(),
        "after everything was acknowledged: {more:?}"
    );
}

fn by_id(msgs: &[Envelope]) -> HashMap<Uuid, Envelope> {
    msgs.iter().map(|e| (e.id, e.clone())).collect()
}

/// Every message published arrives once, with the relay's type and key and its payload, each
/// key in publish order (where the broker keeps order); acknowledging each batch drains the
/// broker: a further fetch gets nothing, and the broker holds nothing for the consumer.
pub async fn messages_arrive_once_each_in_order_and_ack_drains_them(
    f: &dyn SourceFixture,
    _outbox: fn() -> Command,
) {
    read_everything(f, "order", false).await;
}

/// A consumer of the daemon's group, durable or session takes the first messages and dies
/// without acknowledging them. The source opened again brings them back before anything else
/// (of their key, where the broker orders per key), then the rest: every message once, each
/// key in publish order, and the broker drained.
pub async fn what_a_dead_consumer_took_comes_back_first(
    f: &dyn SourceFixture,
    _outbox: fn() -> Command,
) {
    read_everything(f, "dead", true).await;
}

/// Publishes the fixture's workload to a fresh channel; when `dead`, a consumer takes the first
/// messages and dies unacknowledged. Then the source reads everything, acknowledging each batch:
/// every message once, each key in publish order (where the broker keeps order), the dead
/// consumer's first (before anything else where the broker keeps one order), nothing more
/// after, and the broker drained.
async fn read_everything(f: &dyn SourceFixture, tag: &str, dead: bool) {
    let mut ch = f.channel(tag).await;
    let s = f.scale();
    let msgs = workload(&ch.destination(), s.keys, s.per_key, 0);
    publish(ch.as_ref(), &msgs).await;
    let taken = if dead {
        ch.take_and_die(s.dead_takes).await
    } else {
        Vec::new()
    };
    let mut source = open(&ch.source_url(), s.batch).await;
    source.recover().await.unwrap();
    let got = read_acking(source.as_mut(), &by_id(&msgs), msgs.len(), s.batch).await;
    let distinct: HashSet<Uuid> = got.iter().map(|g| g.id).collect();
    assert_eq!(distinct.len(), msgs.len(), "every message");
    if f.order() == Order::Total {
        let first: HashSet<Uuid> = got[..taken.len()].iter().map(|g| g.id).collect();
        assert_eq!(
            first,
            taken.iter().copied().collect::<HashSet<_>>(),
            "the dead consumer's messages come back before anything else"
        );
    }
    if f.order() != Order::None {
        assert_eq!(got.len(), msgs.len(), "no message twice");
        assert_in_key_order(&got, &HashMap::new());
    }
    nothing_more(source, s.batch).await;
    ch.assert_drained(msgs.len()).await;
    ch.cleanup().await;
}

/// Each URL of the fixture's [`SourceFixture::mistakes`] stops `outbox inbox` with a failure
/// whose error names the problem, and nothing it prints shows the password.
pub async fn a_bad_source_url_is_a_clear_error_without_the_password(
    f: &dyn SourceFixture,
    outbox: fn() -> Command,
) {
    let b = PgInbox::start().await;
    for m in f.mistakes() {
        let mut child = daemon_command(outbox, &b, &m.url, 10)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let status = tokio::task::block_in_place(|| try_wait_exit(&mut child, WAIT));
        if status.is_none() {
            let _ = child.kill();
        }
        let mut err = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
        let status = status.unwrap_or_else(|| panic!("{}: still running after {WAIT:?}", m.url));
        assert!(!status.success(), "{}: {err}", m.url);
        assert!(
            err.contains(&m.says),
            "{}: `{}` not in: {err}",
            m.url,
            m.says
        );
        assert!(
            !err.contains(SECRET),
            "{}: the password shows: {err}",
            m.url
        );
    }
    b.teardown().await;
}

/// `outbox inbox` into `b` from `source`, `batch` messages per batch, polling every 20 ms,
/// standard output discarded, its log on the test's standard error.
pub fn daemon_command<B: InboxBackend>(
    outbox: fn() -> Command,
    b: &B,
    source: &str,
    batch: usize,
) -> Command {
    let mut c = outbox();
    c.arg("inbox")
        .args(b.daemon_args())
        .args([
            "--batch-size",
            &batch.to_string(),
            "--poll-interval",
            "20ms",
        ])
        .env("OUTBOX_INBOX_SOURCE", source)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    c
}

/// A running `outbox inbox`.
pub struct Daemon(Child);

impl Daemon {
    /// Starts [`daemon_command`].
    pub fn start<B: InboxBackend>(
        outbox: fn() -> Command,
        b: &B,
        source: &str,
        batch: usize,
    ) -> Self {
        Self(daemon_command(outbox, b, source, batch).spawn().unwrap())
    }

    /// `kill -9`: the batch in hand is neither committed nor acknowledged.
    pub fn kill(mut self) {
        self.0.kill().unwrap();
        self.0.wait().unwrap();
    }

    /// SIGTERM; it must exit cleanly.
    pub fn stop(mut self) {
        sigterm(&self.0);
        let status = tokio::task::block_in_place(|| wait_exit(&mut self.0, WAIT));
        assert!(status.success(), "outbox inbox exited with {status}");
    }
}

/// Messages in `b`'s inbox.
pub async fn ingested<B: InboxBackend>(b: &B) -> i64 {
    b.scalar("SELECT count(*) FROM {schema}.inbox_messages")
        .await
}

/// Waits until `b`'s inbox holds at least `n` messages; panics after `limit`.
pub async fn wait_ingested<B: InboxBackend>(b: &B, n: i64, limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        let got = ingested(b).await;
        if got >= n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{got} of {n} messages in the inbox after {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Every message of `published` exactly once in `b`'s inbox and once in its processing queue,
/// with the relay's type, its key and its payload; when `ordered`, each key's messages in
/// publish order in both.
pub async fn assert_ingested_once<B: InboxBackend>(b: &B, published: &[Envelope], ordered: bool) {
    let sent = by_id(published);
    let rows = b
        .texts(
            "SELECT CAST(id AS TEXT), type, key, CAST(payload AS TEXT) \
             FROM {schema}.inbox_messages ORDER BY seq",
        )
        .await;
    assert_eq!(rows.len(), published.len(), "messages in the inbox");
    let mut got = Vec::new();
    for r in &rows {
        let text = |i: usize| r[i].clone().unwrap();
        let id: Uuid = text(0).parse().unwrap();
        let e = sent
            .get(&id)
            .unwrap_or_else(|| panic!("unknown message {id} in the inbox"));
        assert_eq!(text(1), MESSAGE_TYPE);
        assert_eq!(text(2), e.key);
        let payload: serde_json::Value = serde_json::from_str(&text(3)).unwrap();
        let n = payload["n"].as_i64().unwrap();
        got.push(Got {
            id,
            key: e.key.clone(),
            n,
        });
    }
    assert_eq!(
        got.iter().map(|g| g.id).collect::<HashSet<_>>().len(),
        published.len(),
        "each message once"
    );
    let queued = b
        .texts("SELECT CAST(id AS TEXT), aggregate_id, CAST(payload AS TEXT) FROM {queue} ORDER BY seq")
        .await;
    let queue: Vec<Got> = queued
        .iter()
        .map(|r| {
            let text = |i: usize| r[i].clone().unwrap();
            let payload: serde_json::Value = serde_json::from_str(&text(2)).unwrap();
            Got {
                id: text(0).parse().unwrap(),
                key: text(1),
                n: payload["n"].as_i64().unwrap(),
            }
        })
        .collect();
    assert_eq!(queue.len(), published.len(), "queued once each");
    assert_eq!(
        queue.iter().map(|g| g.id).collect::<HashSet<_>>().len(),
        published.len(),
        "queued once each"
    );
    if ordered {
        assert_in_key_order(&got, &HashMap::new());
        assert_in_key_order(&queue, &HashMap::new());
    }
}

/// The daemon, killed with `kill -9` in the middle of a backlog and restarted after more
/// messages were published meanwhile, loses nothing and records nothing twice: every message
/// once in a PostgreSQL inbox and once in its queue, each key in publish order (where the
/// broker keeps order), the broker drained, and the restarted daemon stops cleanly on SIGTERM.
pub async fn the_daemon_killed_mid_stream_and_restarted_loses_nothing_and_records_nothing_twice(
    f: &dyn SourceFixture,
    outbox: fn() -> Command,
) {
    killed_mid_stream::<PgInbox>(f, outbox).await;
}

/// The same into a SQLite inbox.
pub async fn the_daemon_killed_mid_stream_and_restarted_loses_nothing_and_records_nothing_twice_in_sqlite(
    f: &dyn SourceFixture,
    outbox: fn() -> Command,
) {
    killed_mid_stream::<SqliteInbox>(f, outbox).await;
}

/// The same into a MySQL/MariaDB inbox.
pub async fn the_daemon_killed_mid_stream_and_restarted_loses_nothing_and_records_nothing_twice_in_mysql(
    f: &dyn SourceFixture,
    outbox: fn() -> Command,
) {
    killed_mid_stream::<MysqlInbox>(f, outbox).await;
}

/// The daemon case on backend `B`.
async fn killed_mid_stream<B: InboxBackend>(f: &dyn SourceFixture, outbox: fn() -> Command) {
    let b = B::start().await;
    let mut ch = f.channel("sigkill").await;
    let s = f.daemon_scale();
    let msgs = workload(&ch.destination(), s.keys, s.per_key, 0);
    publish(ch.as_ref(), &msgs).await;
    let source = ch.source_url();
    let a = Daemon::start(outbox, &b, &source, s.batch);
    wait_ingested(&b, s.kill_after, WAIT).await;
    a.kill();
    assert!(
        ingested(&b).await < msgs.len() as i64,
        "the daemon finished before it was killed: nothing tested"
    );
    let more = workload(&ch.destination(), s.keys, s.more_per_key, s.per_key);
    publish(ch.as_ref(), &more).await;
    let all: Vec<Envelope> = msgs.into_iter().chain(more).collect();
    let restarted = Daemon::start(outbox, &b, &source, s.batch);
    wait_ingested(&b, all.len() as i64, WAIT).await;
    assert_ingested_once(&b, &all, f.order() != Order::None).await;
    ch.await_redelivery().await;
    restarted.stop();
    ch.assert_drained(all.len()).await;
    ch.cleanup().await;
    b.teardown().await;
}
