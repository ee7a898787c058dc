//! `outbox status`: the figures beyond [`Stats`] that a store can give (each partition's owner,
//! epoch, backlog and position; what keeps storage from being dropped; the backlog by route),
//! gathered into one [`Report`], and the report's text view.
//!
//! Stores answer [`Store::status_detail`] with what applies to them; the default answers
//! nothing, and the report then holds only the [`Stats`].

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::flow::Flow;
use crate::route::RouteSpec;
use crate::store::{Stats, Store};
use crate::Result;

/// The route name of rows that no routing rule matches (they go to the relay's `--sink`).
pub const DEFAULT_ROUTE: &str = "default";

/// What [`Store::status_detail`] returns: the figures of `outbox status` that need queries of
/// their own.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct StatusDetail {
    /// Every relay partition, in partition order.
    pub partitions: Vec<PartitionStatus>,
    /// What keeps storage (PostgreSQL's segments); `None` for stores without a horizon.
    pub retention: Option<RetentionStatus>,
    /// Pending messages by partition, aggregate type, event type and topic. The report adds
    /// them up per partition, per route and per type: a store leaves each partition's
    /// `pending` and `oldest_pending_age_seconds` at zero and `None`.
    pub pending: Vec<PendingCell>,
    /// The CDC relays' replication slots of this outbox (PostgreSQL, `outbox migrate --cdc`);
    /// empty without CDC mode.
    pub cdc_slots: Vec<SlotStatus>,
    /// The binlog route's sequencer (MySQL/MariaDB, `outbox migrate --binlog`); `None` on
    /// every other route.
    pub binlog_sequencer: Option<SequencerStatus>,
}

/// The binlog route's sequencer (MySQL/MariaDB) as `outbox status` shows it: who holds its
/// lease, how far it has read the binlog, and how far the seal is.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SequencerStatus {
    /// The relay's sequencer holding the lease; `None` when none holds an unexpired one (no
    /// relay runs on this outbox, or its sequencer is stuck): nothing written is relayed then.
    pub owner: Option<String>,
    /// Fencing token: bumped at every new holder.
    pub epoch: i64,
    /// When the lease ends; renewed every few seconds while a sequencer runs.
    pub lease_until: Option<DateTime<Utc>>,
    /// When a sequencer last wrote its row (lease renewed, position saved).
    pub saved_at: Option<DateTime<Utc>>,
    /// The binlog position (`file:offset`) every outbox row committed before has its position
    /// through; `None` before the route's first start.
    pub through: Option<String>,
    /// Where the server's binlog ends now.
    pub binlog_end: Option<String>,
    /// Binlog bytes from `through` to the end: what the sequencer still has to read (the
    /// server's whole binlog, other databases included). `None` when `through` names a file
    /// the server no longer holds (it then takes what it missed from the table).
    pub lag_bytes: Option<i64>,
    /// The seal: every row with a lower `seq` is sequenced or was rolled back. Retention drops
    /// only ranges below it.
    pub sequenced_below: i64,
    /// The next `seq` the outbox gives: what lies between the seal and it waits for the next
    /// seal (a transaction that stays open holds it).
    pub next_seq: i64,
    /// Rows the binlog did not carry (written with `sql_log_bin = 0`, or logged as statements),
    /// sequenced from the table since the route was turned on.
    pub rows_from_table: i64,
    /// How long the sequencer's position has not moved while the binlog holds more after it,
    /// in seconds (0 when it has read everything): a reader stuck on a dead connection shows
    /// here, while its lease renewals keep `saved_at` fresh.
    pub lag_seconds: f64,
    /// Partitions whose next position names a row the relay cannot see (deleted by hand, or
    /// never committed): the relay waits there, and the partition's later messages with it.
    /// A moment's wait is normal (a row becomes visible just after its binlog event); one that
    /// lasts is not.
    pub stuck_partitions: i64,
}

/// A CDC replication slot as `outbox status` shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SlotStatus {
    /// The slot's name (`outbox_<schema>_<group>`).
    pub slot: String,
    /// The server process of the relay reading it; `None` while no relay does.
    pub active_pid: Option<i32>,
    /// PostgreSQL's `wal_status`: `reserved`, `extended`, `unreserved` or `lost`.
    pub wal_status: Option<String>,
    /// WAL written since the slot's confirmed position, in bytes.
    pub lag_bytes: Option<i64>,
    /// WAL the server keeps for the slot, in bytes.
    pub retained_bytes: Option<i64>,
    /// How much more WAL may be written before the slot is lost (`max_slot_wal_keep_size`);
    /// `None` when unbounded.
    pub safe_wal_bytes: Option<i64>,
}

/// One relay partition as `outbox status` shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PartitionStatus {
    /// Partition number.
    pub partition: i32,
    /// The member holding it under an unexpired lease; `None` when free or expired.
    pub owner: Option<String>,
    /// Fencing token: bumped at every change of owner.
    pub epoch: i64,
    /// When the current lease ends (`None` when free).
    pub lease_until: Option<DateTime<Utc>>,
    /// The partition's lag: messages not yet published (counted with the store's cap),
    /// parked messages still to deliver included.
    pub pending: i64,
    /// Age in seconds of its oldest pending message; `None` when nothing is pending.
    pub oldest_pending_age_seconds: Option<f64>,
    /// Messages set aside from the partition's flow (retrying or failed heads and the messages
    /// queued behind them).
    pub parked: i64,
    /// Of those, messages that ended `failed`.
    pub failed: i64,
    /// Where the partition's reader stands; `None` for stores that mark rows instead.
    pub position: Option<Position>,
}

/// A PostgreSQL partition's position: every transaction below `done_xmin` is passed, and so is
/// every transaction below `done_xmax` that was not running when the position was taken; the
/// open window's messages up to `cursor` are handled too.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Position {
    /// The oldest transaction the position's `done` snapshot saw running (or its `xmax` when none
    /// was): what the partition holds retention at.
    pub done_xmin: i64,
    /// First transaction id not yet seen when the `done` snapshot was taken.
    pub done_xmax: i64,
    /// Last sequence handled inside the open window (0 when none is open).
    pub cursor: i64,
    /// When the `done` snapshot was taken (how old the position is).
    pub done_at: DateTime<Utc>,
    /// Messages published from this partition, running total.
    pub published: i64,
}

/// What keeps storage (PostgreSQL: txid-ranged segments, dropped whole once every position has
/// passed them and retention has run out).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RetentionStatus {
    /// Segments kept.
    pub segments: i64,
    /// Their size on disk, indexes included.
    pub bytes: i64,
    /// The next transaction id (the `xmax` of a snapshot taken now).
    pub next_xid: i64,
    /// Every position has passed the transactions below this id: segments wholly below it may
    /// be dropped once their retention has run out. `None` before any position exists.
    pub horizon: Option<i64>,
    /// The oldest segment, the first to be dropped.
    pub oldest_segment: Option<Segment>,
    /// Why the oldest segment is still kept.
    pub kept_because: Option<KeptBecause>,
    /// What holds the horizon where it is: a partition whose position lags, or a transaction
    /// that is still running (no position can pass it until it ends).
    pub pinned_by: Option<RetentionPin>,
}

/// One storage segment.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Segment {
    /// Table name.
    pub name: String,
    /// First transaction id it holds.
    pub lo: i64,
    /// First transaction id it does not hold.
    pub hi: i64,
    /// When the transaction ids passed its end (`None`: still written to).
    pub closed_at: Option<DateTime<Utc>>,
    /// Size on disk, indexes included.
    pub bytes: Option<i64>,
}

/// Why the oldest segment is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KeptBecause {
    /// New transactions still write into it: nothing is held back.
    Open,
    /// The horizon has not passed its end: see [`RetentionStatus::pinned_by`].
    Horizon,
    /// Every reader has passed it; it is dropped once the retention period since
    /// `closed_at` has run out (by the relay's maintenance, or `outbox maintain`).
    Retention,
}

/// What holds the retention horizon.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum RetentionPin {
    /// A running transaction (or a prepared one) that holds a transaction id at or below the
    /// horizon: every position taken while it runs stops there. End it (or commit or roll back
    /// the prepared transaction).
    Transaction {
        /// Its transaction id.
        xid: i64,
        /// Server process running it (`None` for a prepared transaction, or when hidden).
        pid: Option<i32>,
        /// Seconds since it began (or since it was prepared).
        age_seconds: Option<f64>,
        /// `pg_stat_activity.state`, e.g. `idle in transaction`.
        state: Option<String>,
        /// Its session's `application_name`.
        application_name: Option<String>,
        /// Its database.
        database: Option<String>,
        /// Its user.
        user: Option<String>,
        /// The global id of a prepared transaction.
        prepared: Option<String>,
    },
    /// The partition whose position is the oldest: it has not advanced since `done_at` (no live
    /// owner, a stalled relay, or a head message that parks the partition at its cap).
    Partition {
        /// Partition number.
        partition: i32,
        /// Its owner, if any.
        owner: Option<String>,
        /// When its position was taken.
        done_at: DateTime<Utc>,
        /// Seconds since then.
        behind_seconds: f64,
    },
}

/// Pending messages of one partition with one aggregate type, event type and topic.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PendingCell {
    /// Partition.
    pub partition: i32,
    /// Aggregate type.
    pub aggregate_type: String,
    /// Event type.
    pub event_type: String,
    /// Topic column (`None` when the row has none).
    pub topic: Option<String>,
    /// Messages pending.
    pub pending: i64,
    /// Age in seconds of the oldest of them.
    pub oldest_pending_age_seconds: Option<f64>,
}

/// Pending messages of one route (a routing rule of `outbox.toml`, or [`DEFAULT_ROUTE`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RouteLag {
    /// Route name.
    pub route: String,
    /// Messages pending.
    pub pending: i64,
    /// Age in seconds of the oldest of them; `None` when none is pending.
    pub oldest_pending_age_seconds: Option<f64>,
}

/// Pending messages of one aggregate type, event type and topic.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TypeLag {
    /// Aggregate type.
    pub aggregate_type: String,
    /// Event type.
    pub event_type: String,
    /// Topic column.
    pub topic: Option<String>,
    /// Messages pending.
    pub pending: i64,
    /// Age in seconds of the oldest of them.
    pub oldest_pending_age_seconds: Option<f64>,
}

/// Everything `outbox status` shows, as one JSON object: the [`Stats`] keys at the top level,
/// and beside them the detail the store could give.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// When the figures were read.
    pub at: DateTime<Utc>,
    /// The counts.
    #[serde(flatten)]
    pub stats: Stats,
    /// Every partition (empty when the store has none to show).
    pub partitions: Vec<PartitionStatus>,
    /// What keeps storage, where that applies.
    pub retention: Option<RetentionStatus>,
    /// Backlog per route: every configured route, then [`DEFAULT_ROUTE`].
    pub routes: Vec<RouteLag>,
    /// Backlog per aggregate type, event type and topic, oldest first.
    pub pending_by_type: Vec<TypeLag>,
    /// The CDC relays' replication slots (empty without CDC mode).
    pub cdc_slots: Vec<SlotStatus>,
    /// The binlog route's sequencer (MySQL/MariaDB); `None` on every other route.
    pub binlog_sequencer: Option<SequencerStatus>,
    /// Whether events flow, and if not, why: the first answer of the report.
    pub flow: Flow,
}

impl Report {
    /// Reads the counts and the detail from `store`; `routes` (the relay's routing rules, first
    /// match wins) group the backlog by route.
    pub async fn collect(store: &dyn Store, routes: &[RouteSpec]) -> Result<Self> {
        let stats = store.stats().await?;
        let detail = store.status_detail().await?;
        Ok(Self::new(Utc::now(), stats, detail, routes))
    }

    /// A report of `stats` and `detail`, read at `at`.
    pub fn new(
        at: DateTime<Utc>,
        stats: Stats,
        detail: StatusDetail,
        routes: &[RouteSpec],
    ) -> Self {
        let mut by_route: Vec<RouteLag> = routes
            .iter()
            .map(|r| r.name.as_str())
            .chain([DEFAULT_ROUTE])
            .map(|name| RouteLag {
                route: name.to_string(),
                pending: 0,
                oldest_pending_age_seconds: None,
            })
            .collect();
        let mut by_type: BTreeMap<TypeKey, TypeLag> = BTreeMap::new();
        let mut partitions = detail.partitions;
        for cell in &detail.pending {
            let route = routes
                .iter()
                .position(|r| {
                    r.when.matches_fields(
                        &cell.aggregate_type,
                        &cell.event_type,
                        cell.topic.as_deref(),
                    )
                })
                .unwrap_or(routes.len());
            let r = &mut by_route[route];
            add(&mut r.pending, &mut r.oldest_pending_age_seconds, cell);
            let key = (
                cell.aggregate_type.clone(),
                cell.event_type.clone(),
                cell.topic.clone(),
            );
            let t = by_type.entry(key).or_insert_with(|| TypeLag {
                aggregate_type: cell.aggregate_type.clone(),
                event_type: cell.event_type.clone(),
                topic: cell.topic.clone(),
                pending: 0,
                oldest_pending_age_seconds: None,
            });
            add(&mut t.pending, &mut t.oldest_pending_age_seconds, cell);
            let p = match partitions
                .iter()
                .position(|p| p.partition == cell.partition)
            {
                Some(i) => i,
                // A store without partition bookkeeping still gets its backlog per partition.
                None => {
                    partitions.push(PartitionStatus {
                        partition: cell.partition,
                        owner: None,
                        epoch: 0,
                        lease_until: None,
                        pending: 0,
                        oldest_pending_age_seconds: None,
                        parked: 0,
                        failed: 0,
                        position: None,
                    });
                    partitions.len() - 1
                }
            };
            let p = &mut partitions[p];
            add(&mut p.pending, &mut p.oldest_pending_age_seconds, cell);
        }
        partitions.sort_by_key(|p| p.partition);
        let mut pending_by_type: Vec<TypeLag> = by_type.into_values().collect();
        pending_by_type.sort_by(|a, b| {
            b.oldest_pending_age_seconds
                .unwrap_or(0.0)
                .total_cmp(&a.oldest_pending_age_seconds.unwrap_or(0.0))
        });
        let flow = Flow::of(at, &stats, &partitions, &by_route);
        Self {
            at,
            stats,
            partitions,
            retention: detail.retention,
            routes: by_route,
            pending_by_type,
            cdc_slots: detail.cdc_slots,
            binlog_sequencer: detail.binlog_sequencer,
            flow,
        }
    }

    /// The text view: `title` on the first line (what and where), then the counts, the members,
    /// blocked keys, partitions with a backlog, retention and the backlog by route. `inbox`
    /// names published messages "handled".
    pub fn render_text(&self, title: &str, inbox: bool) -> String {
        let mut out = String::new();
        // Every line may carry text from rows or brokers (keys, errors, member ids): shown
        // through the one terminal rule, so none of it can act on the terminal.
        let mut line = |s: String| {
            out.push_str(&crate::text::terminal(&s));
            out.push('\n');
        };
        let s = &self.stats;
        line(title.to_string());
        line(format!(
            "flow                {}: {}",
            self.flow.state.as_str().to_uppercase(),
            self.flow.headline
        ));
        for p in self.flow.problems.iter().skip(1) {
            line(format!("  also              {}", p.text));
        }
        line(format!(
            "pending             {} ({} can flow, {} held behind retrying or failed heads)",
            s.pending, self.flow.pending_flowing, self.flow.pending_blocked
        ));
        line(format!(
            "oldest pending age  {}",
            age(s.oldest_pending_age_seconds)
        ));
        line(format!("retrying            {}", s.retrying));
        line(format!("blocked keys        {}", s.blocked_keys));
        line(format!("parked              {}", s.parked));
        if s.partitions_at_parking_cap > 0 {
            line(format!(
                "partitions stopped  {} (parking cap reached: a key is stuck behind a failing message)",
                s.partitions_at_parking_cap
            ));
        }
        line(format!("failed              {}", s.failed));
        let published = if inbox { "handled  " } else { "published" };
        line(format!("{published}           {}", s.published));
        line(format!(
            "relay members       {} ({} live)",
            s.members.len(),
            self.flow.live_members
        ));
        for m in &s.members {
            let err = m
                .sink_error
                .as_deref()
                .map(|e| format!("  sink error: {e}"))
                .unwrap_or_default();
            let beat = (self.at - m.heartbeat_at).num_milliseconds() as f64 / 1000.0;
            let silent = if beat >= crate::flow::STALE_AFTER_SECONDS {
                "  SILENT (not live)"
            } else {
                ""
            };
            line(format!(
                "  {}  partitions={}  circuit={}  heartbeat {} ago ({}){silent}{err}",
                m.member,
                m.partitions,
                m.circuit,
                age(Some(beat)),
                m.heartbeat_at.to_rfc3339()
            ));
        }
        if !s.blocked.is_empty() {
            line(
                "blocked keys (head message waiting or failed; later messages of the key wait)"
                    .into(),
            );
            for b in &s.blocked {
                line(format!(
                    "  {}  {} after {} attempt(s): {}",
                    b.key,
                    b.state,
                    b.attempts,
                    b.last_error.as_deref().unwrap_or("-")
                ));
            }
        }
        self.render_partitions(&mut line);
        if let Some(r) = &self.retention {
            render_retention(r, self.at, &mut line);
        }
        for c in &self.cdc_slots {
            render_slot(c, &mut line);
        }
        if let Some(q) = &self.binlog_sequencer {
            render_sequencer(q, self.at, &mut line);
        }
        if self.routes.len() > 1 {
            line("pending by route".into());
            for r in &self.routes {
                line(format!(
                    "  {:<24}{:>9}  oldest {}",
                    r.route,
                    r.pending,
                    age(r.oldest_pending_age_seconds)
                ));
            }
        }
        if !self.pending_by_type.is_empty() {
            line("pending by type (aggregate type / event type [topic], oldest first)".into());
            for t in self.pending_by_type.iter().take(TEXT_ROWS) {
                let topic = t
                    .topic
                    .as_deref()
                    .map(|t| format!(" [{t}]"))
                    .unwrap_or_default();
                line(format!(
                    "  {:<40}{:>9}  oldest {}",
                    format!("{} / {}{topic}", t.aggregate_type, t.event_type),
                    t.pending,
                    age(t.oldest_pending_age_seconds)
                ));
            }
            more(self.pending_by_type.len(), &mut line);
        }
        out
    }

    /// The text view for a terminal that `outbox status --watch` redraws every `every`: the
    /// cursor home and the screen cleared, the view, then when it was read. One string, written
    /// at once, so the screen never shows half a view.
    pub fn render_screen(&self, title: &str, inbox: bool, every: std::time::Duration) -> String {
        format!(
            "\x1b[H\x1b[2J{}\n{}, every {}; Ctrl-C ends\n",
            self.render_text(title, inbox),
            self.at.format("%F %T UTC"),
            humantime::format_duration(every)
        )
    }

    fn render_partitions(&self, line: &mut impl FnMut(String)) {
        if self.partitions.is_empty() {
            return;
        }
        let owned = self.partitions.iter().filter(|p| p.owner.is_some()).count();
        // Partitions with work, the longest waiting first.
        let mut busy: Vec<&PartitionStatus> = self
            .partitions
            .iter()
            .filter(|p| p.pending > 0 || p.parked > 0)
            .collect();
        busy.sort_by(|a, b| {
            let age = |p: &PartitionStatus| p.oldest_pending_age_seconds.unwrap_or(-1.0);
            age(b).total_cmp(&age(a)).then(b.pending.cmp(&a.pending))
        });
        line(format!(
            "partitions          {} ({owned} owned, {} with a backlog)",
            self.partitions.len(),
            busy.len()
        ));
        if busy.is_empty() {
            return;
        }
        line(format!(
            "  {:>4}  {:<28}{:>6}{:>9}{:>9}{:>7}  position",
            "part", "owner", "epoch", "pending", "oldest", "parked"
        ));
        for p in busy.iter().take(TEXT_ROWS) {
            let position = p.position.as_ref().map_or_else(
                || "-".to_string(),
                |x| {
                    let behind = (self.at - x.done_at).num_milliseconds() as f64 / 1000.0;
                    format!(
                        "xid {}  cursor {}  {} ago",
                        x.done_xmax,
                        x.cursor,
                        age(Some(behind))
                    )
                },
            );
            line(format!(
                "  {:>4}  {:<28}{:>6}{:>9}{:>9}{:>7}  {position}",
                p.partition,
                p.owner.as_deref().unwrap_or("(none)"),
                p.epoch,
                p.pending,
                age(p.oldest_pending_age_seconds),
                p.parked
            ));
        }
        more(busy.len(), line);
    }
}

/// Aggregate type, event type, topic.
type TypeKey = (String, String, Option<String>);

/// Rows of a list the text view shows before "… and N more".
const TEXT_ROWS: usize = 16;

fn more(n: usize, line: &mut impl FnMut(String)) {
    if n > TEXT_ROWS {
        line(format!(
            "  … and {} more (--format json lists all)",
            n - TEXT_ROWS
        ));
    }
}

/// A CDC slot: who reads it, how far behind, what it keeps, and what to do when it is lost.
fn render_slot(c: &SlotStatus, line: &mut impl FnMut(String)) {
    let mib = |b: Option<i64>| {
        b.map_or("-".to_string(), |b| {
            format!("{:.1} MiB", b as f64 / 1_048_576.0)
        })
    };
    let reader = c.active_pid.map_or("no relay reads it".to_string(), |p| {
        format!("read by pid {p}")
    });
    line(format!(
        "cdc slot            {}: {reader}; lag {}, keeps {} of WAL, {}",
        c.slot,
        mib(c.lag_bytes),
        mib(c.retained_bytes),
        match c.safe_wal_bytes {
            Some(_) => format!("{} more before it is lost", mib(c.safe_wal_bytes)),
            None => "no bound (max_slot_wal_keep_size = -1)".to_string(),
        }
    ));
    if c.wal_status.as_deref() == Some("lost") {
        line(
            "  LOST: PostgreSQL invalidated it; the relay fell back to polling. Run \
             `outbox migrate --cdc` after the backlog is delivered (docs/cdc.md)"
                .to_string(),
        );
    }
}

fn render_sequencer(q: &SequencerStatus, at: DateTime<Utc>, line: &mut impl FnMut(String)) {
    let holder = match (&q.owner, q.lease_until) {
        (Some(owner), Some(until)) if until > at => format!("{owner} (epoch {})", q.epoch),
        _ => "NONE".to_string(),
    };
    let lag = match q.lag_bytes {
        Some(b) => format!("{} behind the binlog's end", bytes(b)),
        None => "its file was purged (it takes the rows from the table)".to_string(),
    };
    line(format!(
        "binlog sequencer    held by {holder}; read through {} ({lag}); saved {}",
        q.through.as_deref().unwrap_or("- (not started yet)"),
        q.saved_at
            .map_or("never".to_string(), |t| format!("{} ago", since(at, t))),
    ));
    line(format!(
        "  sealed below seq {} (next seq {}); {} row(s) the binlog did not carry taken from \
         the table",
        q.sequenced_below, q.next_seq, q.rows_from_table
    ));
    if q.lag_seconds >= 30.0 {
        line(format!(
            "  STUCK: its position has not moved for {:.0} s while the binlog holds more; its \
             log says why (it reconnects on its own to a server that went silent)",
            q.lag_seconds
        ));
    }
    if q.stuck_partitions > 0 {
        line(format!(
            "  {} partition(s) wait at a position whose row is not visible (a row deleted by \
             hand, or never committed); their later messages wait too",
            q.stuck_partitions
        ));
    }
    if q.owner.is_none() || q.lease_until.is_none_or(|t| t <= at) {
        line(
            "  NO SEQUENCER: messages written now get no position and are not relayed. Start \
             `outbox relay` on this outbox (its store runs the sequencer), or read its log for \
             why the sequencer stopped"
                .to_string(),
        );
    }
}

fn render_retention(r: &RetentionStatus, at: DateTime<Utc>, line: &mut impl FnMut(String)) {
    line(format!(
        "retention           {} segment(s), {}",
        r.segments,
        bytes(r.bytes)
    ));
    if let Some(s) = &r.oldest_segment {
        let why = match r.kept_because {
            Some(KeptBecause::Open) => "still written to".to_string(),
            Some(KeptBecause::Horizon) => "not every reader has passed it (see pinned by)".into(),
            Some(KeptBecause::Retention) => {
                let closed = s.closed_at.map_or_else(String::new, |c| {
                    format!(" since it closed {} ago", since(at, c))
                });
                format!("passed by every reader; kept for the retention period{closed}")
            }
            None => "-".into(),
        };
        line(format!(
            "  oldest segment    {} (xid {}..{}, {}): {why}",
            s.name,
            s.lo,
            s.hi,
            s.bytes.map_or_else(|| "-".into(), bytes)
        ));
    }
    if let Some(h) = r.horizon {
        line(format!(
            "  horizon           xid {h} (next xid {})",
            r.next_xid
        ));
    }
    match &r.pinned_by {
        Some(RetentionPin::Transaction {
            xid,
            pid,
            age_seconds,
            state,
            application_name,
            database,
            prepared,
            ..
        }) => {
            let who = match (prepared, pid) {
                (Some(gid), _) => format!("prepared transaction '{gid}'"),
                (None, Some(pid)) => format!("pid {pid}"),
                (None, None) => "pid unknown".into(),
            };
            let mut parts = vec![who];
            parts.extend(state.clone());
            parts.extend(
                application_name
                    .clone()
                    .filter(|a| !a.is_empty())
                    .map(|a| format!("application {a}")),
            );
            parts.extend(database.clone().map(|d| format!("database {d}")));
            parts.push(format!("open {}", age(*age_seconds)));
            line(format!(
                "  pinned by         transaction {xid} ({})",
                parts.join(", ")
            ));
        }
        Some(RetentionPin::Partition {
            partition,
            owner,
            behind_seconds,
            ..
        }) => line(format!(
            "  pinned by         partition {partition} (owner {}): its position is {} old",
            owner.as_deref().unwrap_or("(none)"),
            age(Some(*behind_seconds))
        )),
        None => {}
    }
}

fn add(pending: &mut i64, oldest: &mut Option<f64>, cell: &PendingCell) {
    *pending += cell.pending;
    if let Some(a) = cell.oldest_pending_age_seconds {
        *oldest = Some(oldest.map_or(a, |o| o.max(a)));
    }
}

/// `12.3s`, or `-` for none.
fn age(seconds: Option<f64>) -> String {
    seconds.map_or_else(|| "-".to_string(), |a| format!("{a:.1}s"))
}

fn since(at: DateTime<Utc>, then: DateTime<Utc>) -> String {
    age(Some((at - then).num_milliseconds() as f64 / 1000.0))
}

/// `1.5 MiB`.
fn bytes(n: i64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::route::RouteSpec;

    fn stats() -> Stats {
        Stats {
            pending: 5,
            oldest_pending_age_seconds: Some(9.0),
            failed: 0,
            published: 7,
            retrying: 0,
            blocked_keys: 0,
            parked: 0,
            partitions_at_parking_cap: 0,
            waiting: 0,
            oldest_waiting_age_seconds: None,
            members: Vec::new(),
            blocked: Vec::new(),
        }
    }

    fn cell(partition: i32, ty: &str, ev: &str, n: i64, age: f64) -> PendingCell {
        PendingCell {
            partition,
            aggregate_type: ty.into(),
            event_type: ev.into(),
            topic: None,
            pending: n,
            oldest_pending_age_seconds: Some(age),
        }
    }

    #[test]
    fn the_backlog_is_grouped_by_first_matching_route_and_by_type() {
        let routes = [RouteSpec::parse("name=pay; event_type=payment.*; sink=stdout:", 1).unwrap()];
        let detail = StatusDetail {
            pending: vec![
                cell(3, "payment", "payment.created", 2, 4.0),
                cell(5, "payment", "payment.created", 1, 9.0),
                cell(5, "order", "order.placed", 2, 1.0),
            ],
            ..StatusDetail::default()
        };
        let r = Report::new(Utc::now(), stats(), detail, &routes);
        assert_eq!(r.routes.len(), 2);
        assert_eq!(
            (r.routes[0].route.as_str(), r.routes[0].pending),
            ("pay", 3)
        );
        assert_eq!(r.routes[0].oldest_pending_age_seconds, Some(9.0));
        assert_eq!(
            (r.routes[1].route.as_str(), r.routes[1].pending),
            (DEFAULT_ROUTE, 2)
        );
        assert_eq!(r.pending_by_type.len(), 2);
        assert_eq!(
            r.pending_by_type[0].event_type, "payment.created",
            "oldest first"
        );
        assert_eq!(r.pending_by_type[0].pending, 3);
        // A store without partition bookkeeping still gets its backlog per partition.
        let parts: Vec<(i32, i64)> = r
            .partitions
            .iter()
            .map(|p| (p.partition, p.pending))
            .collect();
        assert_eq!(parts, [(3, 2), (5, 3)]);
        let text = r.render_text("outbox  here", false);
        assert!(text.contains("pending by route"), "{text}");
        assert!(text.contains("published           7"), "{text}");
    }

    #[test]
    fn json_keeps_the_stats_keys_at_the_top_level() {
        let r = Report::new(Utc::now(), stats(), StatusDetail::default(), &[]);
        let v = serde_json::to_value(&r).unwrap_or_default();
        assert_eq!(v["pending"], 5);
        assert_eq!(v["routes"][0]["route"], DEFAULT_ROUTE);
        assert!(v["retention"].is_null());
    }

    #[test]
    fn the_binlog_sequencer_is_shown_and_its_absence_said_with_what_to_do() {
        let at = Utc::now();
        let mut q = SequencerStatus {
            owner: Some("sequencer-1".into()),
            epoch: 4,
            lease_until: Some(at + chrono::Duration::seconds(8)),
            saved_at: Some(at - chrono::Duration::seconds(2)),
            through: Some("mysql-bin.000003:1234".into()),
            binlog_end: Some("mysql-bin.000003:5330".into()),
            lag_bytes: Some(4096),
            sequenced_below: 120,
            next_seq: 131,
            rows_from_table: 2,
            lag_seconds: 0.0,
            stuck_partitions: 0,
        };
        let text = |q: &SequencerStatus| {
            let detail = StatusDetail {
                binlog_sequencer: Some(q.clone()),
                ..StatusDetail::default()
            };
            Report::new(at, stats(), detail, &[]).render_text("outbox  here", false)
        };
        let running = text(&q);
        assert!(
            running.contains("held by sequencer-1 (epoch 4)")
                && running.contains("mysql-bin.000003:1234 (4.0 KiB behind")
                && running.contains("sealed below seq 120 (next seq 131); 2 row(s)"),
            "{running}"
        );
        assert!(!running.contains("NO SEQUENCER"), "{running}");
        q.lease_until = Some(at - chrono::Duration::seconds(30));
        q.lag_bytes = None;
        let stopped = text(&q);
        assert!(
            stopped.contains("held by NONE")
                && stopped.contains("purged")
                && stopped.contains("NO SEQUENCER")
                && stopped.contains("outbox relay"),
            "{stopped}"
        );
        assert_eq!(stopped.matches("NO SEQUENCER").count(), 1);
    }

    #[test]
    fn a_pinning_transaction_is_named_in_the_text_view() {
        let at = Utc::now();
        let detail = StatusDetail {
            retention: Some(RetentionStatus {
                segments: 3,
                bytes: 3 << 20,
                next_xid: 120,
                horizon: Some(100),
                oldest_segment: Some(Segment {
                    name: "outbox_s0".into(),
                    lo: 0,
                    hi: 110,
                    closed_at: Some(at),
                    bytes: Some(8192),
                }),
                kept_because: Some(KeptBecause::Horizon),
                pinned_by: Some(RetentionPin::Transaction {
                    xid: 100,
                    pid: Some(4242),
                    age_seconds: Some(61.0),
                    state: Some("idle in transaction".into()),
                    application_name: Some("psql".into()),
                    database: Some("app".into()),
                    user: None,
                    prepared: None,
                }),
            }),
            ..StatusDetail::default()
        };
        let text = Report::new(at, stats(), detail, &[]).render_text("outbox", false);
        assert!(text.contains("3.0 MiB"), "{text}");
        assert!(
            text.contains("pinned by         transaction 100 (pid 4242, idle in transaction"),
            "{text}"
        );
    }
}
