//! The failed messages as the store filtered, counted and paged them, the blocked keys grouped
//! by cause, the redrive preview (exactly what the form will redrive) and the redrive's result.

use std::fmt::Write as _;

use chrono::{DateTime, Utc};
use outbox_core::flow::human_count;
use outbox_core::{BlockedKey, FailedFilter, FailedMessage, FailedPage};

use crate::html::{ago, esc, long, short, table, text, url_value, CELL_CHARS, ERROR_CHARS};

/// Failed messages shown per page.
pub const PAGE: usize = 100;
/// Failed messages one redrive form carries at most (their ids fit the form's size limit).
pub const REDRIVE_AT_MOST: usize = 1000;
/// Longest key linked by value; longer ones are linked through a message id (a long key in a
/// query string is refused by servers and proxies).
const KEY_IN_LINK: usize = 512;

/// `filter` as a query string (without `?`), only the fields set.
pub fn filter_query(filter: &FailedFilter) -> String {
    let mut q = form_urlencoded::Serializer::new(String::new());
    for (name, v) in [
        ("key", &filter.key),
        ("type", &filter.kind),
        ("error", &filter.error),
    ] {
        if let Some(v) = v {
            q.append_pair(name, v);
        }
    }
    q.finish()
}

/// A link to the messages of `key`: by value when it is short enough for an address, else to
/// the journey of `id` (one of its messages), where the whole key is shown; without an id, the
/// key cut (its failed head's row on the list links to the whole).
fn key_link(prefix: &str, path: &str, key: &str, id: Option<uuid::Uuid>) -> String {
    if key.len() <= KEY_IN_LINK {
        format!(
            "<a href=\"{prefix}{path}?key={}\">{}</a>",
            url_value(key),
            short(key, CELL_CHARS)
        )
    } else {
        match id {
            Some(id) => format!(
                "{} <a href=\"{prefix}/messages?id={id}\">whole key</a>",
                short(key, CELL_CHARS)
            ),
            None => short(key, CELL_CHARS),
        }
    }
}

/// What the failed page shows.
pub struct FailedView<'a> {
    /// The page the store answered.
    pub page: &'a FailedPage,
    /// The filter it answered for.
    pub filter: &'a FailedFilter,
    /// The sequence the page starts after (`None`: the first page).
    pub after: Option<i64>,
    /// Failed messages in all, whatever the filter.
    pub failed_total: i64,
    /// Up to 20 keys held by a retrying or failed head.
    pub blocked: &'a [BlockedKey],
    /// `""` or `"/inbox"`.
    pub prefix: &'a str,
    /// No redrive links.
    pub read_only: bool,
    /// When the page was read.
    pub now: DateTime<Utc>,
}

/// The filter form, the count of what matches, one page of it, and the blocked keys.
pub fn failed(v: &FailedView<'_>) -> String {
    let (prefix, f) = (v.prefix, v.filter);
    let mut out = format!(
        "<form method=\"get\" action=\"{prefix}/failed\" id=\"filter\">\
         key <input name=\"key\" value=\"{}\" size=\"14\" placeholder=\"exact key\"> \
         type <input name=\"type\" value=\"{}\" size=\"18\" \
         placeholder=\"part: order/order.placed, placed\"> \
         error <input name=\"error\" value=\"{}\" size=\"18\" placeholder=\"part of the error\"> \
         <button>Filter</button> <a href=\"{prefix}/failed\">clear</a></form>",
        esc(f.key.as_deref().unwrap_or("")),
        esc(f.kind.as_deref().unwrap_or("")),
        esc(f.error.as_deref().unwrap_or("")),
    );
    let shown = &v.page.messages;
    let query = filter_query(f);
    let _ = write!(
        out,
        "<p><strong data-figure=\"failed_shown\">{}</strong> failed message(s) match{}",
        v.page.total,
        if f.is_empty() {
            String::new()
        } else {
            format!(", of {} failed", human_count(v.failed_total))
        }
    );
    if !shown.is_empty() {
        let _ = write!(
            out,
            "; this page shows <span data-figure=\"failed_on_page\">{}</span>, oldest first",
            shown.len()
        );
    }
    out += ".";
    if !v.read_only && v.page.total > 0 {
        let _ = write!(
            out,
            " <a href=\"{prefix}/redrive?{query}\" id=\"redrive-matching\">Redrive {} \
             message(s)…</a>",
            if f.is_empty() {
                "every failed".to_string()
            } else {
                format!("the {} matching", human_count(v.page.total))
            }
        );
    }
    out += "</p>";
    let rows: Vec<Vec<String>> = shown
        .iter()
        .map(|m| {
            let mut row = Vec::new();
            if !v.read_only {
                row.push(format!(
                    "<a href=\"{prefix}/redrive?id={}\" class=\"redrive\">redrive…</a>",
                    m.id
                ));
            }
            row.extend([
                format!("<a href=\"{prefix}/messages?id={id}\">{id}</a>", id = m.id),
                key_link(prefix, "/failed", &m.aggregate_id, Some(m.id)),
                short(
                    &format!("{}/{}", m.aggregate_type, m.event_type),
                    CELL_CHARS,
                ),
                m.attempts.to_string(),
                format!(
                    "<span class=\"err\">{}</span>",
                    long(m.last_error.as_deref().unwrap_or("–"), ERROR_CHARS)
                ),
                ago(m.created_at, v.now),
            ]);
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
    if !v.read_only {
        head.insert(0, "action");
    }
    out += &table("failed", &head, &rows);
    out += &pager(v, &query);
    out + &blocked(v)
}

/// Links to the first page and the next one.
fn pager(v: &FailedView<'_>, query: &str) -> String {
    let prefix = v.prefix;
    let join = if query.is_empty() { "" } else { "&" };
    let mut links = Vec::new();
    if v.after.is_some() {
        links.push(format!(
            "<a href=\"{prefix}/failed?{}\" id=\"first-page\">← first page</a>",
            esc(query)
        ));
    }
    if let Some(last) = v.page.messages.last() {
        if v.page.messages.len() == PAGE {
            links.push(format!(
                "<a href=\"{prefix}/failed?{}{join}after={}\" id=\"next-page\">next {PAGE} →</a>",
                esc(query),
                last.seq
            ));
        }
    }
    if links.is_empty() {
        String::new()
    } else {
        format!("<p class=\"pager\">{}</p>", links.join(" · "))
    }
}

/// Why keys are blocked: their head's state and last error.
type Cause<'a> = (&'a str, Option<&'a str>);

/// The blocked keys (as many as the store's status lists), grouped by the head's state and
/// error, narrowed by the key and error filters.
fn blocked(v: &FailedView<'_>) -> String {
    let f = v.filter;
    let keys: Vec<&BlockedKey> = v
        .blocked
        .iter()
        .filter(|b| f.key.as_deref().is_none_or(|k| b.key == k))
        .filter(|b| {
            f.error.as_deref().is_none_or(|e| {
                b.last_error
                    .as_deref()
                    .unwrap_or("")
                    .to_lowercase()
                    .contains(&e.to_lowercase())
            })
        })
        .collect();
    let mut groups: Vec<(Cause<'_>, Vec<&str>)> = Vec::new();
    for b in &keys {
        let cause = (b.state.as_str(), b.last_error.as_deref());
        match groups.iter_mut().find(|(c, _)| *c == cause) {
            Some((_, ks)) => ks.push(&b.key),
            None => groups.push((cause, vec![&b.key])),
        }
    }
    let rows: Vec<Vec<String>> = groups
        .iter()
        .map(|((state, error), ks)| {
            let mut listed: Vec<String> = ks
                .iter()
                .take(8)
                .map(|k| key_link(v.prefix, "/messages", k, None))
                .collect();
            if ks.len() > 8 {
                listed.push(format!("… and {} more", ks.len() - 8));
            }
            vec![
                format!(
                    "<span class=\"err\">{}</span>",
                    long(error.unwrap_or("–"), ERROR_CHARS)
                ),
                text(state),
                ks.len().to_string(),
                listed.join(", "),
            ]
        })
        .collect();
    let mut out = String::from(
        "<h2>Blocked keys</h2><p class=\"muted\">Keys whose head message is retrying or \
         failed, grouped by the head's error: the key's later messages are parked behind it, in \
         order. The status lists 20 keys at most",
    );
    if f.kind.is_some() {
        out += "; the type filter does not apply here";
    }
    out += ".</p>";
    out + &table(
        "blocked",
        &["cause (the head's last error)", "head", "keys", "which"],
        &rows,
    )
}

/// What a redrive preview concerns, in words.
pub enum Scope<'a> {
    /// One message by id.
    Id(uuid::Uuid),
    /// The failed messages a filter matches (every one when it is empty).
    Filter(&'a FailedFilter),
}

/// What a redrive will do, and its form: the messages in key order, a reason to give. `total`
/// counts every match; the form carries `matching` (at most [`REDRIVE_AT_MOST`]).
pub fn redrive_preview(
    matching: &[FailedMessage],
    total: i64,
    scope: &Scope<'_>,
    prefix: &str,
    csrf: &str,
) -> String {
    let what = match scope {
        Scope::Id(id) => format!("the message {id}"),
        Scope::Filter(f) if f.is_empty() => "every failed message (no filter)".to_string(),
        Scope::Filter(f) => {
            let mut parts = Vec::new();
            if let Some(k) = &f.key {
                parts.push(format!("key = {}", short(k, CELL_CHARS)));
            }
            if let Some(k) = &f.kind {
                parts.push(format!("type contains {}", short(k, CELL_CHARS)));
            }
            if let Some(e) = &f.error {
                parts.push(format!("error contains {}", short(e, CELL_CHARS)));
            }
            format!("the failed messages where {}", parts.join(" and "))
        }
    };
    if matching.is_empty() {
        return format!(
            "<p>Asked for {what}: no failed message matches, nothing to redrive. \
             <a href=\"{prefix}/failed\">Back to the failed messages</a>.</p>"
        );
    }
    let mut sorted: Vec<&FailedMessage> = matching.iter().collect();
    sorted.sort_by(|a, b| (&a.aggregate_id, a.seq).cmp(&(&b.aggregate_id, b.seq)));
    let keys = {
        let mut k: Vec<&str> = sorted.iter().map(|m| m.aggregate_id.as_str()).collect();
        k.dedup();
        k.len()
    };
    let more = if total > sorted.len() as i64 {
        format!(
            "<p class=\"notice\" id=\"redrive-more\">{} failed messages match; one redrive \
             carries the oldest {} of them. Redrive these, then open this page again for the \
             rest.</p>",
            human_count(total),
            human_count(sorted.len() as i64)
        )
    } else {
        String::new()
    };
    let rows: Vec<Vec<String>> = sorted
        .iter()
        .map(|m| {
            vec![
                short(&m.aggregate_id, CELL_CHARS),
                m.seq.to_string(),
                format!("<a href=\"{prefix}/messages?id={id}\">{id}</a>", id = m.id),
                short(
                    &format!("{}/{}", m.aggregate_type, m.event_type),
                    CELL_CHARS,
                ),
                m.attempts.to_string(),
                long(m.last_error.as_deref().unwrap_or("–"), ERROR_CHARS),
            ]
        })
        .collect();
    let ids: Vec<String> = sorted.iter().map(|m| m.id.to_string()).collect();
    format!(
        "<p>Asked for {what}. This gives <strong data-figure=\"redrive_count\">{n}</strong> \
         failed message(s) of {keys} key(s) a fresh budget: each goes back to retrying, due \
         now, with zero attempts, and its key's parked messages follow it in order. Each is \
         written to <code>outbox_redrives</code> with its attempts, last error and your \
         reason.</p>{more}\
         <form method=\"post\" action=\"{prefix}/redrive\" id=\"redrive-form\">\
         <input type=\"hidden\" name=\"csrf\" value=\"{csrf}\">\
         <input type=\"hidden\" name=\"ids\" value=\"{ids}\">\
         <p><label>Reason (kept in the audit trail)<br>\
         <textarea name=\"reason\" rows=\"2\" cols=\"60\" required></textarea></label></p>\
         <p><label>Your name (optional, kept with the reason) \
         <input name=\"who\" size=\"24\" maxlength=\"80\"></label></p>\
         <p><button type=\"submit\">Redrive {n} message(s)</button> \
         <a href=\"{prefix}/failed\">Cancel</a></p></form>{t}",
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

/// What one redrive did, kept for its result page.
#[derive(Debug, Clone)]
pub struct Done {
    /// Messages redriven.
    pub redriven: u64,
    /// The ids the form carried.
    pub asked: Vec<uuid::Uuid>,
    /// The reason as recorded.
    pub reason: String,
    /// When it ran.
    pub at: DateTime<Utc>,
}

/// Journeys linked from a result page at most.
const DONE_LINKS: usize = 50;

/// What a redrive did.
pub fn redrive_done(d: &Done, prefix: &str) -> String {
    let mut links: Vec<String> = d
        .asked
        .iter()
        .take(DONE_LINKS)
        .map(|id| format!("<li><a href=\"{prefix}/messages?id={id}\">{id}</a></li>"))
        .collect();
    if d.asked.len() > DONE_LINKS {
        links.push(format!(
            "<li>… and {} more</li>",
            d.asked.len() - DONE_LINKS
        ));
    }
    let said = if d.redriven == 0 {
        format!(
            "<p class=\"notice\">Nothing was redriven (<strong data-figure=\"redriven\">0\
             </strong> of {} asked): none of them is failed any more (redriven meanwhile, or \
             published). Nothing was written to <code>outbox_redrives</code>.</p>",
            d.asked.len()
        )
    } else {
        format!(
            "<p class=\"notice\"><strong data-figure=\"redriven\">{}</strong> message(s) \
             redriven (of {} asked; a message no longer failed is left as it is), recorded in \
             <code>outbox_redrives</code> with the reason {}. The relay hands them out at its \
             next claim.</p>",
            d.redriven,
            d.asked.len(),
            text(&d.reason)
        )
    };
    format!(
        "{said}<p class=\"muted\">Redriven {}. Reloading this page shows this result again; it \
         redrives nothing.</p><ul>{}</ul><p><a href=\"{prefix}/failed\">Back to the failed \
         messages</a></p>",
        ago(d.at, Utc::now()),
        links.join("")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failed(key: &str, seq: i64) -> FailedMessage {
        FailedMessage {
            id: uuid::Uuid::now_v7(),
            seq,
            aggregate_type: "order".into(),
            aggregate_id: key.into(),
            event_type: "order.placed".into(),
            attempts: 3,
            last_error: Some("422 <script>alert(1)</script>".into()),
            created_at: Utc::now(),
        }
    }

    #[test]
    fn a_huge_key_is_cut_and_linked_by_id_never_by_value() {
        let key = format!("long-key-{}", "L".repeat(100_000));
        let page = FailedPage {
            total: 1,
            messages: vec![failed(&key, 1)],
        };
        let html = super::failed(&FailedView {
            page: &page,
            filter: &FailedFilter::default(),
            after: None,
            failed_total: 1,
            blocked: &[],
            prefix: "",
            read_only: false,
            now: Utc::now(),
        });
        assert!(html.len() < 5_000, "{} bytes", html.len());
        assert!(!html.contains("?key=long-key"), "no link by a 100 KB key");
        assert!(html.contains("whole key"));
        assert!(!html.contains("<script>"));
    }

    #[test]
    fn the_preview_says_when_more_match_than_one_redrive_carries() {
        let ms: Vec<FailedMessage> = (0..3).map(|i| failed(&format!("k{i}"), i)).collect();
        let f = FailedFilter::default();
        let html = redrive_preview(&ms, 1216, &Scope::Filter(&f), "", "csrf");
        assert!(html.contains("1,216 failed messages match"), "{html}");
        assert!(html.contains("every failed message (no filter)"));
    }

    #[test]
    fn nothing_redriven_is_said_as_such() {
        let d = Done {
            redriven: 0,
            asked: vec![uuid::Uuid::now_v7()],
            reason: "r".into(),
            at: Utc::now(),
        };
        let html = redrive_done(&d, "");
        assert!(html.contains("Nothing was redriven") && !html.contains("recorded in"));
    }
}
