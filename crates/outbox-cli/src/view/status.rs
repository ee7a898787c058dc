//! `outbox status`'s text view of a [`Report`] (the model, in `outbox_core::status`): the
//! title, the counts, the members, blocked keys, partitions with a backlog, retention, CDC
//! slots, the binlog sequencer and the backlog by route; and the screen `--watch` redraws.

use chrono::{DateTime, Utc};
use outbox_core::status::{
    KeptBecause, PartitionStatus, Report, RetentionPin, RetentionStatus, SequencerStatus,
    SlotStatus,
};

/// The text view: `title` on the first line (what and where), then the counts, the members,
/// blocked keys, partitions with a backlog, retention and the backlog by route. `inbox`
/// names published messages "handled".
pub fn text(report: &Report, title: &str, inbox: bool) -> String {
    let mut out = String::new();
    // Every line may carry text from rows or brokers (keys, errors, member ids): shown
    // through the one terminal rule, so none of it can act on the terminal.
    let mut line = |s: String| {
        out.push_str(&outbox_core::text::terminal(&s));
        out.push('\n');
    };
    let s = &report.stats;
    line(title.to_string());
    line(format!(
        "flow                {}: {}",
        report.flow.state.as_str().to_uppercase(),
        report.flow.headline
    ));
    for p in report.flow.problems.iter().skip(1) {
        line(format!("  also              {}", p.text));
    }
    line(format!(
        "pending             {} ({} can flow, {} held behind retrying or failed heads)",
        s.pending, report.flow.pending_flowing, report.flow.pending_blocked
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
        report.flow.live_members
    ));
    for m in &s.members {
        let err = m
            .sink_error
            .as_deref()
            .map(|e| format!("  sink error: {e}"))
            .unwrap_or_default();
        let beat = (report.at - m.heartbeat_at).num_milliseconds() as f64 / 1000.0;
        let silent = if beat >= outbox_core::flow::STALE_AFTER_SECONDS {
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
            "blocked keys (head message waiting or failed; later messages of the key wait)".into(),
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
    partitions(report, &mut line);
    if let Some(r) = &report.retention {
        render_retention(r, report.at, &mut line);
    }
    for c in &report.cdc_slots {
        render_slot(c, &mut line);
    }
    if let Some(q) = &report.binlog_sequencer {
        render_sequencer(q, report.at, &mut line);
    }
    if report.routes.len() > 1 {
        line("pending by route".into());
        for r in &report.routes {
            line(format!(
                "  {:<24}{:>9}  oldest {}",
                r.route,
                r.pending,
                age(r.oldest_pending_age_seconds)
            ));
        }
    }
    if !report.pending_by_type.is_empty() {
        line("pending by type (aggregate type / event type [topic], oldest first)".into());
        for t in report.pending_by_type.iter().take(TEXT_ROWS) {
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
        more(report.pending_by_type.len(), &mut line);
    }
    out
}

/// The text view for a terminal that `outbox status --watch` redraws every `every`: the
/// cursor home and the screen cleared, the view, then when it was read. One string, written
/// at once, so the screen never shows half a view.
pub fn screen(report: &Report, title: &str, inbox: bool, every: std::time::Duration) -> String {
    format!(
        "\x1b[H\x1b[2J{}\n{}, every {}; Ctrl-C ends\n",
        text(report, title, inbox),
        report.at.format("%F %T UTC"),
        humantime::format_duration(every)
    )
}

fn partitions(report: &Report, line: &mut impl FnMut(String)) {
    if report.partitions.is_empty() {
        return;
    }
    let owned = report
        .partitions
        .iter()
        .filter(|p| p.owner.is_some())
        .count();
    // Partitions with work, the longest waiting first.
    let mut busy: Vec<&PartitionStatus> = report
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
        report.partitions.len(),
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
                let behind = (report.at - x.done_at).num_milliseconds() as f64 / 1000.0;
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
    use outbox_core::status::{PendingCell, Segment, StatusDetail};
    use outbox_core::store::Stats;
    use outbox_core::RouteSpec;

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
    fn the_backlog_by_route_and_the_published_count_are_shown() {
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
        let text = text(&r, "outbox  here", false);
        assert!(text.contains("pending by route"), "{text}");
        assert!(text.contains("published           7"), "{text}");
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
            text(
                &Report::new(at, stats(), detail, &[]),
                "outbox  here",
                false,
            )
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
        let text = text(&Report::new(at, stats(), detail, &[]), "outbox", false);
        assert!(text.contains("3.0 MiB"), "{text}");
        assert!(
            text.contains("pinned by         transaction 100 (pid 4242, idle in transaction"),
            "{text}"
        );
    }
}
