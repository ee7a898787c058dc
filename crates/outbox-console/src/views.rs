//! The console's pages (GETs): the overview, partitions and retention from one status report,
//! the failed list (filtered, counted and paged by the store), the redrive preview, and a
//! message's journey. A malformed id or position is a 400 that says so, never a wider answer.

use std::collections::HashMap;

use chrono::Utc;
use hyper::StatusCode;
use outbox_core::status::Report;
use outbox_core::{FailedFilter, JourneyQuery, JourneyState};

use crate::history::History;
use crate::html::text;
use crate::pages::failed::{FailedView, Scope, PAGE, REDRIVE_AT_MOST};
use crate::pages::journey::{Asked, JourneyView, KEY_MESSAGES};
use crate::pages::overview::OverviewContext;
use crate::pages::{failed, journey, overview, retention};
use crate::server::{html_page, json, problem, read_only, Ctx, Reply};

/// The fastest refresh `?refresh=` may ask for, seconds.
const FASTEST_REFRESH: u32 = 5;

/// The parameters the redrive preview reads; any other is refused, so a misspelt one cannot
/// widen a redrive to every failed message.
const REDRIVE_PARAMS: [&str; 4] = ["id", "key", "type", "error"];

/// Answers a GET of `rest` (the path within `cx.prefix`).
pub async fn get(
    mut cx: Ctx<'_>,
    rest: &str,
    q: &HashMap<String, String>,
    here: String,
    history: &History,
) -> Reply {
    cx.frame.at = Some(Utc::now());
    cx.frame.refresh = q
        .get("refresh")
        .and_then(|r| r.parse::<u32>().ok())
        .map(|r| r.clamp(FASTEST_REFRESH, 3600));
    match rest {
        "/" | "/partitions" | "/retention" => {
            cx.frame.here = Some(here);
            report(&cx, rest, q, history).await
        }
        "/failed" => {
            cx.frame.here = Some(here);
            failed_list(&cx, q).await
        }
        "/redrive" => preview(&cx, q).await,
        "/messages" => {
            cx.frame.here = Some(here);
            journey_page(&cx, q).await
        }
        _ => html_page(
            &cx,
            StatusCode::NOT_FOUND,
            "Not found",
            "",
            "<p>No such page: use the links above.</p>",
        ),
    }
}

fn unavailable(cx: &Ctx<'_>, what: &str, e: &outbox_core::Error) -> Reply {
    problem(
        cx,
        StatusCode::SERVICE_UNAVAILABLE,
        what,
        &format!("Reading the store failed: {e}. The page shows again once it answers."),
    )
}

/// The overview, partitions and retention pages, and `?format=json`.
async fn report(cx: &Ctx<'_>, rest: &str, q: &HashMap<String, String>, history: &History) -> Reply {
    let r = match Report::collect(&*cx.side.store, &cx.console.routes).await {
        Ok(r) => r,
        Err(e) => return unavailable(cx, "Overview", &e),
    };
    if q.get("format").map(String::as_str) == Some("json") {
        return json(serde_json::to_string(&r).unwrap_or_default());
    }
    let prefix = cx.prefix;
    match rest {
        "/" => {
            let active = if cx.inbox { "/inbox" } else { "/" };
            let body = overview::overview(
                &r,
                &OverviewContext {
                    history,
                    inbox: cx.inbox,
                    prefix,
                    routes_known: !cx.console.routes.is_empty(),
                },
            );
            html_page(cx, StatusCode::OK, "Overview", active, &body)
        }
        "/partitions" => {
            let problems = q.get("problems").is_some_and(|p| p == "1");
            let body = overview::partitions(&r, prefix, problems);
            html_page(cx, StatusCode::OK, "Partitions", "/partitions", &body)
        }
        _ => html_page(
            cx,
            StatusCode::OK,
            "Retention",
            "/retention",
            &retention::retention(&r),
        ),
    }
}

/// The filter of a failed list or a redrive: each field given and not blank.
fn filter_of(q: &HashMap<String, String>) -> FailedFilter {
    let get = |name: &str| q.get(name).filter(|v| !v.trim().is_empty()).cloned();
    FailedFilter {
        key: get("key"),
        kind: get("type"),
        error: get("error"),
    }
}

/// `/failed`: one page of what matches, the count of all that match, the blocked keys.
async fn failed_list(cx: &Ctx<'_>, q: &HashMap<String, String>) -> Reply {
    let title = "Failed and parked messages";
    let active = format!("{}/failed", cx.prefix);
    let filter = filter_of(q);
    let after = match q.get("after").map(|a| a.parse::<i64>()) {
        None => None,
        Some(Ok(a)) => Some(a),
        Some(Err(_)) => {
            return problem(
                cx,
                StatusCode::BAD_REQUEST,
                title,
                "`after` is not a position in the list: follow the page's own links.",
            )
        }
    };
    let store = &*cx.side.store;
    let page = match store.failed_matching(&filter, after, PAGE).await {
        Ok(p) => p,
        Err(e) => return unavailable(cx, title, &e),
    };
    let stats = match store.stats().await {
        Ok(s) => s,
        Err(e) => return unavailable(cx, title, &e),
    };
    let body = failed::failed(&FailedView {
        page: &page,
        filter: &filter,
        after,
        failed_total: stats.failed,
        blocked: &stats.blocked,
        prefix: cx.prefix,
        read_only: cx.console.read_only,
        now: Utc::now(),
    });
    html_page(cx, StatusCode::OK, title, &active, &body)
}

/// `/redrive`: what a redrive of one message (`id`) or of a filter's matches will do.
async fn preview(cx: &Ctx<'_>, q: &HashMap<String, String>) -> Reply {
    if cx.console.read_only {
        return read_only(cx);
    }
    let title = "Redrive";
    let active = format!("{}/failed", cx.prefix);
    if let Some(bad) = q.keys().find(|k| !REDRIVE_PARAMS.contains(&k.as_str())) {
        return problem(
            cx,
            StatusCode::BAD_REQUEST,
            title,
            &format!(
                "The redrive page takes `id`, or `key`, `type` and `error`; `{}` is none of \
                 them, so nothing is previewed (a misspelt filter must not widen a redrive to \
                 every failed message). Start again from the failed messages.",
                outbox_core::text::cut(bad, 100)
            ),
        );
    }
    let store = &*cx.side.store;
    let csrf = cx.console.guard.csrf();
    let body = if let Some(raw) = q.get("id") {
        let Ok(id) = raw.trim().parse::<uuid::Uuid>() else {
            return problem(
                cx,
                StatusCode::BAD_REQUEST,
                title,
                &format!(
                    "“{}” is not a message id (a UUID such as \
                     0190f1c2-7a1b-7c3d-8e4f-123456789abc): nothing to redrive. Copy the id \
                     from the failed messages.",
                    outbox_core::text::cut(raw, 100)
                ),
            );
        };
        // Failed messages are few (parking is capped): the one asked for is found among them.
        let all = match store.failed(usize::MAX).await {
            Ok(a) => a,
            Err(e) => return unavailable(cx, title, &e),
        };
        let one: Vec<_> = all.into_iter().filter(|m| m.id == id).collect();
        failed::redrive_preview(&one, one.len() as i64, &Scope::Id(id), cx.prefix, csrf)
    } else {
        let filter = filter_of(q);
        let page = match store.failed_matching(&filter, None, REDRIVE_AT_MOST).await {
            Ok(p) => p,
            Err(e) => return unavailable(cx, title, &e),
        };
        failed::redrive_preview(
            &page.messages,
            page.total,
            &Scope::Filter(&filter),
            cx.prefix,
            csrf,
        )
    };
    html_page(cx, StatusCode::OK, title, &active, &body)
}

/// `/messages`: a message by id, or a key's latest messages and the head that holds them.
async fn journey_page(cx: &Ctx<'_>, q: &HashMap<String, String>) -> Reply {
    let title = "Message journey";
    let active = format!("{}/messages", cx.prefix);
    let id = q.get("id").map(|s| s.trim()).filter(|s| !s.is_empty());
    let key = q.get("key").filter(|s| !s.is_empty());
    let view = |more| JourneyView {
        prefix: cx.prefix,
        read_only: cx.console.read_only,
        inbox: cx.inbox,
        more,
        now: Utc::now(),
    };
    let (asked, query, limit) = match (id, key) {
        (Some(id), _) => {
            let asked = Asked {
                id: id.to_string(),
                key: String::new(),
            };
            match id.parse() {
                Ok(parsed) => (asked, JourneyQuery::Id(parsed), 1),
                Err(_) => {
                    let body = journey::forms(&asked, cx.prefix)
                        + &format!(
                            "<p class=\"err\">{} is not a message id (a UUID such as \
                             0190f1c2-7a1b-7c3d-8e4f-123456789abc).</p>",
                            text(&outbox_core::text::cut(id, 100))
                        );
                    return html_page(cx, StatusCode::BAD_REQUEST, title, &active, &body);
                }
            }
        }
        (None, Some(key)) => (
            Asked {
                id: String::new(),
                key: key.clone(),
            },
            JourneyQuery::Key(key.clone()),
            // Two more than shown: whether the key has more is known even when its head is
            // among the latest.
            KEY_MESSAGES + 2,
        ),
        (None, None) => {
            let body = journey::journey(&Asked::default(), &[], &view(false));
            return html_page(cx, StatusCode::OK, title, &active, &body);
        }
    };
    let found = match cx.side.store.journey(&query, limit).await {
        Ok(found) => found,
        Err(e) => return unavailable(cx, title, &e),
    };
    let is_head = |s: JourneyState| matches!(s, JourneyState::Failed | JourneyState::Retrying);
    let (mut shown, mut rest): (Vec<_>, Vec<_>) = found.into_iter().partition(|j| is_head(j.state));
    let more = rest.len() > KEY_MESSAGES;
    rest.truncate(KEY_MESSAGES);
    shown.extend(rest);
    let mut body = journey::journey(&asked, &shown, &view(more));
    if let (false, JourneyQuery::Id(_)) = (cx.inbox, &query) {
        if let Ok((inbox, _)) = cx.console.inbox(false).await {
            let r = inbox
                .store
                .journey(&query, 1)
                .await
                .map_err(|e| e.to_string());
            body += &journey::receipt(&r, Utc::now());
        }
    }
    html_page(cx, StatusCode::OK, title, &active, &body)
}
