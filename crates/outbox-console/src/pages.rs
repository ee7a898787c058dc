//! The pages' bodies, from what the store answered: overview, partitions, failed and parked
//! messages, the redrive preview and its result, retention, and a message's journey. Each
//! figure that `outbox status --format json` also reports carries a `data-figure` attribute
//! named after its JSON field, so a test can compare the two.

use std::fmt::Write as _;

use outbox_core::status::{KeptBecause, Report, RetentionPin};
use outbox_core::{BlockedKey, FailedMessage, Journey};

use crate::history::{History, SPAN};

use crate::html::{age, bytes, card, chart, esc, table, url_value};

/// Which messages a failed-list or a redrive concerns: every field that is set must match.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    /// Ordering key, exactly.
    pub key: String,
    /// Part of `aggregate_type/event_type`.
    pub kind: String,
    /// Part of the last error, any case.
    pub error: String,
}

impl Filter {
    /// Whether `m` matches.
    pub fn matches(&self, m: &FailedMessage) -> bool {
        (self.key.is_empty() || m.aggregate_id == self.key)
            && (self.kind.is_empty()
                || format!("{}/{}", m.aggregate_type, m.event_type).contains(&self.kind))
            && (self.error.is_empty()
                || m.last_error
                    .as_deref()
                    .unwrap_or("")
                    .to_lowercase()
                    .contains(&self.error.to_lowercase()))
    }

    /// The filter as a query string (without `?`).
    pub fn query(&self) -> String {
        format!(
            "key={}&type={}&error={}",
            url_value(&self.key),
            url_value(&self.kind),
            url_value(&self.error)
        )
    }
}

/// The overview: the counts, the members and their circuits, the charts, the backlog by route.
pub fn overview(r: &Report, history: &History, inbox: bool) -> String {
    let s = &r.stats;
    let done = if inbox { "handled" } else { "published" };
    let mut out = String::from("<div class=\"cards\">");
    out += &card("pending", "pending", &s.pending.to_string(), false);
    out += &card(
        "oldest_pending_age_seconds",
        "oldest pending",
        &age(s.oldest_pending_age_seconds),
        s.oldest_pending_age_seconds.unwrap_or(0.0) > 60.0,
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
    out += "</div>";
    if s.failed > 0 {
        let prefix = if inbox { "/inbox" } else { "" };
        let _ = write!(
            out,
            "<p class=\"notice\">{} message(s) failed and wait for a redrive: \
             <a href=\"{prefix}/failed\">see them</a>.</p>",
            s.failed
        );
    }
    // The charts reach back as far as the console has sampled, up to an hour, so a console
    // started a minute ago draws a minute, not a line squeezed against the right edge.
    let span = history.reach().clamp(60.0, SPAN.as_secs_f64());
    let _ = write!(
        out,
        "<h2>The last {}</h2><p class=\"muted\">Sampled by this console while it runs.</p>",
        age(Some(span))
    );
    out += &chart(
        "rate",
        &format!("{done} per second"),
        "msg/s",
        span,
        &history.rate(),
    );
    out += &chart(
        "lag",
        "age of the oldest pending message",
        "s",
        span,
        &history.lag(),
    );
    out += &chart(
        "pending",
        "pending messages",
        "msg",
        span,
        &history.pending(),
    );
    out += "<h2>Relay members and their sinks' circuits</h2>";
    let members: Vec<Vec<String>> = s
        .members
        .iter()
        .map(|m| {
            let circuit = match m.circuit.as_str() {
                "closed" => format!("<span class=\"ok\">{}</span>", esc(&m.circuit)),
                c => format!("<span class=\"err\">{}</span>", esc(c)),
            };
            vec![
                esc(&m.member),
                m.partitions.to_string(),
                esc(&m.heartbeat_at.to_rfc3339()),
                circuit,
                esc(m.sink_error.as_deref().unwrap_or("")),
            ]
        })
        .collect();
    out += &table(
        "members",
        &["member", "partitions", "heartbeat", "circuit", "sink error"],
        &members,
    );
    if members.is_empty() {
        out += "<p class=\"muted\">No relay is running: nothing is published until one starts \
                (<code>outbox relay</code>).</p>";
    }
    out += "<h2>Backlog by route</h2>";
    let routes: Vec<Vec<String>> = r
        .routes
        .iter()
        .map(|l| {
            vec![
                esc(&l.route),
                l.pending.to_string(),
                age(l.oldest_pending_age_seconds),
            ]
        })
        .collect();
    out + &table("routes", &["route", "pending", "oldest pending"], &routes)
}

/// Every partition: owner, epoch, lease, lag and position.
pub fn partitions(r: &Report) -> String {
    let rows: Vec<Vec<String>> = r
        .partitions
        .iter()
        .map(|p| {
            let pos = p.position.as_ref();
            vec![
                p.partition.to_string(),
                esc(p.owner.as_deref().unwrap_or("–")),
                p.epoch.to_string(),
                p.lease_until.map_or("–".into(), |t| esc(&t.to_rfc3339())),
                p.pending.to_string(),
                age(p.oldest_pending_age_seconds),
                p.parked.to_string(),
                p.failed.to_string(),
                pos.map_or("–".into(), |x| {
                    format!("{} / {}", x.done_xmin, x.done_xmax)
                }),
                pos.map_or("–".into(), |x| x.cursor.to_string()),
                pos.map_or("–".into(), |x| esc(&x.done_at.to_rfc3339())),
                pos.map_or("–".into(), |x| x.published.to_string()),
            ]
        })
        .collect();
    let owned = r.partitions.iter().filter(|p| p.owner.is_some()).count();
    format!(
        "<p><span data-figure=\"partitions_owned\">{owned}</span> of {} partitions have a live \
         owner. The position is the pair of transaction ids every earlier transaction is passed \
         below (<em>done xmin / xmax</em>), plus the cursor inside the open window.</p>{}",
        r.partitions.len(),
        table(
            "partitions",
            &[
                "partition",
                "owner",
                "epoch",
                "lease until",
                "pending",
                "oldest pending",
                "parked",
                "failed",
                "done xmin / xmax",
                "cursor",
                "position taken",
                "published",
            ],
            &rows
        )
    )
}

/// The failed messages matching `filter` (of the `listed` the store returned) with their
/// errors and redrive links, then the keys parked behind a retrying or failed head.
pub fn failed(
    listed: &[FailedMessage],
    filter: &Filter,
    blocked: &[BlockedKey],
    prefix: &str,
    read_only: bool,
) -> String {
    let shown: Vec<&FailedMessage> = listed.iter().filter(|m| filter.matches(m)).collect();
    let mut out = format!(
        "<form method=\"get\" action=\"{prefix}/failed\">\
         key <input name=\"key\" value=\"{}\" size=\"14\"> \
         type <input name=\"type\" value=\"{}\" size=\"14\" placeholder=\"order/placed\"> \
         error <input name=\"error\" value=\"{}\" size=\"18\"> <button>Filter</button></form>",
        esc(&filter.key),
        esc(&filter.kind),
        esc(&filter.error)
    );
    let _ = write!(
        out,
        "<p><span data-figure=\"failed_shown\">{}</span> failed message(s) match, of {} listed.",
        shown.len(),
        listed.len()
    );
    if !read_only && !shown.is_empty() {
        let _ = write!(
            out,
            " <a href=\"{prefix}/redrive?{}\" id=\"redrive-matching\">Redrive every matching \
             message…</a>",
            filter.query()
        );
    }
    out += "</p>";
    let rows: Vec<Vec<String>> = shown
        .iter()
        .map(|m| {
            let mut row = vec![
                format!("<a href=\"{prefix}/messages?id={id}\">{id}</a>", id = m.id),
                format!(
                    "<a href=\"{prefix}/failed?key={}\">{}</a>",
                    url_value(&m.aggregate_id),
                    esc(&m.aggregate_id)
                ),
                esc(&format!("{}/{}", m.aggregate_type, m.event_type)),
                m.attempts.to_string(),
                format!(
                    "<span class=\"err\">{}</span>",
                    esc(m.last_error.as_deref().unwrap_or("–"))
                ),
                esc(&m.created_at.to_rfc3339()),
            ];
            if !read_only {
                row.push(format!(
                    "<a href=\"{prefix}/redrive?id={}\" class=\"redrive\">redrive…</a>",
                    m.id
                ));
            }
            row
        })
        .collect();
    let mut head = vec![
        "message",
        "key",
        "type",
        "attempts",
        "last error",
        "written",
    ];
    if !read_only {
        head.push("");
    }
    out += &table("failed", &head, &rows);
    out += "<h2>Blocked keys</h2><p class=\"muted\">Keys whose head message is retrying or \
            failed: the key's later messages are parked behind it, in order.</p>";
    let rows: Vec<Vec<String>> = blocked
        .iter()
        .map(|b| {
            vec![
                esc(&b.key),
                esc(&b.state),
                b.attempts.to_string(),
                esc(b.last_error.as_deref().unwrap_or("–")),
            ]
        })
        .collect();
    out + &table("blocked", &["key", "head", "attempts", "last error"], &rows)
}

/// What a redrive will do, and its form: the messages in key order, a reason to give.
pub fn redrive_preview(matching: &[&FailedMessage], prefix: &str, csrf: &str) -> String {
    if matching.is_empty() {
        return format!(
            "<p>No failed message matches: nothing to redrive. \
             <a href=\"{prefix}/failed\">Back to the failed messages</a>.</p>"
        );
    }
    let mut sorted = matching.to_vec();
    sorted.sort_by(|a, b| (&a.aggregate_id, a.seq).cmp(&(&b.aggregate_id, b.seq)));
    let keys = {
        let mut k: Vec<&str> = sorted.iter().map(|m| m.aggregate_id.as_str()).collect();
        k.dedup();
        k.len()
    };
    let rows: Vec<Vec<String>> = sorted
        .iter()
        .map(|m| {
            vec![
                esc(&m.aggregate_id),
                m.seq.to_string(),
                m.id.to_string(),
                esc(&format!("{}/{}", m.aggregate_type, m.event_type)),
                m.attempts.to_string(),
                esc(m.last_error.as_deref().unwrap_or("–")),
            ]
        })
        .collect();
    let ids: Vec<String> = sorted.iter().map(|m| m.id.to_string()).collect();
    format!(
        "<p>This gives <strong data-figure=\"redrive_count\">{n}</strong> failed message(s) of \
         {keys} key(s) a fresh budget: each goes back to retrying, due now, with zero attempts, \
         and its key's parked messages follow it in order. Each is written to \
         <code>outbox_redrives</code> with its attempts, last error and your reason.</p>{t}\
         <form method=\"post\" action=\"{prefix}/redrive\" id=\"redrive-form\">\
         <input type=\"hidden\" name=\"csrf\" value=\"{csrf}\">\
         <input type=\"hidden\" name=\"ids\" value=\"{ids}\">\
         <p><label>Reason (kept in the audit trail)<br>\
         <textarea name=\"reason\" rows=\"2\" cols=\"60\" required></textarea></label></p>\
         <p><button type=\"submit\">Redrive {n} message(s)</button> \
         <a href=\"{prefix}/failed\">Cancel</a></p></form>",
        n = sorted.len(),
        t = table(
            "redrive",
            &["key", "seq", "message", "type", "attempts", "last error"],
            &rows
        ),
        csrf = esc(csrf),
        ids = ids.join(","),
    )
}

/// What a redrive did.
pub fn redrive_done(n: u64, asked: &[uuid::Uuid], reason: &str, prefix: &str) -> String {
    let links: Vec<String> = asked
        .iter()
        .map(|id| format!("<li><a href=\"{prefix}/messages?id={id}\">{id}</a></li>"))
        .collect();
    format!(
        "<p class=\"notice\"><strong data-figure=\"redriven\">{n}</strong> message(s) redriven \
         (of {} asked; a message no longer failed is left as it is), recorded in \
         <code>outbox_redrives</code> with the reason “{}”. The relay hands them out at its \
         next claim.</p><ul>{}</ul><p><a href=\"{prefix}/failed\">Back to the failed \
         messages</a></p>",
        asked.len(),
        esc(reason),
        links.join("")
    )
}

/// Segments, their size, and what holds the oldest.
pub fn retention(r: &Report) -> String {
    let Some(ret) = &r.retention else {
        return "<p>This store keeps no segments: published rows are deleted by age \
                (<code>outbox purge</code>), and nothing can hold that back.</p>"
            .into();
    };
    let mut out = String::from("<div class=\"cards\">");
    out += &card("segments", "segments", &ret.segments.to_string(), false);
    out += &card("bytes", "on disk", &bytes(ret.bytes), false);
    out += &card(
        "next_xid",
        "next transaction id",
        &ret.next_xid.to_string(),
        false,
    );
    out += &card(
        "horizon",
        "horizon",
        &ret.horizon.map_or("–".into(), |h| h.to_string()),
        false,
    );
    out += "</div><h2>The oldest segment</h2>";
    match &ret.oldest_segment {
        Some(s) => {
            let why = match ret.kept_because {
                Some(KeptBecause::Open) => "new transactions still write into it",
                Some(KeptBecause::Horizon) => "the horizon has not passed its end (see below)",
                Some(KeptBecause::Retention) => {
                    "every reader has passed it; it goes once its retention runs out"
                }
                None => "–",
            };
            out += &table(
                "oldest-segment",
                &["segment", "transactions", "closed", "size", "kept because"],
                &[vec![
                    esc(&s.name),
                    format!("{} – {}", s.lo, s.hi),
                    s.closed_at
                        .map_or("still written to".into(), |t| esc(&t.to_rfc3339())),
                    s.bytes
                        .map_or("–".into(), |b| format!("{:.1} MiB", b as f64 / 1048576.0)),
                    esc(why),
                ]],
            );
        }
        None => out += "<p class=\"muted\">No segment yet.</p>",
    }
    out += "<h2>What pins the horizon</h2>";
    out += &match &ret.pinned_by {
        None => "<p class=\"ok\">Nothing holds it back.</p>".to_string(),
        Some(RetentionPin::Transaction {
            xid,
            pid,
            age_seconds,
            state,
            application_name,
            ..
        }) => format!(
            "<p class=\"err\" data-figure=\"pinned_by\">A transaction: xid {xid}, backend {}, \
             running for {}, {} ({}). No position can pass it until it ends: end it with \
             <code>SELECT pg_terminate_backend(pid)</code> if it is forgotten.</p>",
            pid.map_or("–".into(), |p| p.to_string()),
            age(*age_seconds),
            esc(state.as_deref().unwrap_or("state unknown")),
            esc(application_name.as_deref().unwrap_or("no application name")),
        ),
        Some(RetentionPin::Partition {
            partition,
            owner,
            behind_seconds,
            ..
        }) => format!(
            "<p data-figure=\"pinned_by\">Partition {partition} (owner {}): its position is \
             {} old. A live relay moves it at its next claim; a stuck one keeps it here.</p>",
            esc(owner.as_deref().unwrap_or("none")),
            age(Some(*behind_seconds)),
        ),
    };
    out
}

/// The journey search form, then each message found with its timeline, headers and payload.
pub fn journey(asked: &str, found: &[Journey], prefix: &str) -> String {
    let mut out = format!(
        "<form method=\"get\" action=\"{prefix}/messages\">Message id <input name=\"id\" size=\"38\" \
         value=\"{}\"> or key <input name=\"key\" size=\"20\"> <button>Find</button></form>",
        esc(asked)
    );
    if asked.is_empty() {
        return out
            + "<p class=\"muted\">Where is my event? Give its id, or its key for the key's \
               latest messages.</p>";
    }
    if found.is_empty() {
        return out
            + "<p>No such message in the outbox: it was never committed (rolled back, or \
               written elsewhere), or its segment was dropped after retention.</p>";
    }
    for j in found {
        let _ = write!(
            out,
            "<section class=\"journey\" data-message=\"{id}\"><h2>{id}</h2>\
             <p>{kind} of key <a href=\"{prefix}/messages?key={k}\">{key}</a>{topic} — now \
             <strong data-figure=\"state\">{state}</strong></p><ol class=\"timeline\">",
            id = j.id,
            kind = esc(&format!("{}/{}", j.aggregate_type, j.event_type)),
            k = url_value(&j.aggregate_id),
            key = esc(&j.aggregate_id),
            topic = j
                .topic
                .as_deref()
                .map_or(String::new(), |t| format!(", topic {}", esc(t))),
            state = j.state.as_str(),
        );
        for s in &j.steps {
            let _ = write!(
                out,
                "<li class=\"{w}\"><strong>{w}</strong> <span class=\"muted\">{at}</span><br>{d}</li>",
                w = esc(&s.what),
                at = s.at.map_or("time not kept".into(), |t| esc(&t.to_rfc3339())),
                d = esc(&s.detail),
            );
        }
        let pretty = |v: &serde_json::Value| {
            esc(&serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string()))
        };
        let _ = write!(
            out,
            "</ol><h3>Headers</h3><pre>{}</pre><h3>Payload</h3><pre>{}</pre></section>",
            pretty(&j.headers),
            pretty(&j.payload)
        );
    }
    out
}

/// The inbox's side of a journey (the same database): received, its handler's attempts and
/// redrives, handled; or that it has not arrived.
pub fn receipt(found: &Result<Vec<Journey>, String>) -> String {
    let mut out = String::from("<section class=\"receipt\"><h2>In the inbox</h2>");
    match found {
        Err(e) => {
            let _ = write!(
                out,
                "<p class=\"err\">The inbox could not be read: {}</p>",
                esc(e)
            );
        }
        Ok(found) if found.is_empty() => {
            out += "<p>Now <strong data-figure=\"inbox_state\">not received</strong></p>\
                    <p class=\"muted\">The inbox in this database has not recorded it (yet, or \
                    its consumer reads another broker).</p>";
        }
        Ok(found) => {
            for j in found {
                let state = match j.state.as_str() {
                    "published" => "handled",
                    s => s,
                };
                let _ = write!(
                    out,
                    "<p>Now <strong data-figure=\"inbox_state\">{state}</strong></p>\
                     <ol class=\"timeline\">"
                );
                for s in &j.steps {
                    // The inbox's queue is an outbox store: its words, in the inbox's terms.
                    let (what, detail) = match s.what.as_str() {
                        "written" => ("received", s.detail.clone()),
                        "published" => ("handled", "its handler succeeded".to_string()),
                        w => (w, s.detail.clone()),
                    };
                    let _ = write!(
                        out,
                        "<li class=\"{c}\"><strong>{w}</strong> <span class=\"muted\">{at}</span><br>{d}</li>",
                        c = esc(&s.what),
                        w = esc(what),
                        at = s.at.map_or("time not kept".into(), |t| esc(&t.to_rfc3339())),
                        d = esc(&detail),
                    );
                }
                out += "</ol>";
            }
        }
    }
    out + "</section>"
}
