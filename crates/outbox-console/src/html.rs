//! HTML building blocks: escaping, untrusted text shown safely, the page frame (navigation,
//! inline style, no script), tables, figures tagged for tests (`data-figure`), times, and
//! charts drawn as inline SVG on the server.
//!
//! Every value a store, a broker or a user supplied goes through [`text`], [`short`] or
//! [`long`]: HTML-escaped, each control, bidi or invisible character shown by name in a marked
//! span (the rule of `outbox_core::text`, the same as on a terminal), isolated in `<bdi>` so
//! right-to-left text cannot reorder the console's own words, and cut when long with the whole
//! value a click away. Nothing is fetched from the network (no script, font or stylesheet link),
//! so a page renders the same offline.

use std::fmt::Write as _;

use chrono::{DateTime, Utc};
use outbox_core::flow::human_age;
use outbox_core::text::{name, pieces, Piece};

/// Characters of a value shown in a table cell before it is cut.
pub const CELL_CHARS: usize = 120;
/// Characters of an error shown in a table cell before it is cut.
pub const ERROR_CHARS: usize = 300;

/// `s` with `& < > " '` escaped, safe in element content and in quoted attributes. Our own
/// words only: untrusted values go through [`text`].
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// An untrusted value as HTML content: escaped, every hidden character shown by name in a
/// `ctl` span, the whole isolated in `<bdi>`.
pub fn text(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 11);
    out.push_str("<bdi>");
    for piece in pieces(s) {
        match piece {
            Piece::Text(t) => out.push_str(&esc(t)),
            Piece::Hidden(c) => {
                let _ = write!(out, "<span class=\"ctl\">⟨{}⟩</span>", name(c));
            }
        }
    }
    out.push_str("</bdi>");
    out
}

/// An untrusted value cut to `max` characters, with a marker that says how long it is when it
/// was cut (the caller links to where it is shown whole).
pub fn short(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        None => text(s),
        Some((at, _)) => format!(
            "{}<span class=\"cut\">… ({})</span>",
            text(&s[..at]),
            bytes(s.len() as i64)
        ),
    }
}

/// An untrusted value cut to `max` characters, with the whole of it one click away (a
/// `<details>` that wraps at any character, so it never widens the page).
pub fn long(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        None => text(s),
        Some((at, _)) => format!(
            "{}<details class=\"whole\"><summary>… the whole value ({})</summary>\
             <div class=\"wrap\">{}</div></details>",
            text(&s[..at]),
            bytes(s.len() as i64),
            text(s)
        ),
    }
}

/// Text of our own layout whose lines hold untrusted values (pretty-printed JSON, whose
/// strings carry their own controls escaped): each line as [`text`], the line breaks kept, for a
/// `<pre>`; cut after `max` characters with the whole a click away, as [`long`].
pub fn block(s: &str, max: usize) -> String {
    let lines = |s: &str| s.split('\n').map(text).collect::<Vec<_>>().join("\n");
    match s.char_indices().nth(max) {
        None => lines(s),
        Some((at, _)) => format!(
            "{}<details class=\"whole\"><summary>… the whole value ({})</summary>{}</details>",
            lines(&s[..at]),
            bytes(s.len() as i64),
            lines(s)
        ),
    }
}

/// `s` percent-encoded for a query string value.
pub fn url_value(s: &str) -> String {
    form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

const STYLE: &str = "body{font:14px/1.45 system-ui,sans-serif;margin:0;color:#1d232b;background:#f6f7f9}\
header{background:#1d232b;color:#fff;padding:.6em 1.2em;display:flex;gap:1.2em;align-items:center;flex-wrap:wrap}\
header a{color:#cfe3ff;text-decoration:none}header a.on{color:#fff;font-weight:600;border-bottom:2px solid #fff}\
header .place{margin-left:auto;color:#9aa7b4;font-size:12px;overflow-wrap:anywhere}\
header form{margin:0}header button{background:none;border:1px solid #5b6675;color:#cfe3ff;border-radius:4px;font-size:12px}\
.bar{display:flex;gap:1em;flex-wrap:wrap;align-items:baseline;color:#5b6675;font-size:12px;margin:.2em 0 .4em}\
.bar a.on{font-weight:600;color:#1d232b}\
main{padding:1em 1.2em;max-width:1200px}h1{font-size:20px;margin:.2em 0 .6em}h2{font-size:16px;margin:1.2em 0 .4em}\
.cards{display:flex;flex-wrap:wrap;gap:.6em}.card{background:#fff;border:1px solid #dde2e8;border-radius:6px;padding:.5em .9em;min-width:8em}\
.card .v{font-size:22px;font-weight:600}.card .k{color:#5b6675;font-size:12px}.bad .v{color:#b3261e}\
table{border-collapse:collapse;background:#fff;width:100%;margin:.3em 0}th,td{border:1px solid #dde2e8;padding:.3em .5em;text-align:left;vertical-align:top}\
th{background:#eef1f4;font-weight:600}td.n{text-align:right;font-variant-numeric:tabular-nums}tr.stale td{color:#8a94a1}tr.trouble td{background:#fffbea}\
.muted{color:#5b6675}.err{color:#b3261e}.ok{color:#1b7f3b}\
pre,.wrap{background:#fff;border:1px solid #dde2e8;padding:.6em;white-space:pre-wrap;overflow-wrap:anywhere;max-width:100%;box-sizing:border-box}\
bdi{overflow-wrap:anywhere}.ctl{color:#b3261e;background:#fde8e6;border-radius:3px;padding:0 .15em;font-size:85%;font-family:monospace}\
.cut{color:#5b6675;font-size:85%}details.whole summary{color:#2b6cb0;cursor:pointer;font-size:85%}\
form.inline{display:inline}input,button,textarea{font:inherit;max-width:100%}button{cursor:pointer}\
.notice{background:#fff8e1;border:1px solid #f0d58c;padding:.5em .8em;border-radius:6px}\
.flow{border-radius:6px;padding:.6em .9em;margin:0 0 .8em;border:1px solid;font-size:15px}\
.flow strong.state{text-transform:uppercase;margin-right:.5em}.flow ul{margin:.3em 0 0;padding-left:1.2em;font-size:14px}\
.flow.good{background:#e8f5ec;border-color:#9ccfab}.flow.warn{background:#fff8e1;border-color:#f0d58c}.flow.crit{background:#fde8e6;border-color:#e8a39c}\
ol.timeline{list-style:none;padding:0;border-left:3px solid #b8c4d2;margin-left:.5em}\
ol.timeline li{padding:.2em 0 .6em 1em;position:relative}ol.timeline li:before{content:'';position:absolute;left:-8px;top:.55em;width:11px;height:11px;border-radius:50%;background:#5b6675}\
ol.timeline li.failed:before{background:#b3261e}ol.timeline li.published:before{background:#1b7f3b}ol.timeline li.redriven:before{background:#d98a00}\
.scroll{overflow-x:auto}svg.chart{background:#fff;border:1px solid #dde2e8;max-width:100%;height:auto}\
@media (max-width:640px){.scroll table,.scroll tbody,.scroll tr,.scroll td{display:block}.scroll thead{display:none}\
.scroll tr{border:1px solid #dde2e8;margin:.5em 0;background:#fff}.scroll td{border:none;padding:.15em .5em}\
.scroll td[data-label]:not([data-label=\"\"]):before{content:attr(data-label) \": \";color:#5b6675;font-size:12px}}";

/// What every page's frame shows besides its body.
#[derive(Debug, Clone, Default)]
pub struct Frame {
    /// Which database (its password already redacted).
    pub place: String,
    /// The CSRF token for the sign-out button; `None` when the console has no token.
    pub sign_out: Option<String>,
    /// Whether the inbox pages exist (their links are shown).
    pub inbox: bool,
    /// This page's path and query without `refresh`, for the refresh links; `None` for pages
    /// that should not refresh (forms, results).
    pub here: Option<String>,
    /// Seconds between refreshes asked for with `?refresh=`.
    pub refresh: Option<u32>,
    /// When the page's figures were read.
    pub at: Option<DateTime<Utc>>,
}

/// The navigation: path and label of each page; the inbox's last.
const NAV: [(&str, &str); 7] = [
    ("/", "Overview"),
    ("/partitions", "Partitions"),
    ("/failed", "Failed & parked"),
    ("/messages", "Message journey"),
    ("/retention", "Retention"),
    ("/inbox", "Inbox"),
    ("/inbox/failed", "Inbox failed"),
];

/// The refresh periods offered, seconds.
pub const REFRESH_CHOICES: [u32; 3] = [10, 30, 60];

/// A whole page: `title`, the navigation with `active` marked, the frame and `body`.
pub fn page(title: &str, active: &str, frame: &Frame, body: &str) -> String {
    let mut nav = String::new();
    for (path, label) in NAV {
        if path.starts_with("/inbox") && !frame.inbox {
            continue;
        }
        let class = if path == active { " class=\"on\"" } else { "" };
        let _ = write!(nav, "<a href=\"{path}\"{class}>{label}</a>");
    }
    let sign_out = frame.sign_out.as_ref().map_or(String::new(), |csrf| {
        format!(
            "<form method=\"post\" action=\"/signout\"><input type=\"hidden\" name=\"csrf\" \
             value=\"{}\"><button type=\"submit\">Sign out</button></form>",
            esc(csrf)
        )
    });
    let mut bar = String::new();
    let mut meta = String::new();
    if let Some(at) = frame.at {
        let _ = write!(
            bar,
            "<span>As of <time datetime=\"{}\">{}</time></span>",
            at.to_rfc3339(),
            at.format("%H:%M:%S UTC")
        );
    }
    if let Some(here) = &frame.here {
        let join = if here.contains('?') { '&' } else { '?' };
        bar.push_str("<span>Refresh: ");
        let on = |b: bool| if b { " class=\"on\"" } else { "" };
        let _ = write!(
            bar,
            "<a href=\"{}\"{}>off</a>",
            esc(here),
            on(frame.refresh.is_none())
        );
        for s in REFRESH_CHOICES {
            let _ = write!(
                bar,
                " · <a href=\"{}\"{}>{s} s</a>",
                esc(&format!("{here}{join}refresh={s}")),
                on(frame.refresh == Some(s))
            );
        }
        bar.push_str("</span>");
        if let Some(s) = frame.refresh {
            // A refresh with no script: the browser reloads the same address.
            let _ = write!(meta, "<meta http-equiv=\"refresh\" content=\"{s}\">");
        }
    }
    format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">{meta}\
         <title>{t} · outbox console</title><style>{STYLE}</style></head><body>\
         <header><strong>outbox</strong>{nav}<span class=\"place\">{p}</span>{sign_out}</header>\
         <main><h1>{t}</h1>{bar}{body}</main></body></html>",
        t = esc(title),
        p = text(&frame.place),
        bar = if bar.is_empty() {
            String::new()
        } else {
            format!("<div class=\"bar\">{bar}</div>")
        },
    )
}

/// A figure card; `name` becomes its `data-figure` attribute (the tests read figures by it),
/// `bad` colours it as needing attention; `note` is a line under the label.
pub fn card(name: &str, label: &str, value: &str, bad: bool) -> String {
    format!(
        "<div class=\"card{}\" data-figure=\"{}\"><div class=\"v\">{}</div><div class=\"k\">{}</div></div>",
        if bad { " bad" } else { "" },
        esc(name),
        esc(value),
        esc(label)
    )
}

/// A table with `head` and rows of cells that are already HTML (escape what goes in them).
pub fn table(id: &str, head: &[&str], rows: &[Vec<String>]) -> String {
    table_with(id, head, rows.iter().map(|r| ("", r.as_slice())))
}

/// [`table`] with a class per row (`""` for none).
pub fn table_with<'a>(
    id: &str,
    head: &[&str],
    rows: impl Iterator<Item = (&'a str, &'a [String])>,
) -> String {
    let mut out = format!(
        "<div class=\"scroll\"><table id=\"{}\"><thead><tr>",
        esc(id)
    );
    for h in head {
        let _ = write!(out, "<th>{}</th>", esc(h));
    }
    out.push_str("</tr></thead><tbody>");
    let mut any = false;
    for (class, row) in rows {
        any = true;
        match class {
            "" => out.push_str("<tr>"),
            c => {
                let _ = write!(out, "<tr class=\"{}\">", esc(c));
            }
        }
        for (i, cell) in row.iter().enumerate() {
            // On a narrow screen a row becomes a card, each cell labelled by its column.
            let label = head.get(i).copied().unwrap_or("");
            let _ = write!(out, "<td data-label=\"{}\">{cell}</td>", esc(label));
        }
        out.push_str("</tr>");
    }
    if !any {
        let _ = write!(
            out,
            "<tr><td colspan=\"{}\" class=\"muted\">none</td></tr>",
            head.len()
        );
    }
    out.push_str("</tbody></table></div>");
    out
}

/// Seconds as people read them: `0.4 s`, `12 s`, `3 min 5 s`, `2 h 10 min`; `–` for none.
pub fn age(seconds: Option<f64>) -> String {
    seconds.map_or_else(|| "–".into(), human_age)
}

/// A past time as "12 s ago", the exact time on hover.
pub fn ago(t: DateTime<Utc>, now: DateTime<Utc>) -> String {
    let s = (now - t).num_milliseconds() as f64 / 1000.0;
    let when = if s >= 0.0 {
        format!("{} ago", human_age(s))
    } else {
        format!("in {}", human_age(-s))
    };
    format!(
        "<time datetime=\"{r}\" title=\"{r}\">{when}</time>",
        r = t.to_rfc3339()
    )
}

/// Bytes as people read them: `512 B`, `12.3 KiB`, `4.0 MiB`, `1.2 GiB`.
pub fn bytes(n: i64) -> String {
    let n = n.max(0) as f64;
    match n {
        n if n < 1024.0 => format!("{n:.0} B"),
        n if n < 1048576.0 => format!("{:.1} KiB", n / 1024.0),
        n if n < 1073741824.0 => format!("{:.1} MiB", n / 1048576.0),
        n => format!("{:.1} GiB", n / 1073741824.0),
    }
}

/// A line chart of `points` (seconds before now, value) over the last `span` seconds, as inline
/// SVG with its latest value, its maximum (on the y axis too) and time range written on it;
/// `unit` follows the values. It scales down to narrow screens.
pub fn chart(id: &str, title: &str, unit: &str, span: f64, points: &[(f64, f64)]) -> String {
    const W: f64 = 560.0;
    const H: f64 = 140.0;
    const PAD: f64 = 22.0;
    let max = points.iter().map(|p| p.1).fold(0.0_f64, f64::max);
    let top = if max > 0.0 { max * 1.1 } else { 1.0 };
    let x = |ago: f64| PAD + (W - 2.0 * PAD) * (1.0 - (ago / span).clamp(0.0, 1.0));
    let y = |v: f64| H - PAD - (H - 2.0 * PAD) * (v / top);
    let line: Vec<String> = points
        .iter()
        .map(|(ago, v)| format!("{:.1},{:.1}", x(*ago), y(*v)))
        .collect();
    let latest = points.last().map(|p| p.1);
    format!(
        "<figure data-chart=\"{id}\"><svg class=\"chart\" role=\"img\" aria-label=\"{t}\" \
         width=\"{W}\" height=\"{H}\" viewBox=\"0 0 {W} {H}\">\
         <text x=\"{PAD}\" y=\"14\" font-size=\"12\">{t}: now {now} {u}, max {mx:.1} {u}</text>\
         <line x1=\"{PAD}\" y1=\"{b}\" x2=\"{r}\" y2=\"{b}\" stroke=\"#b8c4d2\"/>\
         <line x1=\"{PAD}\" y1=\"{ymax:.1}\" x2=\"{r}\" y2=\"{ymax:.1}\" stroke=\"#eef1f4\"/>\
         <text x=\"{r}\" y=\"{ymaxl:.1}\" font-size=\"10\" fill=\"#5b6675\" text-anchor=\"end\">{mx:.1}</text>\
         <polyline fill=\"none\" stroke=\"#2b6cb0\" stroke-width=\"2\" points=\"{pts}\"/>\
         <text x=\"{PAD}\" y=\"{lb}\" font-size=\"11\" fill=\"#5b6675\">{ago} ago</text>\
         <text x=\"{r}\" y=\"{lb}\" font-size=\"11\" fill=\"#5b6675\" text-anchor=\"end\">now</text>\
         </svg><figcaption class=\"muted\">{n} sample(s), taken by this console since it \
         started</figcaption></figure>",
        id = esc(id),
        t = esc(title),
        u = esc(unit),
        now = latest.map_or("–".into(), |v| format!("{v:.1}")),
        mx = max,
        ymax = y(max),
        ymaxl = y(max) - 2.0,
        b = H - PAD,
        r = W - PAD,
        lb = H - 6.0,
        pts = line.join(" "),
        ago = age(Some(span)),
        n = points.len(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup_and_quotes() {
        assert_eq!(
            esc("<a href=\"x\">'&'</a>"),
            "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;"
        );
    }

    #[test]
    fn untrusted_text_is_isolated_with_its_controls_shown_by_name() {
        assert_eq!(
            text("user\u{202e}gnp.exe<b>"),
            "<bdi>user<span class=\"ctl\">⟨U+202E⟩</span>gnp.exe&lt;b&gt;</bdi>"
        );
        assert_eq!(
            text("\u{1b}[2J"),
            "<bdi><span class=\"ctl\">⟨ESC⟩</span>[2J</bdi>"
        );
    }

    #[test]
    fn long_values_are_cut_with_the_whole_a_click_away() {
        let key = format!("long-key-{}", "L".repeat(100_000));
        let cut = short(&key, CELL_CHARS);
        assert!(cut.len() < 400, "{}", cut.len());
        assert!(cut.contains("… (97.7 KiB)"), "{cut}");
        let whole = long(&key, CELL_CHARS);
        assert!(whole.contains("<details class=\"whole\">") && whole.contains(&key));
        assert_eq!(long("short", CELL_CHARS), text("short"));
    }

    #[test]
    fn a_block_keeps_its_own_line_breaks_and_shows_the_datas() {
        let json = serde_json::to_string_pretty(&serde_json::json!({"k": "a\u{1b}\nb"}))
            .unwrap_or_default();
        let html = block(&json, 1000);
        assert_eq!(html.matches('\n').count(), 2, "{html}");
        assert!(
            html.contains("a\\u001b\\nb"),
            "the string's own escapes: {html}"
        );
        assert!(!html.contains("⟨LF⟩"));
    }

    #[test]
    fn ages_read_as_people_say_them() {
        assert_eq!(age(None), "–");
        assert_eq!(age(Some(0.42)), "0.4 s");
        assert_eq!(age(Some(185.0)), "3 min 5 s");
        assert_eq!(age(Some(7800.0)), "2 h 10 min");
        assert_eq!(bytes(900), "900 B");
        assert_eq!(bytes(3 * 1048576), "3.0 MiB");
        let now = Utc::now();
        assert!(ago(now - chrono::Duration::seconds(12), now).contains(">12 s ago<"));
    }

    #[test]
    fn a_chart_states_its_latest_and_maximum() {
        let svg = chart(
            "rate",
            "published",
            "msg/s",
            3600.0,
            &[(60.0, 4.0), (0.0, 2.0)],
        );
        assert!(svg.contains("now 2.0 msg/s, max 4.0 msg/s"), "{svg}");
        assert!(svg.contains("<polyline"));
        assert!(!svg.contains("<script"));
    }

    #[test]
    fn the_frame_refreshes_without_script_only_when_asked() {
        let mut frame = Frame {
            place: "db".into(),
            here: Some("/failed?key=a".into()),
            ..Frame::default()
        };
        let off = page("Failed", "/failed", &frame, "");
        assert!(!off.contains("http-equiv=\"refresh\""));
        assert!(
            off.contains("href=\"/failed?key=a&amp;refresh=30\""),
            "{off}"
        );
        assert!(!off.contains("/inbox"), "no inbox: no inbox links");
        frame.refresh = Some(30);
        let on = page("Failed", "/failed", &frame, "");
        assert!(on.contains("<meta http-equiv=\"refresh\" content=\"30\">"));
        assert!(!on.contains("<script"));
    }
}
