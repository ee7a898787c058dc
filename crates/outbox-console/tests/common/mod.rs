//! Shared helpers of the console's tests: a console over a real PostgreSQL outbox in a schema of
//! its own, an HTTP client that does not follow redirects, and readers for the figures and
//! form fields of a page.

#![allow(dead_code, clippy::unwrap_used)] // each test binary uses a different subset

use std::sync::Arc;
use std::time::Duration;

use outbox_console::{Console, Options, Side};
use outbox_core::{MemberId, NewMessage, Outcome, Store};
use outbox_postgres::{connect_pool, migrate, PgStore, Schema};
use outbox_testkit::conformance::{claim_all, sole_member};
use reqwest::{redirect, StatusCode};
use tokio_util::sync::CancellationToken;

pub const TOKEN: &str = "console-test-token-0123456789";

pub fn database_url() -> String {
    std::env::var("OUTBOX_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://root@127.0.0.1:5432/test".into())
}

/// How a test's console is set up.
#[derive(Clone)]
pub struct Setup {
    pub token: Option<&'static str>,
    pub read_only: bool,
    pub with_inbox: bool,
    pub allowed_hosts: Vec<String>,
    /// Look for the inbox again while it is missing (as `outbox console` does).
    pub inbox_opener: bool,
}

impl Default for Setup {
    fn default() -> Self {
        Self {
            token: Some(TOKEN),
            read_only: false,
            with_inbox: false,
            allowed_hosts: Vec::new(),
            inbox_opener: false,
        }
    }
}

pub struct Running {
    pub base: String,
    pub store: Arc<dyn Store>,
    pub inbox: Option<Arc<dyn Store>>,
    pub stop: CancellationToken,
    pub schema: Schema,
    pub pool: sqlx::PgPool,
}

impl Running {
    pub async fn end(self) {
        self.stop.cancel();
        let _ = sqlx::raw_sql(&self.schema.render("DROP SCHEMA {schema} CASCADE"))
            .execute(&self.pool)
            .await;
        let _ = sqlx::raw_sql(&self.schema.render("DROP SCHEMA {schema}_inbox CASCADE"))
            .execute(&self.pool)
            .await;
    }
}

pub async fn console(read_only: bool) -> Running {
    start(Setup {
        read_only,
        ..Setup::default()
    })
    .await
}

pub async fn start(setup: Setup) -> Running {
    let pool = connect_pool(&database_url(), 4)
        .await
        .expect("PostgreSQL must be running for these tests");
    let schema = Schema::new(&outbox_testkit::unique_name("console")).unwrap();
    migrate(&pool, &schema).await.unwrap();
    let store: Arc<dyn Store> = Arc::new(PgStore::new(pool.clone(), schema.clone()));
    let options = Options {
        listen: "127.0.0.1:0".parse().unwrap(),
        token: setup.token.map(str::to_string),
        allowed_hosts: setup.allowed_hosts.clone(),
        read_only: setup.read_only,
        sample_every: Duration::from_secs(1),
    };
    options.validate().unwrap();
    let stop = CancellationToken::new();
    let side = Side {
        store: store.clone(),
        place: schema.render("test schema {schema}"),
    };
    let inbox_name = schema.render("{schema}");
    let open_inbox = move || {
        let name = inbox_name.clone();
        async move {
            let db = outbox_inbox::InboxDatabase::open(&database_url(), &name, 2)
                .await
                .map_err(|e| outbox_console::no_inbox_yet(&e))?;
            let queue = db.queue();
            queue
                .stats()
                .await
                .map_err(|e| outbox_console::no_inbox_yet(&e))?;
            Ok::<_, String>(Side {
                store: queue,
                place: db.place(),
            })
        }
    };
    if setup.with_inbox {
        let db = outbox_inbox::InboxDatabase::open(&database_url(), &schema.render("{schema}"), 2)
            .await
            .unwrap();
        db.migrate().await.unwrap();
    }
    let inbox = open_inbox().await;
    let inbox_store = inbox.as_ref().ok().map(|s| s.store.clone());
    let c = if setup.inbox_opener {
        let opener: outbox_console::InboxOpener = Box::new(move || Box::pin(open_inbox()));
        Console::with_inbox_opener(side, inbox, opener, vec![], &options, &stop)
    } else {
        let inbox = inbox.map_err(|_| "no inbox in this test".to_string());
        Console::new(side, inbox, vec![], &options, &stop)
    };
    let bound = outbox_console::bind(options.listen).await.unwrap();
    let base = format!("http://{}", bound.local_addr().unwrap());
    tokio::spawn(outbox_console::serve(bound, c, stop.clone()));
    Running {
        base,
        store,
        inbox: inbox_store,
        stop,
        schema,
        pool,
    }
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(redirect::Policy::none())
        .build()
        .unwrap()
}

/// GET `path` with the token as a bearer.
pub async fn get(base: &str, path: &str) -> (StatusCode, String) {
    let r = client()
        .get(format!("{base}{path}"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    (r.status(), r.text().await.unwrap())
}

/// The value of the first `name="<field>" value="…"` in `html`.
pub fn field(html: &str, name: &str) -> String {
    let at = html
        .find(&format!("name=\"{name}\" value=\""))
        .unwrap_or_else(|| panic!("no field {name} in {html}"));
    let rest = &html[at + name.len() + 15..];
    rest[..rest.find('"').unwrap()].to_string()
}

/// The text of the element tagged `data-figure="<name>"` (a card's value, or a span).
pub fn figure(html: &str, name: &str) -> String {
    let at = html
        .find(&format!("data-figure=\"{name}\""))
        .unwrap_or_else(|| panic!("no figure {name} in {html}"));
    let rest = &html[at..];
    let rest = &rest[rest.find('>').unwrap() + 1..];
    let rest = rest.strip_prefix("<div class=\"v\">").unwrap_or(rest);
    rest[..rest.find('<').unwrap()].to_string()
}

pub fn msg(key: &str, n: u32) -> NewMessage {
    NewMessage::new("order", key, "placed", serde_json::json!({ "n": n })).header(
        "traceparent",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    )
}

/// Inserts `messages`, then fails each key's head with `error` (the rest of each key waits
/// behind it); returns the member that did it, still holding every partition.
pub async fn fail_heads(store: &Arc<dyn Store>, messages: &[NewMessage], error: &str) -> MemberId {
    for chunk in messages.chunks(500) {
        store.insert(chunk).await.unwrap();
    }
    let (m, parts) = sole_member(store).await;
    let got = claim_all(store, &m, &parts).await;
    let mut heads = std::collections::HashMap::new();
    for r in &got {
        heads.entry(r.aggregate_id.clone()).or_insert(r.seq);
    }
    let outcomes: Vec<Outcome> = heads
        .values()
        .map(|&seq| Outcome::Failed {
            seq,
            error: error.to_string(),
        })
        .collect();
    store.complete(&m, &outcomes).await.unwrap();
    m
}
