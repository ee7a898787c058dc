//! Rows holding terminal escapes, BEL, CR, C1 controls, bidi overrides and text that only looks
//! like a NUL, shown by every command that prints them (`outbox status`, `outbox failed`,
//! `outbox redrive`, their `--inbox` forms, an error that quotes its input) and by the relay's
//! text log: no raw control or bidi character reaches the terminal, and each is shown by name.

#![allow(clippy::unwrap_used)]

use crate::common;
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use common::{database_url, outbox_command, sigterm, wait_exit};
use outbox_core::text::is_hidden;
use outbox_core::{NewMessage, Outcome, Store as _};
use outbox_postgres::{connect_pool, migrate, PgStore, Schema};
use outbox_testkit::conformance::{claim_all, sole_member};

const ESC: &str = "ansi\u{1b}[2J\u{1b}[31mRED\u{1b}[0m";
const BEL: &str = "bell\u{7}ding";
const CR: &str = "cr\rOVERWRITTEN";
const C1: &str = "csi\u{9b}2Jc1";
const RLO: &str = "user\u{202e}gnp.exe";
const ISOLATE: &str = "\u{2067}iso\u{2069}late";
/// Text that only looks like a NUL: shown as it is.
const NUL_LIKE: &str = r"nul-\u0000-\x00-%00-␀";

/// Fails the test when `bytes` hold a character that acts on a terminal (any control but the
/// line feed, a bidi control, an invisible one), naming the command and quoting the text.
fn assert_inert(what: &str, bytes: &[u8]) -> String {
    let text = String::from_utf8(bytes.to_vec()).unwrap();
    let raw: Vec<char> = text
        .chars()
        .filter(|&c| c != '\n' && c != '⟨' && (is_hidden(c) || c.is_control()))
        .collect();
    assert!(raw.is_empty(), "{what} wrote raw {raw:?}:\n{text}");
    text
}

fn run(dir: &std::path::Path, args: &[&str]) -> Output {
    outbox_command(dir).args(args).output().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_command_and_no_log_line_lets_a_rows_control_characters_reach_the_terminal() {
    let pool = connect_pool(&database_url(), 4).await.unwrap();
    let schema = Schema::new(&outbox_testkit::unique_name("term")).unwrap();
    migrate(&pool, &schema).await.unwrap();
    let store = PgStore::new(pool.clone(), schema.clone());
    let url = database_url();
    let db = ["--database-url", url.as_str(), "--schema", schema.as_str()];
    let dir = std::env::temp_dir().join(outbox_testkit::unique_name("term"));
    std::fs::create_dir_all(&dir).unwrap();

    // The relay refuses each of these as stored: a control character in a key sent as a header
    // value, or whitespace in the destination the type makes. Each fails at once, logged with
    // its key and its error.
    let rows = [
        (ESC, "placed"),
        (BEL, "placed"),
        (CR, "placed"),
        (C1, "placed"),
        (RLO, "pla\u{202e}ced\u{1b}[2J now"),
        (ISOLATE, "placed now"),
        (NUL_LIKE, "placed now"),
    ];
    let messages: Vec<NewMessage> = rows
        .iter()
        .map(|(key, ty)| NewMessage::new("order", *key, *ty, serde_json::json!({"k": key})))
        .collect();
    store.insert(&messages).await.unwrap();
    let mut relay = outbox_command(&dir)
        .env("OUTBOX_LOG", "warn")
        .args([
            "relay",
            "--sink",
            "file:relay.jsonl",
            "--poll-interval",
            "20ms",
        ])
        .args(db)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while store.stats().await.unwrap().failed < rows.len() as i64 {
        assert!(Instant::now() < deadline, "the hostile rows never failed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    sigterm(&relay);
    wait_exit(&mut relay, Duration::from_secs(30));
    let out = relay.wait_with_output().unwrap();
    let log = assert_inert("the relay's text log", &out.stderr);
    // Each failure names its key (a plain field: not masked as a secret-looking `key=`), and the
    // refusal quotes the destination the row's type made.
    assert!(
        log.contains("aggregate_id=ansi⟨ESC⟩[2J⟨ESC⟩[31mRED⟨ESC⟩[0m "),
        "{log}"
    );
    assert!(log.contains("aggregate_id=user⟨U+202E⟩gnp.exe "), "{log}");
    assert!(log.contains("aggregate_id=cr⟨CR⟩OVERWRITTEN "), "{log}");
    assert!(log.contains("`order.pla⟨U+202E⟩ced⟨ESC⟩[2J now`"), "{log}");

    // A failure whose error is the broker's hostile answer, and one in the inbox.
    let extra = NewMessage::new("order", "k-err", "placed", serde_json::json!({}));
    store.insert(std::slice::from_ref(&extra)).await.unwrap();
    let dyn_store: std::sync::Arc<dyn outbox_core::Store> =
        std::sync::Arc::new(PgStore::new(pool.clone(), schema.clone()));
    let (member, parts) = sole_member(&dyn_store).await;
    let got = claim_all(&dyn_store, &member, &parts).await;
    let broker_says = format!("422: {ESC} {BEL} {CR} {RLO} {NUL_LIKE}");
    let outcomes: Vec<Outcome> = got
        .iter()
        .map(|m| Outcome::Failed {
            seq: m.seq,
            error: broker_says.clone(),
        })
        .collect();
    dyn_store.complete(&member, &outcomes).await.unwrap();
    dyn_store.release(&member).await.unwrap();
    let inbox = outbox_inbox::InboxDatabase::open(&url, schema.as_str(), 2)
        .await
        .unwrap();
    inbox.migrate().await.unwrap();
    let queue = inbox.queue();
    queue
        .insert(&[NewMessage::new("order", ESC, RLO, serde_json::json!({}))])
        .await
        .unwrap();
    let (member, parts) = sole_member(&queue).await;
    let got = claim_all(&queue, &member, &parts).await;
    queue
        .complete(
            &member,
            &[Outcome::Failed {
                seq: got[0].seq,
                error: broker_says.clone(),
            }],
        )
        .await
        .unwrap();
    queue.release(&member).await.unwrap();

    let status = run(&dir, &[&["status"][..], &db[..]].concat());
    assert!(status.status.success());
    let text = assert_inert("outbox status", &status.stdout);
    assert!(
        text.contains("ansi⟨ESC⟩[2J") && text.contains("user⟨U+202E⟩gnp.exe"),
        "the blocked keys are shown, by name: {text}"
    );
    let failed = run(&dir, &[&["failed"][..], &db[..]].concat());
    let text = assert_inert("outbox failed", &failed.stdout);
    for shown in [
        "ansi⟨ESC⟩[2J⟨ESC⟩[31mRED⟨ESC⟩[0m",
        "bell⟨BEL⟩ding",
        "cr⟨CR⟩OVERWRITTEN",
        "csi⟨U+009B⟩2Jc1",
        "user⟨U+202E⟩gnp.exe",
        "⟨U+2067⟩iso⟨U+2069⟩late",
        NUL_LIKE,
    ] {
        assert!(text.contains(shown), "{shown} in {text}");
    }
    assert!(text.contains("422: ansi⟨ESC⟩"), "the hostile error: {text}");
    for args in [
        &["status", "--inbox"][..],
        &["failed", "--inbox"],
        &["status", "--watch", "1s"],
    ] {
        let mut c = outbox_command(&dir);
        c.args(args).args(db);
        let out = if args.contains(&"--watch") {
            // One refresh through a pipe, then SIGTERM.
            let mut child = c.stdout(Stdio::piped()).spawn().unwrap();
            tokio::time::sleep(Duration::from_millis(1500)).await;
            sigterm(&child);
            wait_exit(&mut child, Duration::from_secs(10));
            child.wait_with_output().unwrap()
        } else {
            c.output().unwrap()
        };
        assert_inert(&args.join(" "), &out.stdout);
        assert_inert(&args.join(" "), &out.stderr);
    }
    let id = extra.id.to_string();
    let redrive = run(
        &dir,
        &[&["redrive", "--id", &id, "--reason", RLO][..], &db[..]].concat(),
    );
    assert_inert("outbox redrive", &redrive.stdout);
    assert_inert("outbox redrive", &redrive.stderr);

    // An error that quotes what it was given.
    let bad = run(
        &dir,
        &[
            "status",
            "--database-url",
            &url,
            "--schema",
            &format!("s{ESC}{RLO}"),
        ],
    );
    assert!(!bad.status.success());
    let said = assert_inert("an error quoting its input", &bad.stderr);
    assert!(said.starts_with("error: "), "{said}");

    let _ = sqlx::raw_sql(&schema.render("DROP SCHEMA {schema} CASCADE"))
        .execute(&pool)
        .await;
    let _ = sqlx::raw_sql(&schema.render("DROP SCHEMA {schema}_inbox CASCADE"))
        .execute(&pool)
        .await;
    let _ = std::fs::remove_dir_all(&dir);
}
