//! The console's HTTP server (hyper, HTTP/1.1): the token check on every request, then one
//! handler per page; actions (redrive) only as POSTs that pass the origin and CSRF checks.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CACHE_CONTROL, CONTENT_TYPE, LOCATION, SET_COOKIE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use outbox_core::status::Report;
use outbox_core::{JourneyQuery, RedriveScope};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::auth::Access;
use crate::html::{esc, page};
use crate::pages::{self, Filter};
use crate::{Console, Side};

/// Failed messages a page lists at most (filters apply to these).
const LIST_LIMIT: usize = 1000;
/// Largest form body accepted.
const FORM_LIMIT: usize = 64 * 1024;

/// A bound, not yet serving, listener.
#[derive(Debug)]
pub struct Bound {
    listener: TcpListener,
}

impl Bound {
    /// The address it listens on.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }
}

/// Binds `addr` (port 0 picks a free one).
pub async fn bind(addr: SocketAddr) -> std::io::Result<Bound> {
    Ok(Bound {
        listener: TcpListener::bind(addr).await?,
    })
}

/// Serves `console` on `bound` until `stop`.
pub async fn serve(bound: Bound, console: Arc<Console>, stop: CancellationToken) {
    if let Ok(addr) = bound.local_addr() {
        info!(%addr, read_only = console.read_only, token = console.guard.requires_token(),
              "console: serving http://{addr}/");
    }
    loop {
        let accepted = tokio::select! {
            a = bound.listener.accept() => a,
            _ = stop.cancelled() => break,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(error) => {
                warn!(%error, "console: accepting a connection failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let console = console.clone();
        let service = hyper::service::service_fn(move |req| {
            let console = console.clone();
            async move { Ok::<_, Infallible>(answer(req, &console).await) }
        });
        let stop = stop.clone();
        tokio::spawn(async move {
            let conn = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service);
            tokio::pin!(conn);
            tokio::select! {
                r = conn.as_mut() => if let Err(error) = r {
                    debug!(%error, "console: connection ended with an error");
                },
                _ = stop.cancelled() => conn.as_mut().graceful_shutdown(),
            }
        });
    }
}

type Reply = Response<Full<Bytes>>;

fn reply(status: StatusCode, content_type: &'static str, body: String) -> Reply {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    // Pages carry no script and load nothing from elsewhere; say so to the browser too.
    h.insert(
        "content-security-policy",
        HeaderValue::from_static(
            "default-src 'none'; style-src 'unsafe-inline'; img-src 'self'; form-action 'self'; \
             frame-ancestors 'none'",
        ),
    );
    h.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    r
}

fn html(status: StatusCode, body: String) -> Reply {
    reply(status, "text/html; charset=utf-8", body)
}

/// A page that states a problem once, and what to do.
fn problem(console: &Console, status: StatusCode, title: &str, text: &str) -> Reply {
    let body = format!("<p class=\"err\">{}</p>", esc(text));
    html(status, page(title, "", &console.outbox.place, &body))
}

fn query(req: &Request<Incoming>) -> HashMap<String, String> {
    form_urlencoded::parse(req.uri().query().unwrap_or("").as_bytes())
        .into_owned()
        .collect()
}

async fn answer(req: Request<Incoming>, console: &Console) -> Reply {
    let q = query(&req);
    match console
        .guard
        .check(req.headers(), q.get("token").map(String::as_str))
    {
        Access::Granted => {}
        Access::Adopt => {
            // Keep the page, drop the token from the address.
            let rest: String = form_urlencoded::Serializer::new(String::new())
                .extend_pairs(q.iter().filter(|(k, _)| k.as_str() != "token"))
                .finish();
            let to = match rest.is_empty() {
                true => req.uri().path().to_string(),
                false => format!("{}?{rest}", req.uri().path()),
            };
            let mut r = reply(StatusCode::SEE_OTHER, "text/plain", String::new());
            if let (Ok(loc), Some(Ok(cookie))) = (
                HeaderValue::from_str(&to),
                console.guard.cookie().map(|c| HeaderValue::from_str(&c)),
            ) {
                r.headers_mut().insert(LOCATION, loc);
                r.headers_mut().insert(SET_COOKIE, cookie);
            }
            return r;
        }
        Access::Refused => {
            return reply(
                StatusCode::UNAUTHORIZED,
                "text/plain; charset=utf-8",
                "This console needs its token: open it once with ?token=<token> in the address, \
                 or send Authorization: Bearer <token>.\n"
                    .into(),
            );
        }
    }
    let path = req.uri().path().to_string();
    let (side, prefix, rest) = match path.strip_prefix("/inbox") {
        Some(rest) if rest.is_empty() || rest.starts_with('/') => match &console.inbox {
            Ok(side) => (side, "/inbox", rest.to_string()),
            Err(why) => {
                return problem(console, StatusCode::NOT_FOUND, "Inbox", why);
            }
        },
        _ => (&console.outbox, "", path.clone()),
    };
    let inbox = !prefix.is_empty();
    let rest = if rest.is_empty() { "/".into() } else { rest };
    match (req.method(), rest.as_str()) {
        (&Method::POST, "/redrive") => redrive(req, console, side, prefix).await,
        (&Method::GET | &Method::HEAD, _) => get(console, side, prefix, inbox, &rest, &q).await,
        _ => reply(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain; charset=utf-8",
            "Only GET, and POST for actions.\n".into(),
        ),
    }
}

async fn get(
    console: &Console,
    side: &Side,
    prefix: &str,
    inbox: bool,
    rest: &str,
    q: &HashMap<String, String>,
) -> Reply {
    let store = &*side.store;
    let shown = |title: &str, active: &str, body: String| {
        html(StatusCode::OK, page(title, active, &side.place, &body))
    };
    let failed_read = |what: &str, e: outbox_core::Error| {
        problem(
            console,
            StatusCode::SERVICE_UNAVAILABLE,
            what,
            &format!("Reading the store failed: {e}. The page shows again once it answers."),
        )
    };
    let title = |t: &str| {
        if inbox {
            format!("Inbox: {t}")
        } else {
            t.to_string()
        }
    };
    match rest {
        "/" | "/partitions" | "/retention" => {
            let report = match Report::collect(store, &console.routes).await {
                Ok(r) => r,
                Err(e) => return failed_read("Overview", e),
            };
            if q.get("format").map(String::as_str) == Some("json") {
                let json = serde_json::to_string(&report).unwrap_or_default();
                return reply(StatusCode::OK, "application/json", json);
            }
            match rest {
                "/" => {
                    let history = match inbox {
                        true => console.inbox_history.as_deref().unwrap_or(&console.history),
                        false => &console.history,
                    };
                    let active = if inbox { "/inbox" } else { "/" };
                    shown(
                        &title("Overview"),
                        active,
                        pages::overview(&report, history, inbox),
                    )
                }
                "/partitions" => shown(
                    &title("Partitions"),
                    "/partitions",
                    pages::partitions(&report),
                ),
                _ => shown(&title("Retention"), "/retention", pages::retention(&report)),
            }
        }
        "/failed" | "/redrive" => {
            let filter = Filter {
                key: q.get("key").cloned().unwrap_or_default(),
                kind: q.get("type").cloned().unwrap_or_default(),
                error: q.get("error").cloned().unwrap_or_default(),
            };
            let listed = match store.failed(LIST_LIMIT).await {
                Ok(l) => l,
                Err(e) => return failed_read("Failed messages", e),
            };
            let active = format!("{prefix}/failed");
            if rest == "/failed" {
                let blocked = match store.stats().await {
                    Ok(s) => s.blocked,
                    Err(e) => return failed_read("Failed messages", e),
                };
                let body = pages::failed(&listed, &filter, &blocked, prefix, console.read_only);
                return shown(&title("Failed and parked messages"), &active, body);
            }
            if console.read_only {
                return read_only(console);
            }
            let id = q.get("id").and_then(|s| s.parse::<uuid::Uuid>().ok());
            let matching: Vec<_> = listed
                .iter()
                .filter(|m| id.map_or(filter.matches(m), |id| m.id == id))
                .collect();
            let body = pages::redrive_preview(&matching, prefix, console.guard.csrf());
            shown(&title("Redrive"), &active, body)
        }
        "/messages" => {
            let active = format!("{prefix}/messages");
            let (asked, query) = match journey_query(q) {
                Ok(asked) => asked,
                Err(bad) => {
                    let body = pages::journey("", &[], prefix)
                        + &format!(
                            "<p class=\"err\">“{}” is not a message id (a UUID such as \
                             0190f1c2-7a1b-7c3d-8e4f-123456789abc).</p>",
                            esc(&bad)
                        );
                    return html(
                        StatusCode::BAD_REQUEST,
                        page("Message journey", &active, &side.place, &body),
                    );
                }
            };
            let mut body = String::new();
            let mut found = Vec::new();
            if let Some(query) = &query {
                found = match store.journey(query, 20).await {
                    Ok(found) => found,
                    Err(e) => return failed_read("Message journey", e),
                };
                if let Some(receipt) = receipt(console, inbox, query).await {
                    body = pages::receipt(&receipt);
                }
            }
            shown(
                "Message journey",
                &active,
                pages::journey(&asked, &found, prefix) + &body,
            )
        }
        _ => html(
            StatusCode::NOT_FOUND,
            page(
                "Not found",
                "",
                &side.place,
                "<p>No such page: use the links above.</p>",
            ),
        ),
    }
}

/// Where the inbox shares the database, what it did with the outbox message `query` names by
/// id (the inbox keeps the outbox's message id): `None` when there is no inbox or no id, else
/// its receipt and handling, or why they could not be read.
async fn receipt(
    console: &Console,
    inbox: bool,
    query: &JourneyQuery,
) -> Option<Result<Vec<outbox_core::Journey>, String>> {
    let (false, Ok(side), JourneyQuery::Id(_)) = (inbox, &console.inbox, query) else {
        return None;
    };
    Some(
        side.store
            .journey(query, 1)
            .await
            .map_err(|e| e.to_string()),
    )
}

/// What the journey page was asked for: the text to show in its form and the lookup (`None`
/// when neither an id nor a key was given), or the id that is not one.
fn journey_query(q: &HashMap<String, String>) -> Result<(String, Option<JourneyQuery>), String> {
    let id = q.get("id").map(|s| s.trim()).filter(|s| !s.is_empty());
    let key = q.get("key").filter(|s| !s.is_empty());
    match (id, key) {
        (Some(id), _) => match id.parse() {
            Ok(parsed) => Ok((id.to_string(), Some(JourneyQuery::Id(parsed)))),
            Err(_) => Err(id.to_string()),
        },
        (None, Some(key)) => Ok((key.clone(), Some(JourneyQuery::Key(key.clone())))),
        (None, None) => Ok((String::new(), None)),
    }
}

fn read_only(console: &Console) -> Reply {
    problem(
        console,
        StatusCode::FORBIDDEN,
        "Read-only",
        "This console is read-only (started with --read-only): redrive with `outbox redrive`, \
         or start a console without --read-only.",
    )
}

/// POST `/redrive`: the ids the preview listed, with a reason.
async fn redrive(req: Request<Incoming>, console: &Console, side: &Side, prefix: &str) -> Reply {
    if console.read_only {
        return read_only(console);
    }
    let headers = req.headers().clone();
    let body = match Limited::new(req.into_body(), FORM_LIMIT).collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => {
            return problem(
                console,
                StatusCode::PAYLOAD_TOO_LARGE,
                "Redrive",
                "The form was too large or cut off; go back and submit it again.",
            )
        }
    };
    let form: HashMap<String, String> = form_urlencoded::parse(&body).into_owned().collect();
    if let Some(why) = console
        .guard
        .refuse_action(&headers, form.get("csrf").map(String::as_str))
    {
        return problem(console, StatusCode::FORBIDDEN, "Redrive refused", why);
    }
    let reason = form.get("reason").map(|r| r.trim()).unwrap_or("");
    if reason.is_empty() {
        return problem(
            console,
            StatusCode::BAD_REQUEST,
            "Redrive",
            "A redrive needs a reason (it is kept in the audit trail): go back and give one.",
        );
    }
    let ids: Result<Vec<uuid::Uuid>, _> = form
        .get("ids")
        .map(String::as_str)
        .unwrap_or("")
        .split(',')
        .filter(|s| !s.is_empty())
        .map(str::parse)
        .collect();
    let Ok(ids) = ids
        .map_err(drop)
        .and_then(|v| if v.is_empty() { Err(()) } else { Ok(v) })
    else {
        return problem(
            console,
            StatusCode::BAD_REQUEST,
            "Redrive",
            "The form names no message to redrive: start again from the failed messages.",
        );
    };
    let reason = format!("{reason} (console)");
    match side
        .store
        .redrive(&RedriveScope::Ids(ids.clone()), &reason)
        .await
    {
        Ok(n) => {
            info!(redriven = n, asked = ids.len(), "console: redrive");
            let body = pages::redrive_done(n, &ids, &reason, prefix);
            html(
                StatusCode::OK,
                page("Redriven", &format!("{prefix}/failed"), &side.place, &body),
            )
        }
        Err(e) => problem(
            console,
            StatusCode::SERVICE_UNAVAILABLE,
            "Redrive failed",
            &format!("Nothing was redriven: {e}. Try again once the database answers."),
        ),
    }
}
