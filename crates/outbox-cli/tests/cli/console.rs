//! `outbox console` and `outbox relay --console` as processes: a console that would be open to
//! the network without a token does not start (and says why), a token that is empty or short is
//! refused wherever it comes from, and with the only relay killed the overview and
//! `outbox status` say "no live relay" within 30 seconds.

#![allow(clippy::unwrap_used)]

use crate::common;
use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::TcpStream;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::{database_url, outbox_command, sigterm, wait_exit};
use outbox_core::NewMessage;
use outbox_core::Store as _;
use outbox_postgres::{connect_pool, migrate, PgStore, Schema};
use outbox_testkit::process::{signal, Signal};

const TOKEN: &str = "a-console-token-of-32-characters";

/// Runs `outbox` with `args` (and `env`) to its end; its exit code and stderr.
fn refused(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String) {
    let dir = std::env::temp_dir();
    let mut c = outbox_command(&dir);
    c.args(args).stdout(Stdio::null()).stderr(Stdio::piped());
    for (k, v) in env {
        c.env(k, v);
    }
    let mut child = c.spawn().unwrap();
    let status = wait_exit(&mut child, Duration::from_secs(30));
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    (status.code(), err)
}

#[test]
fn a_console_open_to_the_network_without_a_token_does_not_start_and_says_why() {
    let url = database_url();
    let db = ["--database-url", url.as_str(), "--schema", "unused"];
    for listen in ["0.0.0.0:0", "[::]:0", "192.0.2.1:8080"] {
        let (code, err) = refused(&[&["console", "--listen", listen][..], &db].concat(), &[]);
        assert_eq!(code, Some(2), "{listen}: {err}");
        assert!(
            err.contains("without a token") && err.contains("listen on 127.0.0.1"),
            "{listen}: the cause once, and what to do: {err}"
        );
        assert_eq!(err.lines().count(), 1, "{err}");
    }
    let (code, err) = refused(
        &[
            &["relay", "--sink", "stdout:", "--console", "0.0.0.0:0"][..],
            &db,
        ]
        .concat(),
        &[],
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("--console: the console would serve 0.0.0.0:0 without a token"),
        "{err}"
    );

    // An empty token turns nothing off silently, from a flag or from the environment.
    let (code, err) = refused(&[&["console", "--token", ""][..], &db].concat(), &[]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("token is empty"), "{err}");
    let (code, err) = refused(
        &[
            &["relay", "--sink", "stdout:", "--console", "127.0.0.1:0"][..],
            &db,
        ]
        .concat(),
        &[("OUTBOX_CONSOLE_TOKEN", "")],
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("token is empty"), "{err}");
    let (code, err) = refused(&[&["console", "--token", "short"][..], &db].concat(), &[]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("shorter than 16"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_console_on_every_address_serves_with_its_token_only() {
    let pool = connect_pool(&database_url(), 2).await.unwrap();
    let schema = Schema::new(&outbox_testkit::unique_name("open")).unwrap();
    migrate(&pool, &schema).await.unwrap();
    let url = database_url();
    let db = ["--database-url", url.as_str(), "--schema", schema.as_str()];
    let dir = std::env::temp_dir();
    let (c, addr) = console(
        &dir,
        &[&db[..], &["--listen", "0.0.0.0:0", "--token", TOKEN]].concat(),
    );
    let mut running = Children(vec![c]);
    let c = &mut running.0[0];
    let local = addr.replace("0.0.0.0", "127.0.0.1");
    assert_eq!(http_get(&local, "/", None).0, 401);
    assert_eq!(http_get(&local, "/", Some(TOKEN)).0, 200);
    sigterm(c);
    wait_exit(c, Duration::from_secs(10));
    let _ = sqlx::raw_sql(&schema.render("DROP SCHEMA {schema} CASCADE"))
        .execute(&pool)
        .await;
}

/// Owns the processes a test starts and kills those still running when dropped, so a failed
/// test leaves none behind (std's `Child::kill` signals nothing once the child was reaped).
struct Children(Vec<Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Starts `outbox console` with `args` and returns it with the address it serves.
fn console(dir: &std::path::Path, args: &[&str]) -> (Child, String) {
    let mut child = outbox_command(dir)
        .env("OUTBOX_LOG", "info")
        .args(["console", "--sample-every", "1s"])
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let addr = loop {
        let line = lines
            .next()
            .expect("the console ended before serving")
            .unwrap();
        if let Some(at) = line.find("serving http://") {
            let rest = &line[at + "serving http://".len()..];
            break rest[..rest.find('/').unwrap()].to_string();
        }
    };
    // Keep draining its log so it never blocks on a full pipe.
    std::thread::spawn(move || lines.for_each(drop));
    (child, addr)
}

/// GET `path` from the console at `addr`: (status, body).
fn http_get(addr: &str, path: &str, token: Option<&str>) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Connection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    let code = raw[9..12].parse().unwrap();
    let body = raw
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    (code, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_only_relay_killed_the_overview_says_so_within_30_seconds() {
    let pool = connect_pool(&database_url(), 4).await.unwrap();
    let schema = Schema::new(&outbox_testkit::unique_name("kill")).unwrap();
    migrate(&pool, &schema).await.unwrap();
    let store = PgStore::new(pool.clone(), schema.clone());
    let url = database_url();
    let db = ["--database-url", url.as_str(), "--schema", schema.as_str()];
    let dir = std::env::temp_dir().join(outbox_testkit::unique_name("kill"));
    std::fs::create_dir_all(&dir).unwrap();

    let relay = outbox_command(&dir)
        .args([
            "relay",
            "--sink",
            "file:out.jsonl",
            "--poll-interval",
            "20ms",
        ])
        .args(db)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (console, addr) = console(&dir, &[&db[..], &["--listen", "127.0.0.1:0"]].concat());
    let mut running = Children(vec![relay, console]);
    let flow = |addr: &str| {
        let (code, body) = http_get(addr, "/?format=json", None);
        assert_eq!(code, 200, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        v["flow"].clone()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while flow(&addr)["live_members"].as_u64().unwrap_or(0) == 0 {
        assert!(
            Instant::now() < deadline,
            "the relay never showed live: {}",
            flow(&addr)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let messages: Vec<NewMessage> = (0..5)
        .map(|i| NewMessage::new("order", format!("o-{i}"), "placed", serde_json::json!({})))
        .collect();
    store.insert(&messages).await.unwrap();

    signal(running.0[0].id(), Signal::Kill);
    let killed = Instant::now();
    let _ = running.0[0].wait();
    // Messages written after the crash: nothing takes them.
    store
        .insert(
            &messages
                .iter()
                .map(|m| NewMessage::new("order", &m.aggregate_id, "placed", serde_json::json!({})))
                .collect::<Vec<_>>(),
        )
        .await
        .unwrap();
    let said = loop {
        let f = flow(&addr);
        if f["state"] == "no_relay" {
            break f;
        }
        assert!(
            killed.elapsed() < Duration::from_secs(30),
            "30 s after the kill the overview still says {f}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let took = killed.elapsed();
    let headline = said["headline"].as_str().unwrap();
    assert!(
        headline.starts_with("No live relay: the last heartbeat was"),
        "{headline}"
    );
    // The page leads with it, and `outbox status` answers the same.
    let (_, page) = http_get(&addr, "/", None);
    let banner = page.find("id=\"flow\"").unwrap();
    assert!(
        banner < page.find("data-figure=\"pending\"").unwrap(),
        "the first thing on the page"
    );
    assert!(page[banner..].contains("no relay</strong>"));
    let status = outbox_command(&dir)
        .args(["status"])
        .args(db)
        .output()
        .unwrap();
    let text = String::from_utf8(status.stdout).unwrap();
    let first = text.lines().nth(1).unwrap();
    assert!(
        first.starts_with("flow                NO RELAY: No live relay: the last heartbeat was"),
        "{text}"
    );
    eprintln!("the overview said \"no live relay\" {took:?} after the kill");

    sigterm(&running.0[1]);
    wait_exit(&mut running.0[1], Duration::from_secs(10));
    let _ = sqlx::raw_sql(&schema.render("DROP SCHEMA {schema} CASCADE"))
        .execute(&pool)
        .await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_console_whose_log_reader_went_away_still_stops_at_sigterm() {
    let pool = connect_pool(&database_url(), 2).await.unwrap();
    let schema = Schema::new(&outbox_testkit::unique_name("pipe")).unwrap();
    migrate(&pool, &schema).await.unwrap();
    let url = database_url();
    let mut child = outbox_command(&std::env::temp_dir())
        .env("OUTBOX_LOG", "info")
        .args(["console", "--listen", "127.0.0.1:0", "--sample-every", "1s"])
        .args(["--database-url", url.as_str(), "--schema", schema.as_str()])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    while !lines.next().unwrap().unwrap().contains("serving http://") {}
    // The reader goes away (`outbox console | head`, a log shipper that died): logging on is an
    // error the console must drop, not a panic of the task that waits for the signal.
    drop(lines);
    let mut running = Children(vec![child]);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    sigterm(&running.0[0]);
    let status = outbox_testkit::process::try_wait_exit(&mut running.0[0], Duration::from_secs(10));
    assert!(status.is_some(), "the console did not stop at SIGTERM");
    let _ = sqlx::raw_sql(&schema.render("DROP SCHEMA {schema} CASCADE"))
        .execute(&pool)
        .await;
}
