//! The console's HTTP server (hyper, HTTP/1.1): on every request the Host check, then the token
//! (or session) check, then one handler per page; actions only as POSTs (see [`crate::actions`]).
//! Every response carries a Content-Security-Policy that allows no script, `X-Frame-Options`,
//! `Referrer-Policy: same-origin`, `nosniff` and `no-store`.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::HeaderValue;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::auth::{Access, Purpose};
use crate::html::{page, text, Frame};
use crate::{actions, views, Console, Side};

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

/// Binds `addr` (port 0 picks a free one); the error names the address.
pub async fn bind(addr: SocketAddr) -> std::io::Result<Bound> {
    match TcpListener::bind(addr).await {
        Ok(listener) => Ok(Bound { listener }),
        Err(e) => Err(std::io::Error::new(
            e.kind(),
            format!("the console cannot listen on {addr}: {e}"),
        )),
    }
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
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(error) => {
                warn!(%error, "console: accepting a connection failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let console = console.clone();
        let service = hyper::service::service_fn(move |req| {
            let console = console.clone();
            async move { Ok::<_, Infallible>(answer(req, &console, peer).await) }
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
    info!("console: stopped serving");
}

/// A response.
pub type Reply = Response<Full<Bytes>>;

fn reply(status: StatusCode, content_type: &'static str, body: String) -> Reply {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(
        hyper::header::CONTENT_TYPE,
        HeaderValue::from_static(content_type),
    );
    h.insert(
        hyper::header::CACHE_CONTROL,
        HeaderValue::from_static("no-store"),
    );
    // Pages carry no script and load nothing from elsewhere; say so to the browser too. Older
    // browsers read X-Frame-Options where frame-ancestors is unknown. No page address (which
    // may name a key) is sent to another site: `same-origin`, not `no-referrer`, which would
    // also make the browser send `Origin: null` on the console's own form posts.
    h.insert(
        "content-security-policy",
        HeaderValue::from_static(
            "default-src 'none'; style-src 'unsafe-inline'; img-src 'self'; form-action 'self'; \
             frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    h.insert("x-frame-options", HeaderValue::from_static("DENY"));
    h.insert("referrer-policy", HeaderValue::from_static("same-origin"));
    h.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    r
}

/// A JSON answer.
pub fn json(body: String) -> Reply {
    reply(StatusCode::OK, "application/json", body)
}

/// A plain-text answer.
pub fn plain(status: StatusCode, body: String) -> Reply {
    reply(status, "text/plain; charset=utf-8", body)
}

/// A 303 to `to` (a path on this console) that sets `cookies`.
pub fn redirect(to: &str, cookies: Vec<String>) -> Reply {
    let mut r = reply(StatusCode::SEE_OTHER, "text/plain", String::new());
    if let Ok(loc) = HeaderValue::from_str(to) {
        r.headers_mut().insert(hyper::header::LOCATION, loc);
    }
    for c in cookies {
        if let Ok(v) = HeaderValue::from_str(&c) {
            r.headers_mut().append(hyper::header::SET_COOKIE, v);
        }
    }
    r
}

/// One request's view of the console: the side it concerns and the page frame.
pub struct Ctx<'a> {
    /// The console.
    pub console: &'a Console,
    /// The outbox, or the inbox's queue.
    pub side: Side,
    /// `""` or `"/inbox"`.
    pub prefix: &'static str,
    /// Whether `side` is the inbox's queue.
    pub inbox: bool,
    /// The page frame.
    pub frame: Frame,
}

/// A whole HTML page.
pub fn html_page(cx: &Ctx<'_>, status: StatusCode, title: &str, active: &str, body: &str) -> Reply {
    let title = if cx.inbox {
        format!("Inbox: {title}")
    } else {
        title.to_string()
    };
    reply(
        status,
        "text/html; charset=utf-8",
        page(&title, active, &cx.frame, body),
    )
}

/// A page that states a problem once, and what to do.
pub fn problem(cx: &Ctx<'_>, status: StatusCode, title: &str, why: &str) -> Reply {
    let body = format!("<p class=\"err\">{}</p>", text(why));
    let mut frame = cx.frame.clone();
    frame.here = None;
    frame.refresh = None;
    let cx = Ctx {
        frame,
        side: cx.side.clone(),
        ..*cx
    };
    html_page(&cx, status, title, "", &body)
}

/// The refusal of a read-only console, with the command to run instead.
pub fn read_only(cx: &Ctx<'_>) -> Reply {
    problem(
        cx,
        StatusCode::FORBIDDEN,
        "Read-only",
        "This console is read-only (started with --read-only): redrive with `outbox redrive \
         --id <id> --reason \"…\"`, or start a console without --read-only.",
    )
}

fn query(req: &Request<Incoming>) -> HashMap<String, String> {
    form_urlencoded::parse(req.uri().query().unwrap_or("").as_bytes())
        .into_owned()
        .collect()
}

/// Where a link with `?token=` lands once the session is set: the same path (never another
/// host: `//host/…` and `/\host/…` are made a path of this console) and query, without the token.
fn landing(path: &str, q: &HashMap<String, String>) -> String {
    let path = format!("/{}", path.trim_start_matches(['/', '\\']));
    let rest: String = form_urlencoded::Serializer::new(String::new())
        .extend_pairs(q.iter().filter(|(k, _)| k.as_str() != "token"))
        .finish();
    if rest.is_empty() {
        path
    } else {
        format!("{path}?{rest}")
    }
}

const NEEDS_TOKEN: &str = "This console needs its token: open it once with ?token=<token> in \
    the address (a 12-hour session starts), or send Authorization: Bearer <token>. If you had \
    signed in, the session ended (after 12 hours, at sign-out, or because the console's token \
    changed): open the ?token= link again.\n";

const ACT_NEEDS_SESSION: &str = "This action needs a session started on this console (its \
    ?token= link) and must be sent from the console's own pages; a request started on another \
    site cannot act.\n";

async fn answer(req: Request<Incoming>, console: &Console, peer: SocketAddr) -> Reply {
    if let Some(why) = console.guard.refuse_host(req.headers()) {
        return plain(StatusCode::FORBIDDEN, format!("Refused: {why}.\n"));
    }
    if req.uri().path() == "/favicon.ico" {
        return reply(StatusCode::NO_CONTENT, "text/plain", String::new());
    }
    let q = query(&req);
    let acting = req.method() == Method::POST;
    let purpose = if acting { Purpose::Act } else { Purpose::Read };
    match console
        .guard
        .check(req.headers(), q.get("token").map(String::as_str), purpose)
    {
        Access::Granted => {}
        Access::Adopt => {
            let secure = req
                .headers()
                .get("x-forwarded-proto")
                .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"https"));
            return redirect(
                &landing(req.uri().path(), &q),
                console.guard.start_session(secure),
            );
        }
        Access::Refused if acting => {
            return plain(StatusCode::UNAUTHORIZED, ACT_NEEDS_SESSION.into());
        }
        Access::Refused => return plain(StatusCode::UNAUTHORIZED, NEEDS_TOKEN.into()),
    }
    let path = req.uri().path().to_string();
    if (req.method(), path.as_str()) == (&Method::POST, "/signout") {
        return actions::sign_out(req, console).await;
    }
    let wants_inbox = path == "/inbox" || path.starts_with("/inbox/");
    let inbox = console.inbox(wants_inbox).await;
    let mut frame = Frame {
        place: console.outbox.place.clone(),
        sign_out: console
            .guard
            .requires_token()
            .then(|| console.guard.csrf().to_string()),
        inbox: inbox.is_ok(),
        ..Frame::default()
    };
    let (side, prefix, rest, history) = if wants_inbox {
        match inbox {
            Ok((side, history)) => {
                frame.place = side.place.clone();
                let rest = path["/inbox".len()..].to_string();
                (side, "/inbox", rest, history)
            }
            Err(why) => {
                let cx = Ctx {
                    console,
                    side: console.outbox.clone(),
                    prefix: "",
                    inbox: false,
                    frame,
                };
                return problem(&cx, StatusCode::NOT_FOUND, "Inbox", &why);
            }
        }
    } else {
        (
            console.outbox.clone(),
            "",
            path.clone(),
            console.history.clone(),
        )
    };
    let rest = if rest.is_empty() { "/".into() } else { rest };
    let cx = Ctx {
        console,
        side,
        prefix,
        inbox: !prefix.is_empty(),
        frame,
    };
    match (req.method(), rest.as_str()) {
        (&Method::POST, "/redrive") => actions::redrive(req, &cx, peer).await,
        (&Method::GET | &Method::HEAD, "/redrive/done") => actions::done(&cx, &q),
        (&Method::GET | &Method::HEAD, _) => {
            let here = {
                let kept: String = form_urlencoded::Serializer::new(String::new())
                    .extend_pairs(q.iter().filter(|(k, _)| k.as_str() != "refresh"))
                    .finish();
                match kept.is_empty() {
                    true => path.clone(),
                    false => format!("{path}?{kept}"),
                }
            };
            views::get(cx, &rest, &q, here, &history).await
        }
        _ => plain(
            StatusCode::METHOD_NOT_ALLOWED,
            "Only GET, and POST for actions.\n".into(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_link_lands_on_this_console_only() {
        let q: HashMap<String, String> = [("token".into(), "t".into()), ("key".into(), "a".into())]
            .into_iter()
            .collect();
        assert_eq!(landing("/failed", &q), "/failed?key=a");
        assert_eq!(landing("//evil.example/x", &q), "/evil.example/x?key=a");
        assert_eq!(landing("/\\evil.example", &HashMap::new()), "/evil.example");
    }
}
