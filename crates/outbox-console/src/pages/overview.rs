//! The overview, led by the answer to "are events flowing?" (the report's [`Flow`], the same
//! sentence `outbox status` prints), then the counts with pending split into what flows and what
//! is held, the backlog by route and by type, the relay members (silent ones greyed), and the
//! charts; and the partitions page, problems first.

use std::fmt::Write as _;

use outbox_core::flow::{Flow, FlowState, STALE_AFTER_SECONDS};
use outbox_core::status::{PartitionStatus, Report};

use crate::history::{History, SPAN};
use crate::html::{
    age, ago, card, chart, long, short, table, table_with, text, CELL_CHARS, ERROR_CHARS,
};

/// The flow banner: the state in one word, the headline, and every further problem.
fn banner(flow: &Flow) -> String {
    let class = match flow.problems.first() {
        None => "good",
        Some(p) if p.critical => "crit",
        Some(_) => "warn",
    };
    let mut out = format!(
        "<section class=\"flow {class}\" id=\"flow\" data-state=\"{state:?}\">\
         <strong class=\"state\" data-figure=\"flow_state\">{name}</strong> \
         <span id=\"flow-headline\">{headline}</span>",
        state = flow.state,
        name = flow.state.as_str(),
        headline = text(&flow.headline),
    );
    if flow.problems.len() > 1 {
        out += "<ul>";
        for p in &flow.problems[1..] {
            let _ = write!(out, "<li>{}</li>", text(&p.text));
        }
        out += "</ul>";
    }
    out + "</section>"
}

/// What the overview needs besides the report.
pub struct OverviewContext<'a> {
    /// The console's samples for the charts.
    pub history: &'a History,
    /// Whether this is the inbox's queue (published reads "handled").
    pub inbox: bool,
    /// `""` or `"/inbox"`.
    pub prefix: &'a str,
    /// Whether the console was given routing rules (a file's, or `--route`).
    pub routes_known: bool,
}

/// The overview of `r`.
pub fn overview(r: &Report, cx: &OverviewContext<'_>) -> String {
    let s = &r.stats;
    let flow = &r.flow;
    let done = if cx.inbox { "handled" } else { "published" };
    let mut out = banner(flow);
    out += "<div class=\"cards\">";
    out += &card("pending", "pending", &s.pending.to_string(), false);
    out += &card(
        "pending_flowing",
        "pending that can flow",
        &flow.pending_flowing.to_string(),
        false,
    );
    out += &card(
        "pending_blocked",
        "pending held behind retrying or failed heads",
        &flow.pending_blocked.to_string(),
        flow.pending_blocked > 0,
    );
    out += &card(
        "oldest_pending_age_seconds",
        "oldest pending",
        &age(s.oldest_pending_age_seconds),
        s.oldest_pending_age_seconds.unwrap_or(0.0) > 60.0 && flow.pending_flowing > 0,
    );
    out += &card("failed", "failed", &s.failed.to_string(), s.failed > 0);
    out += &card("retrying", "retrying", &s.retrying.to_string(), false);
    out += &card("parked", "parked", &s.parked.to_string(), false);
    out += &card(
        "blocked_keys",
        "blocked keys",
        &s.blocked_keys.to_string(),
        s.blocked_keys > 0,
    );
    out += &card(
        "partitions_at_parking_cap",
        "partitions at parking cap",
        &s.partitions_at_parking_cap.to_string(),
        s.partitions_at_parking_cap > 0,
    );
    out += &card(
        "published",
        &format!("{done} (kept)"),
        &s.published.to_string(),
        false,
    );
    out += &card(
        "live_members",
        &format!("live relay members of {}", s.members.len()),
        &flow.live_members.to_string(),
        flow.live_members == 0,
    );
    out += &card(
        "last_publish",
        &format!("since the last {done} message"),
        &cx.history
            .since_last_publish()
            .map_or("none seen".into(), |a| age(Some(a))),
        false,
    );
    out += "</div>";
    if s.failed > 0 {
        let _ = write!(
            out,
            "<p class=\"notice\">{} message(s) failed and wait for a redrive: \
             <a href=\"{}/failed\">see them</a>.</p>",
            s.failed, cx.prefix
        );
    }
    out += &backlog(r, cx);
    out += &members(r);
    // The charts reach back as far as the console has sampled, up to an hour, so a console
    // started a minute ago draws a minute, not a line squeezed against the right edge.
    let span = cx.history.reach().clamp(60.0, SPAN.as_secs_f64());
    let _ = write!(
        out,
        "<h2>The last {}</h2><p class=\"muted\">Sampled by this console while it runs (a \
         restarted console starts again); Prometheus keeps the long view.</p>",
        age(Some(span))
    );
    out += &chart(
        "rate",
        &format!("{done} per second"),
        "msg/s",
        span,
        &cx.history.rate(),
    );
    out += &chart(
        "lag",
        "age of the oldest pending message",
        "s",
        span,
        &cx.history.lag(),
    );
    out += &chart(
        "pending",
        "pending messages",
        "msg",
        span,
        &cx.history.pending(),
    );
    out
}

/// The backlog by route (when the console knows the routes) and by type, with the routes the
/// members report down.
fn backlog(r: &Report, cx: &OverviewContext<'_>) -> String {
    let down: Vec<&str> = r
        .flow
        .problems
        .iter()
        .filter(|p| p.state == FlowState::SinkDown)
        .filter_map(|p| p.route.as_deref())
        .collect();
    let mut out = String::from("<h2>Backlog by route</h2>");
    if cx.routes_known {
        let rows: Vec<Vec<String>> = r
            .routes
            .iter()
            .map(|l| {
                let sink = if down.contains(&l.route.as_str()) {
                    "<span class=\"err\">sink down</span>".to_string()
                } else {
                    String::new()
                };
                vec![
                    text(&l.route),
                    l.pending.to_string(),
                    age(l.oldest_pending_age_seconds),
                    sink,
                ]
            })
            .collect();
        out += &table(
            "routes",
            &["route", "pending", "oldest pending", "sink"],
            &rows,
        );
    } else {
        out += "<p class=\"muted\" id=\"routes-unknown\">This console knows no routing rules, so \
                it cannot group the backlog by route: routes given to the relay as flags are \
                not visible here. Give the console the same <code>--route</code> flags, or put \
                the routes in <code>outbox.toml</code>. The backlog by type is below.</p>";
        if !down.is_empty() {
            let names: Vec<String> = down.iter().map(|d| text(d)).collect();
            let _ = write!(
                out,
                "<p class=\"err\">The relay members report the sink of route {} down.</p>",
                names.join(", ")
            );
        }
    }
    out += "<h2>Backlog by type</h2>";
    let rows: Vec<Vec<String>> = r
        .pending_by_type
        .iter()
        .take(50)
        .map(|t| {
            let topic = t
                .topic
                .as_deref()
                .map_or(String::new(), |x| format!(" [{}]", short(x, CELL_CHARS)));
            vec![
                format!(
                    "{} / {}{topic}",
                    short(&t.aggregate_type, CELL_CHARS),
                    short(&t.event_type, CELL_CHARS)
                ),
                t.pending.to_string(),
                age(t.oldest_pending_age_seconds),
            ]
        })
        .collect();
    out += &table(
        "types",
        &[
            "aggregate type / event type [topic]",
            "pending",
            "oldest pending",
        ],
        &rows,
    );
    if r.pending_by_type.len() > 50 {
        let _ = write!(
            out,
            "<p class=\"muted\">The 50 oldest of {} types; <code>outbox status --format \
             json</code> lists all.</p>",
            r.pending_by_type.len()
        );
    }
    out
}

/// The relay members: live or silent, their heartbeat, partitions and circuit.
fn members(r: &Report) -> String {
    let mut out = String::from("<h2>Relay members and their sinks' circuits</h2>");
    let rows: Vec<(&str, Vec<String>)> = r
        .stats
        .members
        .iter()
        .map(|m| {
            let silent =
                (r.at - m.heartbeat_at).num_milliseconds() as f64 / 1000.0 >= STALE_AFTER_SECONDS;
            let circuit = match m.circuit.as_str() {
                "closed" => format!("<span class=\"ok\">{}</span>", text(&m.circuit)),
                c => format!("<span class=\"err\">{}</span>", text(c)),
            };
            let state = if silent {
                "<span class=\"err\">silent: not live</span>"
            } else {
                "<span class=\"ok\">live</span>"
            };
            (
                if silent { "stale" } else { "" },
                vec![
                    short(&m.member, CELL_CHARS),
                    state.to_string(),
                    ago(m.heartbeat_at, r.at),
                    m.partitions.to_string(),
                    circuit,
                    long(m.sink_error.as_deref().unwrap_or(""), ERROR_CHARS),
                ],
            )
        })
        .collect();
    out += &table_with(
        "members",
        &[
            "member",
            "state",
            "heartbeat",
            "partitions",
            "circuit",
            "sink error",
        ],
        rows.iter().map(|(c, r)| (*c, r.as_slice())),
    );
    if rows.is_empty() {
        out += "<p class=\"muted\">No relay has run here: nothing is published until one starts \
                (<code>outbox relay</code>).</p>";
    }
    out
}

/// Whether a partition needs a look: work without a live owner, or parked or failed messages.
fn troubled(p: &PartitionStatus) -> bool {
    (p.owner.is_none() && p.pending > 0) || p.parked > 0 || p.failed > 0
}

/// Every partition (or with `problems_only` those that need a look), problems first, then those
/// with a backlog, the longest waiting first, then the rest in order.
pub fn partitions(r: &Report, prefix: &str, problems_only: bool) -> String {
    let mut shown: Vec<&PartitionStatus> = r
        .partitions
        .iter()
        .filter(|p| !problems_only || troubled(p))
        .collect();
    shown.sort_by(|a, b| {
        let rank = |p: &PartitionStatus| (!troubled(p), p.pending == 0);
        let age = |p: &PartitionStatus| p.oldest_pending_age_seconds.unwrap_or(-1.0);
        rank(a)
            .cmp(&rank(b))
            .then(age(b).total_cmp(&age(a)))
            .then(a.partition.cmp(&b.partition))
    });
    let rows: Vec<(&str, Vec<String>)> = shown
        .iter()
        .map(|p| {
            let pos = p.position.as_ref();
            (
                if troubled(p) { "trouble" } else { "" },
                vec![
                    p.partition.to_string(),
                    p.owner
                        .as_deref()
                        .map_or("<span class=\"err\">none live</span>".into(), |o| {
                            short(o, CELL_CHARS)
                        }),
                    p.epoch.to_string(),
                    p.lease_until.map_or("–".into(), |t| ago(t, r.at)),
                    p.pending.to_string(),
                    age(p.oldest_pending_age_seconds),
                    p.parked.to_string(),
                    p.failed.to_string(),
                    pos.map_or("–".into(), |x| {
                        format!("{} / {}", x.done_xmin, x.done_xmax)
                    }),
                    pos.map_or("–".into(), |x| x.cursor.to_string()),
                    pos.map_or("–".into(), |x| ago(x.done_at, r.at)),
                    pos.map_or("–".into(), |x| x.published.to_string()),
                ],
            )
        })
        .collect();
    let owned = r.partitions.iter().filter(|p| p.owner.is_some()).count();
    let troubled_n = r.partitions.iter().filter(|p| troubled(p)).count();
    let filter = if problems_only {
        format!("<a href=\"{prefix}/partitions\">show all</a>")
    } else {
        format!("<a href=\"{prefix}/partitions?problems=1\">problems only</a>")
    };
    format!(
        "<p><span data-figure=\"partitions_owned\">{owned}</span> of {} partitions have a live \
         owner; {troubled_n} need a look (work without a live owner, parked or failed \
         messages), listed first ({filter}). The position is the pair of transaction ids every \
         earlier transaction is passed below (<em>done xmin / xmax</em>), plus the cursor inside \
         the open window.</p>{}",
        r.partitions.len(),
        table_with(
            "partitions",
            &[
                "partition",
                "owner",
                "epoch",
                "lease ends",
                "pending",
                "oldest pending",
                "parked",
                "failed",
                "done xmin / xmax",
                "cursor",
                "position taken",
                "published",
            ],
            rows.iter().map(|(c, r)| (*c, r.as_slice()))
        )
    )
}
