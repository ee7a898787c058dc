//! The console's actions, each a POST from its own pages: a redrive (checked for origin and
//! CSRF, with a reason, audited with who asked and from where, answered by a redirect to its
//! result so a reload redrives nothing) and signing out.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::Mutex;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Limited};
use hyper::body::Incoming;
use hyper::header::{LOCATION, SET_COOKIE};
use hyper::{Request, StatusCode};
use outbox_core::text::{cut, Terminal};
use outbox_core::RedriveScope;
use tracing::info;

use crate::pages::failed::Done;
use crate::server::{html_page, plain, problem, read_only, redirect, Ctx, Reply};
use crate::Console;

/// Largest form body accepted.
const FORM_LIMIT: usize = 64 * 1024;
/// Redrive results kept for their result pages.
const RESULTS_KEPT: usize = 50;
/// Ids named in the redrive's log line at most.
const IDS_LOGGED: usize = 10;

/// The latest redrives' results, by the id their result page is reached with.
#[derive(Default)]
pub struct Results(Mutex<VecDeque<(uuid::Uuid, Done)>>);

impl Results {
    fn keep(&self, done: Done) -> uuid::Uuid {
        let id = uuid::Uuid::new_v4();
        let mut kept = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if kept.len() >= RESULTS_KEPT {
            kept.pop_front();
        }
        kept.push_back((id, done));
        id
    }

    /// The result kept as `id`.
    pub fn get(&self, id: uuid::Uuid) -> Option<Done> {
        let kept = self.0.lock().unwrap_or_else(|p| p.into_inner());
        kept.iter().find(|(k, _)| *k == id).map(|(_, d)| d.clone())
    }
}

/// The form of a POST, or the page that says why it could not be read.
async fn form(req: Request<Incoming>, cx: &Ctx<'_>) -> Result<HashMap<String, String>, Reply> {
    let body: Bytes = match Limited::new(req.into_body(), FORM_LIMIT).collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => {
            return Err(problem(
                cx,
                StatusCode::PAYLOAD_TOO_LARGE,
                "Form refused",
                "The form was too large or cut off; go back and submit it again.",
            ))
        }
    };
    Ok(form_urlencoded::parse(&body).into_owned().collect())
}

/// POST `/redrive`: the ids the preview listed, with a reason; answered by a redirect to the
/// result page.
pub async fn redrive(req: Request<Incoming>, cx: &Ctx<'_>, peer: SocketAddr) -> Reply {
    let console = cx.console;
    if console.read_only {
        return read_only(cx);
    }
    let headers = req.headers().clone();
    let form = match form(req, cx).await {
        Ok(f) => f,
        Err(reply) => return reply,
    };
    if let Some(why) = console
        .guard
        .refuse_action(&headers, form.get("csrf").map(String::as_str))
    {
        return problem(cx, StatusCode::FORBIDDEN, "Redrive refused", why);
    }
    let reason = form.get("reason").map(|r| r.trim()).unwrap_or("");
    if reason.is_empty() {
        return problem(
            cx,
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
            cx,
            StatusCode::BAD_REQUEST,
            "Redrive",
            "The form names no message to redrive: start again from the failed messages.",
        );
    };
    // Who asked: the token is shared, so the audit row keeps the name given (if any) and the
    // address the request came from.
    let who = form
        .get("who")
        .map(|w| w.trim())
        .filter(|w| !w.is_empty())
        .map(|w| format!(" by {}", cut(w, 80)))
        .unwrap_or_default();
    let reason = format!("{reason} (console{who}, from {})", peer.ip());
    match cx
        .side
        .store
        .redrive(&RedriveScope::Ids(ids.clone()), &reason)
        .await
    {
        Ok(n) => {
            let logged: Vec<String> = ids.iter().take(IDS_LOGGED).map(|i| i.to_string()).collect();
            info!(redriven = n, asked = ids.len(), ids = %logged.join(","),
                  reason = %Terminal(cut(&reason, 300)), client = %peer,
                  "console: redrive");
            let done = Done {
                redriven: n,
                asked: ids,
                reason,
                at: chrono::Utc::now(),
            };
            let id = console.results.keep(done);
            redirect(&format!("{}/redrive/done?r={id}", cx.prefix), Vec::new())
        }
        Err(e) => problem(
            cx,
            StatusCode::SERVICE_UNAVAILABLE,
            "Redrive failed",
            &format!("Nothing was redriven: {e}. Try again once the database answers."),
        ),
    }
}

/// GET `/redrive/done?r=…`: a redrive's result, as often as it is reloaded.
pub fn done(cx: &Ctx<'_>, q: &HashMap<String, String>) -> Reply {
    let found = q
        .get("r")
        .and_then(|r| r.parse::<uuid::Uuid>().ok())
        .and_then(|id| cx.console.results.get(id));
    match found {
        Some(d) => html_page(
            cx,
            StatusCode::OK,
            "Redriven",
            &format!("{}/failed", cx.prefix),
            &crate::pages::failed::redrive_done(&d, cx.prefix),
        ),
        None => problem(
            cx,
            StatusCode::NOT_FOUND,
            "Redrive result",
            "This console no longer keeps that result (it keeps the last 50, until it \
             restarts). Each redriven message's journey shows its redrive, with the reason.",
        ),
    }
}

/// POST `/signout`: ends the session (every browser holding it is refused from now on) and
/// removes its cookies.
pub async fn sign_out(req: Request<Incoming>, console: &Console) -> Reply {
    let headers = req.headers().clone();
    let body: Bytes = match Limited::new(req.into_body(), FORM_LIMIT).collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => Bytes::new(),
    };
    let form: HashMap<String, String> = form_urlencoded::parse(&body).into_owned().collect();
    if let Some(why) = console
        .guard
        .refuse_action(&headers, form.get("csrf").map(String::as_str))
    {
        return plain(StatusCode::FORBIDDEN, format!("Sign-out refused: {why}.\n"));
    }
    let cleared = console.guard.end_session(&headers);
    let mut r = plain(
        StatusCode::OK,
        "Signed out: this session is refused from now on, in every browser that holds it. \
         Open the console's link with ?token= to sign in again.\n"
            .into(),
    );
    for c in cleared {
        if let Ok(v) = hyper::header::HeaderValue::from_str(&c) {
            r.headers_mut().append(SET_COOKIE, v);
        }
    }
    r.headers_mut().remove(LOCATION);
    r
}
