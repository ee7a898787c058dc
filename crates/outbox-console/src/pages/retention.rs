//! Retention: the segments kept, their size, and what holds the oldest (a partition's old
//! position, or a transaction that stays open).

use outbox_core::status::{KeptBecause, Report, RetentionPin};

use crate::html::{age, ago, bytes, card, esc, table, text};

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
                    text(&s.name),
                    format!("{} – {}", s.lo, s.hi),
                    s.closed_at
                        .map_or("still written to".into(), |t| ago(t, r.at)),
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
            text(state.as_deref().unwrap_or("state unknown")),
            text(application_name.as_deref().unwrap_or("no application name")),
        ),
        Some(RetentionPin::Partition {
            partition,
            owner,
            behind_seconds,
            ..
        }) => format!(
            "<p data-figure=\"pinned_by\">Partition {partition} (owner {}): its position is \
             {} old. A live relay moves it at its next claim; a stuck one keeps it here.</p>",
            text(owner.as_deref().unwrap_or("none")),
            age(Some(*behind_seconds)),
        ),
    };
    out
}
