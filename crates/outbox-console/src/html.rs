//! HTML building blocks: escaping, the page frame (navigation, inline style, no script), tables,
//! figures tagged for tests (`data-figure`), and charts drawn as inline SVG on the server.
//!
//! Everything a store or a user supplied goes through [`esc`]; nothing is fetched from the
//! network (no script, font or stylesheet link), so a page renders the same offline.

use std::fmt::Write as _;

/// `s` with `& < > " '` escaped, safe in element content and in quoted attributes.
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

/// `s` percent-encoded for a query string value.
pub fn url_value(s: &str) -> String {
    form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

const STYLE: &str = "body{font:14px/1.45 system-ui,sans-serif;margin:0;color:#1d232b;background:#f6f7f9}\
header{background:#1d232b;color:#fff;padding:.6em 1.2em;display:flex;gap:1.2em;align-items:center;flex-wrap:wrap}\
header a{color:#cfe3ff;text-decoration:none}header a.on{color:#fff;font-weight:600;border-bottom:2px solid #fff}\
header .place{margin-left:auto;color:#9aa7b4;font-size:12px}\
main{padding:1em 1.2em;max-width:1200px}h1{font-size:20px;margin:.2em 0 .6em}h2{font-size:16px;margin:1.2em 0 .4em}\
.cards{display:flex;flex-wrap:wrap;gap:.6em}.card{background:#fff;border:1px solid #dde2e8;border-radius:6px;padding:.5em .9em;min-width:8em}\
.card .v{font-size:22px;font-weight:600}.card .k{color:#5b6675;font-size:12px}.bad .v{color:#b3261e}\
table{border-collapse:collapse;background:#fff;width:100%;margin:.3em 0}th,td{border:1px solid #dde2e8;padding:.3em .5em;text-align:left;vertical-align:top}\
th{background:#eef1f4;font-weight:600}td.n{text-align:right;font-variant-numeric:tabular-nums}\
.muted{color:#5b6675}.err{color:#b3261e}.ok{color:#1b7f3b}pre{background:#fff;border:1px solid #dde2e8;padding:.6em;overflow:auto;white-space:pre-wrap}\
form.inline{display:inline}input,button,textarea{font:inherit}button{cursor:pointer}\
.notice{background:#fff8e1;border:1px solid #f0d58c;padding:.5em .8em;border-radius:6px}\
ol.timeline{list-style:none;padding:0;border-left:3px solid #b8c4d2;margin-left:.5em}\
ol.timeline li{padding:.2em 0 .6em 1em;position:relative}ol.timeline li:before{content:'';position:absolute;left:-8px;top:.55em;width:11px;height:11px;border-radius:50%;background:#5b6675}\
ol.timeline li.failed:before{background:#b3261e}ol.timeline li.published:before{background:#1b7f3b}ol.timeline li.redriven:before{background:#d98a00}\
svg.chart{background:#fff;border:1px solid #dde2e8}";

/// The navigation: path and label of each page.
const NAV: [(&str, &str); 7] = [
    ("/", "Overview"),
    ("/partitions", "Partitions"),
    ("/failed", "Failed & parked"),
    ("/messages", "Message journey"),
    ("/retention", "Retention"),
    ("/inbox", "Inbox"),
    ("/inbox/failed", "Inbox failed"),
];

/// A whole page: `title`, the navigation with `active` marked, `place` (which database, its
/// password already redacted) and `body`.
pub fn page(title: &str, active: &str, place: &str, body: &str) -> String {
    let mut nav = String::new();
    for (path, label) in NAV {
        let class = if path == active { " class=\"on\"" } else { "" };
        let _ = write!(nav, "<a href=\"{path}\"{class}>{label}</a>");
    }
    format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">\
         <title>{t} · outbox console</title><style>{STYLE}</style></head><body>\
         <header><strong>outbox</strong>{nav}<span class=\"place\">{p}</span></header>\
         <main><h1>{t}</h1>{body}</main></body></html>",
        t = esc(title),
        p = esc(place),
    )
}

/// A figure card; `name` becomes its `data-figure` attribute (the tests read figures by it),
/// `bad` colours it as needing attention.
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
    let mut out = format!("<table id=\"{}\"><thead><tr>", esc(id));
    for h in head {
        let _ = write!(out, "<th>{}</th>", esc(h));
    }
    out.push_str("</tr></thead><tbody>");
    for row in rows {
        out.push_str("<tr>");
        for cell in row {
            let _ = write!(out, "<td>{cell}</td>");
        }
        out.push_str("</tr>");
    }
    if rows.is_empty() {
        let _ = write!(
            out,
            "<tr><td colspan=\"{}\" class=\"muted\">none</td></tr>",
            head.len()
        );
    }
    out.push_str("</tbody></table>");
    out
}

/// Seconds as people read them: `0.4 s`, `12 s`, `3 min 5 s`, `2 h 10 min`.
pub fn age(seconds: Option<f64>) -> String {
    let Some(s) = seconds else {
        return "–".into();
    };
    if s < 10.0 {
        format!("{s:.1} s")
    } else if s < 120.0 {
        format!("{s:.0} s")
    } else if s < 7200.0 {
        format!("{} min {} s", (s / 60.0) as u64, (s % 60.0) as u64)
    } else {
        format!(
            "{} h {} min",
            (s / 3600.0) as u64,
            ((s % 3600.0) / 60.0) as u64
        )
    }
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
/// SVG with its maximum and time range written on it; `unit` follows the values.
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
         <polyline fill=\"none\" stroke=\"#2b6cb0\" stroke-width=\"2\" points=\"{pts}\"/>\
         <text x=\"{PAD}\" y=\"{lb}\" font-size=\"11\" fill=\"#5b6675\">{ago} ago</text>\
         <text x=\"{r}\" y=\"{lb}\" font-size=\"11\" fill=\"#5b6675\" text-anchor=\"end\">now</text>\
         </svg><figcaption class=\"muted\">{n} sample(s)</figcaption></figure>",
        id = esc(id),
        t = esc(title),
        u = esc(unit),
        now = latest.map_or("–".into(), |v| format!("{v:.1}")),
        mx = max,
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
    fn ages_read_as_people_say_them() {
        assert_eq!(age(None), "–");
        assert_eq!(age(Some(0.42)), "0.4 s");
        assert_eq!(age(Some(185.0)), "3 min 5 s");
        assert_eq!(age(Some(7800.0)), "2 h 10 min");
        assert_eq!(bytes(900), "900 B");
        assert_eq!(bytes(3 * 1048576), "3.0 MiB");
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
}
