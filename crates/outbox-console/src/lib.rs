//! The web console, `outbox console`: server-rendered pages over the outbox (and the inbox when
//! it shares the database) for the on-call engineer.
//!
//! - **Pages**: overview (counts, the last hour as charts, each member's circuit, the backlog by
//!   route), partitions (owner, epoch, lag, position), failed and parked messages (filter by
//!   key, type, error), redrive (one message, a key, or every failed message matching a filter:
//!   it shows what it will do, asks for a reason, keeps key order and writes the audit row),
//!   retention (segments, sizes, what pins the oldest), the inbox's overview and failed
//!   handlers, and a message's journey by id or key. `?format=json` on an overview answers
//!   the same report as `outbox status --format json`.
//! - **No build step and nothing from the network**: HTML and inline SVG written on the server,
//!   one inline stylesheet, no script. Every page reads without JavaScript.
//! - **Safe by default**: it listens on loopback unless told otherwise; with a token every
//!   request must carry it; actions are POSTs checked for origin and CSRF token; `--read-only`
//!   serves pages only. See [`auth`].

pub mod auth;
mod history;
mod html;
mod pages;
mod server;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use outbox_core::{RouteSpec, Store};
use tokio_util::sync::CancellationToken;

pub use pages::Filter;
pub use server::{bind, serve, Bound};

/// `outbox console` options.
#[derive(Debug, Clone, clap::Args)]
pub struct Options {
    /// Address to serve on. Loopback by default: bind 0.0.0.0 only behind a token and TLS.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// Token every request must carry (`Authorization: Bearer`, or once as `?token=` in a link,
    /// then a cookie). Env: OUTBOX_CONSOLE_TOKEN.
    #[arg(
        long,
        value_name = "TOKEN",
        env = "OUTBOX_CONSOLE_TOKEN",
        hide_env_values = true
    )]
    pub token: Option<String>,
    /// Serve the pages only: no redrive.
    #[arg(long)]
    pub read_only: bool,
    /// How often the overview's charts read the store (default 10s).
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = humantime_duration)]
    pub sample_every: Duration,
}

fn humantime_duration(s: &str) -> Result<Duration, String> {
    let d = outbox_core::options::parse_duration(s)?;
    if d.is_zero() {
        return Err("must be above zero".into());
    }
    Ok(d)
}

impl Options {
    /// Checks what clap cannot: a token must fit in a cookie.
    pub fn validate(&self) -> Result<(), String> {
        match &self.token {
            Some(t) if !t.is_empty() && t.len() < 16 => Err(
                "the console token is shorter than 16 characters: use a long random one \
                 (e.g. `openssl rand -hex 32`)"
                    .into(),
            ),
            Some(t)
                if !t
                    .bytes()
                    .all(|b| b.is_ascii_graphic() && b != b';' && b != b',') =>
            {
                Err("the console token may hold printable ASCII only, without ; or ,".into())
            }
            _ => Ok(()),
        }
    }
}

/// One store the console shows: the outbox, or the inbox's processing queue.
pub struct Side {
    /// The store.
    pub store: Arc<dyn Store>,
    /// Where it lives, password redacted (shown in the page header).
    pub place: String,
}

/// What the console serves.
pub struct Console {
    outbox: Side,
    inbox: Result<Side, String>,
    routes: Vec<RouteSpec>,
    guard: auth::Guard,
    read_only: bool,
    history: Arc<history::History>,
    inbox_history: Option<Arc<history::History>>,
}

impl Console {
    /// A console over `outbox` and, when it could be opened, `inbox` (otherwise why not, shown
    /// on the inbox pages); `routes` group the backlog as the relay's rules do. Starts sampling
    /// the stores for the charts until `stop`.
    pub fn new(
        outbox: Side,
        inbox: Result<Side, String>,
        routes: Vec<RouteSpec>,
        options: &Options,
        stop: &CancellationToken,
    ) -> Arc<Self> {
        let history =
            history::History::spawn(outbox.store.clone(), options.sample_every, stop.clone());
        let inbox_history = inbox.as_ref().ok().map(|side| {
            history::History::spawn(side.store.clone(), options.sample_every, stop.clone())
        });
        Arc::new(Self {
            outbox,
            inbox,
            routes,
            guard: auth::Guard::new(options.token.clone()),
            read_only: options.read_only,
            history,
            inbox_history,
        })
    }
}

/// Serves `console` on `options.listen` until `stop`.
pub async fn run(
    console: Arc<Console>,
    options: &Options,
    stop: CancellationToken,
) -> std::io::Result<()> {
    let bound = bind(options.listen).await?;
    server::serve(bound, console, stop).await;
    Ok(())
}
