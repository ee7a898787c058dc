//! A message's journey: the search forms (by id, by key), then each message found with its
//! timeline, headers and payload. A key's head (retrying or failed) comes first wherever it
//! lies, a waiting message links to it, a failed one offers its redrive; and, where the inbox
//! shares the database, what the inbox did with it.

use std::fmt::Write as _;

use chrono::{DateTime, Utc};
use outbox_core::{Journey, JourneyState, JourneyStep};

use crate::html::{ago, block, esc, long, short, text, url_value};

/// Messages of a key shown at most (besides its head).
pub const KEY_MESSAGES: usize = 20;
/// Characters of a key shown in a message's summary line before it is cut.
const KEY_CHARS: usize = 200;
/// Longest key linked by value.
const KEY_IN_LINK: usize = 512;
/// Characters of headers or a payload shown before the rest is folded away.
const BODY_CHARS: usize = 20_000;

/// What the journey page was asked for, to show back in its forms.
#[derive(Debug, Clone, Default)]
pub struct Asked {
    /// The id typed (as typed).
    pub id: String,
    /// The key typed.
    pub key: String,
}

/// The two search forms, each with what was asked in its own box.
pub fn forms(asked: &Asked, prefix: &str) -> String {
    format!(
        "<form method=\"get\" action=\"{prefix}/messages\" class=\"inline\" id=\"by-id\">Message \
         id <input name=\"id\" size=\"38\" value=\"{}\"> <button>Find</button></form> \
         &nbsp; <form method=\"get\" action=\"{prefix}/messages\" class=\"inline\" \
         id=\"by-key\">or key <input name=\"key\" size=\"24\" value=\"{}\"> \
         <button>Find</button></form>",
        esc(&asked.id),
        esc(&asked.key)
    )
}

/// What a journey page shows besides what was found.
pub struct JourneyView<'a> {
    /// `""` or `"/inbox"`.
    pub prefix: &'a str,
    /// No redrive links (the command to run is shown instead).
    pub read_only: bool,
    /// The inbox's queue: its words (received, handled).
    pub inbox: bool,
    /// The key has more messages than shown.
    pub more: bool,
    /// When the page was read.
    pub now: DateTime<Utc>,
}

/// The forms, then each message found (a key's heads first, then the rest newest first).
pub fn journey(asked: &Asked, found: &[Journey], v: &JourneyView<'_>) -> String {
    let mut out = forms(asked, v.prefix);
    if asked.id.is_empty() && asked.key.is_empty() {
        return out
            + "<p class=\"muted\">Where is my event? Give its id, or its key for the key's \
               latest messages and the one holding them back.</p>";
    }
    if found.is_empty() {
        return out
            + "<p>No such message here: it was never committed (rolled back, or written \
               elsewhere), or its segment was dropped after retention.</p>";
    }
    let head = |j: &&Journey| matches!(j.state, JourneyState::Failed | JourneyState::Retrying);
    let mut ordered: Vec<&Journey> = found.iter().filter(head).collect();
    ordered.sort_by_key(|j| j.seq);
    ordered.extend(found.iter().filter(|j| !head(j)));
    if !asked.key.is_empty() {
        let _ = write!(
            out,
            "<p class=\"muted\" id=\"key-count\">The key's {} latest message(s){}, newest \
             first{}.</p>",
            found.iter().filter(|j| !head(j)).count(),
            if v.more {
                format!(" of more than {KEY_MESSAGES} (find older ones by id)")
            } else {
                String::new()
            },
            if ordered.first().is_some_and(head) {
                ", after the head that holds them back"
            } else {
                ""
            }
        );
    }
    for j in ordered {
        out += &message(j, v);
    }
    out
}

/// One message: its summary, what holds it or what to do, its timeline, headers and payload.
fn message(j: &Journey, v: &JourneyView<'_>) -> String {
    let prefix = v.prefix;
    let key = if j.aggregate_id.len() <= KEY_IN_LINK {
        format!(
            "<a href=\"{prefix}/messages?key={}\">{}</a>",
            url_value(&j.aggregate_id),
            short(&j.aggregate_id, KEY_CHARS)
        )
    } else {
        short(&j.aggregate_id, KEY_CHARS)
    };
    let mut out = format!(
        "<section class=\"journey\" data-message=\"{id}\"><h2>{id}</h2>\
         <p>{kind} of key {key}{topic} — now <strong data-figure=\"state\">{state}</strong></p>",
        id = j.id,
        kind = short(&format!("{}/{}", j.aggregate_type, j.event_type), KEY_CHARS),
        topic = j.topic.as_deref().map_or(String::new(), |t| format!(
            ", topic {}",
            short(t, KEY_CHARS)
        )),
        state = state_word(j.state, v.inbox),
    );
    match (j.state, j.held_by) {
        (JourneyState::Waiting, Some(h)) => {
            let _ = write!(
                out,
                "<p class=\"notice\">Waits behind <a href=\"{prefix}/messages?id={h}\" \
                 class=\"held-by\">{h}</a>, the head of its key (retrying or failed): once that \
                 one goes through (or is redriven), this one follows in order.</p>"
            );
        }
        (JourneyState::Failed, _) if v.read_only => {
            let _ = write!(
                out,
                "<p class=\"notice\">It waits for a redrive. This console is read-only: run \
                 <code>outbox redrive{} --id {} --reason \"…\"</code>.</p>",
                if v.inbox { " --inbox" } else { "" },
                j.id
            );
        }
        (JourneyState::Failed, _) => {
            let _ = write!(
                out,
                "<p class=\"notice\">It waits for a redrive: \
                 <a href=\"{prefix}/redrive?id={}\" class=\"redrive\">Redrive this message…</a> \
                 (you give a reason first).</p>",
                j.id
            );
        }
        _ => {}
    }
    out += "<ol class=\"timeline\">";
    for s in &j.steps {
        out += &step(s, v.inbox, v.now);
    }
    out += "</ol>";
    if j.aggregate_id.chars().count() > KEY_CHARS {
        let _ = write!(
            out,
            "<h3>The whole key</h3><div class=\"wrap\">{}</div>",
            text(&j.aggregate_id)
        );
    }
    let pretty = |v: &serde_json::Value| {
        block(
            &serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string()),
            BODY_CHARS,
        )
    };
    let _ = write!(
        out,
        "<h3>Headers</h3><pre>{}</pre><h3>Payload</h3><pre>{}</pre></section>",
        pretty(&j.headers),
        pretty(&j.payload)
    );
    out
}

/// A state's word; the inbox's queue calls published "handled".
fn state_word(s: JourneyState, inbox: bool) -> &'static str {
    match (s, inbox) {
        (JourneyState::Published, true) => "handled",
        (s, _) => s.as_str(),
    }
}

/// One timeline step; in the inbox's words when `inbox`.
fn step(s: &JourneyStep, inbox: bool, now: DateTime<Utc>) -> String {
    let (what, detail) = match (inbox, s.what.as_str()) {
        (true, "written") => ("received", s.detail.clone()),
        (true, "published") => ("handled", "its handler succeeded".to_string()),
        (_, w) => (w, s.detail.clone()),
    };
    format!(
        "<li class=\"{c}\"><strong>{w}</strong> <span class=\"muted\">{at}</span><br>{d}</li>",
        c = esc(&s.what),
        w = esc(what),
        at = s.at.map_or("time not kept".into(), |t| ago(t, now)),
        d = long(&detail, 2000),
    )
}

/// The inbox's side of a journey (the same database): received, its handler's attempts and
/// redrives, handled; or that it has not arrived.
pub fn receipt(found: &Result<Vec<Journey>, String>, now: DateTime<Utc>) -> String {
    let mut out = String::from("<section class=\"receipt\"><h2>In the inbox</h2>");
    match found {
        Err(e) => {
            let _ = write!(
                out,
                "<p class=\"err\">The inbox could not be read: {}</p>",
                text(e)
            );
        }
        Ok(found) if found.is_empty() => {
            out += "<p>Now <strong data-figure=\"inbox_state\">not received</strong></p>\
                    <p class=\"muted\">The inbox in this database has not recorded it (yet, or \
                    its consumer reads another broker).</p>";
        }
        Ok(found) => {
            for j in found {
                let _ = write!(
                    out,
                    "<p>Now <strong data-figure=\"inbox_state\">{}</strong></p>\
                     <ol class=\"timeline\">",
                    state_word(j.state, true)
                );
                for s in &j.steps {
                    out += &step(s, true, now);
                }
                out += "</ol>";
            }
        }
    }
    out + "</section>"
}
