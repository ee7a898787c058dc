//! The web console, `outbox console`: server-rendered pages over the outbox (and the inbox when
//! it shares the database) for the on-call engineer.
//!
//! - **Pages**: the overview, led by whether events flow (the report's `flow`, the same answer
//!   `outbox status` gives), with pending split into what flows and what is held, the backlog by
//!   route and by type, the members and their circuits, charts of the last hour; partitions
//!   (problems first); failed and parked messages (filtered, counted and paged by the store);
//!   redrive (one message, or every failed message a filter matches: it shows what it will do,
//!   asks for a reason, keeps key order and writes the audit row); retention; the inbox's
//!   pages; a message's journey by id or key (a key's head first). `?format=json` on an
//!   overview answers the same report as `outbox status --format json`.
//! - **No build step and nothing from the network**: HTML and inline SVG written on the server,
//!   one inline stylesheet, no script (a refresh is a meta refresh). Every page reads without
//!   JavaScript. Untrusted text is shown by one rule (the `html` module): escaped, bidi-isolated, controls
//!   named, long values cut with the whole a click away.
//! - **Safe by default**: loopback unless told otherwise, and never another address without a
//!   token ([`Options::validate`]); every request must name an allowed Host; a token starts a
//!   two-cookie session (Lax to read, Strict to act); actions are POSTs checked for origin and
//!   CSRF token; `--read-only` serves pages only. See [`auth`].

mod actions;
pub mod auth;
mod history;
mod html;
mod pages;
mod server;
mod views;

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use outbox_core::{RouteSpec, Store};
use tokio_util::sync::CancellationToken;

pub use server::{bind, serve, Bound};

/// `outbox console` options.
#[derive(Debug, Clone, clap::Args)]
pub struct Options {
    /// Address to serve on. Loopback by default; any other address needs a token (and belongs
    /// behind TLS: a proxy that terminates it).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// Token every request must carry (`Authorization: Bearer`, or once as `?token=` in a link,
    /// which starts a 12-hour session), 16 or more printable characters. Required unless the
    /// console listens on loopback. Env: OUTBOX_CONSOLE_TOKEN.
    #[arg(
        long,
        value_name = "TOKEN",
        env = "OUTBOX_CONSOLE_TOKEN",
        hide_env_values = true
    )]
    pub token: Option<String>,
    /// A host name the console answers to besides IP addresses and `localhost` (repeat for
    /// more): the name a proxy or a DNS record gives it. Requests naming any other host are
    /// refused (DNS rebinding). Env: OUTBOX_CONSOLE_ALLOWED_HOSTS (comma-separated).
    #[arg(
        long = "allowed-host",
        value_name = "NAME",
        env = "OUTBOX_CONSOLE_ALLOWED_HOSTS",
        value_delimiter = ','
    )]
    pub allowed_hosts: Vec<String>,
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

/// The shortest token accepted.
pub const MIN_TOKEN_LEN: usize = 16;

impl Options {
    /// Checks what clap cannot: a console reachable from the network needs a token, and a
    /// token (wherever it is given) must be long enough and fit in a header. Each refusal says
    /// the cause once and what to do.
    pub fn validate(&self) -> Result<(), String> {
        const MAKE_ONE: &str = "(e.g. `openssl rand -hex 32`)";
        match &self.token {
            Some(t) if t.is_empty() => {
                return Err(format!(
                    "the console token is empty (--token \"\" or an empty OUTBOX_CONSOLE_TOKEN), \
                     which would turn authentication off: give a random one of {MIN_TOKEN_LEN} \
                     or more characters {MAKE_ONE}, or unset it on a loopback address"
                ))
            }
            Some(t) if t.chars().count() < MIN_TOKEN_LEN => {
                return Err(format!(
                    "the console token is shorter than {MIN_TOKEN_LEN} characters: use a long \
                     random one {MAKE_ONE}"
                ))
            }
            Some(t)
                if !t
                    .bytes()
                    .all(|b| b.is_ascii_graphic() && b != b';' && b != b',') =>
            {
                return Err(
                    "the console token may hold printable ASCII only, without ; or ,".into(),
                )
            }
            _ => {}
        }
        if self.token.is_none() && !self.listen.ip().to_canonical().is_loopback() {
            return Err(format!(
                "the console would serve {} without a token: anyone who reaches that address \
                 could read every payload and redrive. Give it a token of {MIN_TOKEN_LEN} or \
                 more characters (OUTBOX_CONSOLE_TOKEN, {MAKE_ONE}) and put it behind TLS, or \
                 listen on 127.0.0.1",
                self.listen
            ));
        }
        for h in &self.allowed_hosts {
            let name = h.trim_end_matches('.');
            if name.is_empty()
                || !name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
            {
                return Err(format!(
                    "--allowed-host `{}` is not a host name: give the name alone, without \
                     scheme, port or path (e.g. console.example.com)",
                    outbox_core::text::terminal(h)
                ));
            }
        }
        Ok(())
    }
}

/// One store the console shows: the outbox, or the inbox's processing queue.
#[derive(Clone)]
pub struct Side {
    /// The store.
    pub store: Arc<dyn Store>,
    /// Where it lives, password redacted (shown in the page header).
    pub place: String,
}

/// Opens the inbox's side, or says why there is none (yet): called again now and then while
/// there is none, so an inbox migrated after the console started is found without a restart.
pub type InboxOpener =
    Box<dyn Fn() -> Pin<Box<dyn Future<Output = Result<Side, String>> + Send>> + Send + Sync>;

/// What the inbox pages say while the database has no inbox; `detail` (why opening it failed)
/// goes to the debug log only: its own hint (`outbox migrate`) would contradict this one.
pub fn no_inbox_yet(detail: &dyn std::fmt::Display) -> String {
    tracing::debug!(%detail, "console: no inbox here");
    "No inbox in this database yet: `outbox migrate --inbox` creates it, and these pages find \
     it then, without a restart of the console."
        .to_string()
}

/// How often the console tries again to find an inbox that was not there.
const INBOX_RETRY: Duration = Duration::from_secs(5);

/// The inbox as last found: its side and its charts' samples, or why there is none.
struct InboxSlot {
    found: Result<(Side, Arc<history::History>), String>,
    tried: Instant,
}

/// What the console serves.
pub struct Console {
    outbox: Side,
    inbox: tokio::sync::Mutex<InboxSlot>,
    opener: Option<InboxOpener>,
    routes: Vec<RouteSpec>,
    guard: auth::Guard,
    read_only: bool,
    sample_every: Duration,
    stop: CancellationToken,
    history: Arc<history::History>,
    results: actions::Results,
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
        Arc::new(Self::build(outbox, inbox, None, routes, options, stop))
    }

    /// [`Console::new`] that looks for the inbox again with `opener` (every 5 s at most, when
    /// a page of the inbox is asked for) while there is none.
    pub fn with_inbox_opener(
        outbox: Side,
        inbox: Result<Side, String>,
        opener: InboxOpener,
        routes: Vec<RouteSpec>,
        options: &Options,
        stop: &CancellationToken,
    ) -> Arc<Self> {
        Arc::new(Self::build(
            outbox,
            inbox,
            Some(opener),
            routes,
            options,
            stop,
        ))
    }

    fn build(
        outbox: Side,
        inbox: Result<Side, String>,
        opener: Option<InboxOpener>,
        routes: Vec<RouteSpec>,
        options: &Options,
        stop: &CancellationToken,
    ) -> Self {
        let history =
            history::History::spawn(outbox.store.clone(), options.sample_every, stop.clone());
        let found = inbox.map(|side| {
            let h = history::History::spawn(side.store.clone(), options.sample_every, stop.clone());
            (side, h)
        });
        Self {
            outbox,
            inbox: tokio::sync::Mutex::new(InboxSlot {
                found,
                tried: Instant::now(),
            }),
            opener,
            routes,
            guard: auth::Guard::new(options.token.clone(), &options.allowed_hosts),
            read_only: options.read_only,
            sample_every: options.sample_every,
            stop: stop.clone(),
            history,
            results: actions::Results::default(),
        }
    }

    /// The inbox's side and samples, or why there is none; looks again when it was missing
    /// and the last look is old enough (`look`: a page of the inbox is asked for).
    async fn inbox(&self, look: bool) -> Result<(Side, Arc<history::History>), String> {
        let mut slot = self.inbox.lock().await;
        if let (Err(_), Some(opener), true) = (&slot.found, &self.opener, look) {
            if slot.tried.elapsed() >= INBOX_RETRY {
                slot.tried = Instant::now();
                if let Ok(side) = opener().await {
                    let h = history::History::spawn(
                        side.store.clone(),
                        self.sample_every,
                        self.stop.clone(),
                    );
                    tracing::info!(place = %side.place, "console: found the inbox");
                    slot.found = Ok((side, h));
                }
            }
        }
        slot.found.clone()
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
