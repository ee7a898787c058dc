//! The console's answers at any number of failed messages and with hostile rows: counts and
//! filters right past 1,000 failed messages, a bad id refused instead of widened to "all", a
//! 100 KB key that neither widens a page nor makes a link too long, controls and bidi overrides
//! shown by name, a key's head shown however many messages wait behind it, and an inbox
//! migrated after the console started found without a restart.

// Test code: a failed expectation should panic with its message.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::{fail_heads, figure, get, msg, start, Setup};
use outbox_core::NewMessage;
use reqwest::StatusCode;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_lists_count_and_filter_every_failed_message_and_a_bad_id_is_an_error() {
    let c = start(Setup::default()).await;
    let bulk: Vec<NewMessage> = (0..1216)
        .map(|i| {
            NewMessage::new(
                "bulk",
                format!("bulk-{i:04}"),
                "bulk.failed",
                serde_json::json!({ "i": i }),
            )
        })
        .collect();
    fail_heads(&c.store, &bulk, "422 Unprocessable").await;
    let newest = "bulk-1215";

    let (s, all) = get(&c.base, "/failed").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(
        figure(&all, "failed_shown"),
        "1216",
        "every failed message is counted"
    );
    assert_eq!(figure(&all, "failed_on_page"), "100");
    assert!(all.contains("id=\"next-page\""));
    let (_, one) = get(&c.base, &format!("/failed?key={newest}")).await;
    assert_eq!(
        figure(&one, "failed_shown"),
        "1",
        "the newest failed key is found"
    );
    let (_, typed) = get(&c.base, "/failed?type=BULK%2Fbulk").await;
    assert_eq!(
        figure(&typed, "failed_shown"),
        "1216",
        "type: part of type/event, any case"
    );
    let (_, page13) = get(&c.base, &format!("/failed?after={}", i64::MAX - 1)).await;
    assert!(!page13.contains("id=\"next-page\""));
    let (s, _) = get(&c.base, "/failed?after=x").await;
    assert_eq!(s, StatusCode::BAD_REQUEST);

    let (_, preview) = get(&c.base, &format!("/redrive?key={newest}")).await;
    assert_eq!(figure(&preview, "redrive_count"), "1");
    let (_, everything) = get(&c.base, "/redrive").await;
    assert_eq!(figure(&everything, "redrive_count"), "1000");
    assert!(
        everything.contains("1,216 failed messages match"),
        "the rest is said"
    );

    // A typo, a blank, a misspelt parameter: an error that says so, never "redrive all".
    for bad in [
        "/redrive?id=01a249c1-7a2f-7fec-819c-10b3090de09",
        "/redrive?id=",
        "/redrive?id=%20",
        "/redrive?ID=01a249c1-7a2f-7fec-819c-10b3090de091",
        "/redrive?keys=bulk-0001",
    ] {
        let (s, body) = get(&c.base, bad).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{bad}");
        assert!(!body.contains("redrive-form"), "{bad}: no form");
    }
    c.end().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_rows_neither_widen_a_page_nor_reorder_its_words() {
    let c = start(Setup::default()).await;
    let long_key = format!("long-key-{}", "L".repeat(100_000));
    let rows = [
        NewMessage::new("order", &long_key, "placed", serde_json::json!({})),
        NewMessage::new(
            "order",
            "user\u{202e}gnp.exe",
            "placed",
            serde_json::json!({}),
        ),
        NewMessage::new(
            "order",
            "ansi\u{1b}[2J\u{1b}[31mRED",
            "placed",
            serde_json::json!({}),
        ),
        NewMessage::new(
            "order",
            "<script>alert(1)</script>",
            "\"><img src=x onerror=alert(1)>",
            serde_json::json!({}),
        ),
    ];
    fail_heads(
        &c.store,
        &rows,
        "422: echoed <script>alert('resp')</script> \u{202e}deliaf",
    )
    .await;
    let (s, page) = get(&c.base, "/failed").await;
    assert_eq!(s, StatusCode::OK);
    assert!(
        page.len() < 60_000,
        "a 100 KB key is cut on the list: {} bytes",
        page.len()
    );
    assert!(
        !page.contains("?key=long-key"),
        "no link by a 100 KB key (414)"
    );
    assert!(page.contains("user<span class=\"ctl\">⟨U+202E⟩</span>gnp.exe"));
    assert!(page.contains("ansi<span class=\"ctl\">⟨ESC⟩</span>[2J"));
    assert!(
        !page.contains('\u{202e}') && !page.contains('\u{1b}'),
        "no raw control"
    );
    assert!(
        !page.contains("<script>") && !page.contains("<img"),
        "markup escaped"
    );
    // The RLO message's journey: the console's own words keep their order.
    let rlo = &rows[1];
    let (_, journey) = get(&c.base, &format!("/messages?id={}", rlo.id)).await;
    assert!(
        journey.contains("</bdi></a> — now <strong data-figure=\"state\">failed</strong>"),
        "the key is isolated before the console's words"
    );
    assert!(
        journey.contains(&format!("/redrive?id={}", rlo.id)),
        "redrive from the journey"
    );
    // The long key's journey shows it whole, wrapped, a click away from the list.
    let (_, whole) = get(&c.base, &format!("/messages?id={}", rows[0].id)).await;
    assert!(whole.contains("The whole key") && whole.contains(&long_key));
    c.end().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keys_journey_leads_with_the_head_that_holds_its_waiting_messages() {
    let c = start(Setup::default()).await;
    let queue: Vec<NewMessage> = (0..41).map(|n| msg("order-007", n)).collect();
    fail_heads(&c.store, &queue, "sink unavailable").await;
    let (s, page) = get(&c.base, "/messages?key=order-007").await;
    assert_eq!(s, StatusCode::OK);
    let head = queue[0].id.to_string();
    let first = page.find("data-message=\"").unwrap();
    assert!(
        page[first..].starts_with(&format!("data-message=\"{head}\"")),
        "the failed head comes first though 40 newer messages wait"
    );
    assert_eq!(
        page.matches("class=\"journey\"").count(),
        21,
        "the head and the 20 latest"
    );
    assert!(page.contains("of more than 20"), "it says there are more");
    assert!(
        page.contains(&format!("href=\"/messages?id={head}\" class=\"held-by\"")),
        "a waiting message links to its head"
    );
    // The key's form holds the key; the id's form stays empty.
    assert!(page.contains("name=\"key\" size=\"24\" value=\"order-007\""));
    assert!(page.contains("name=\"id\" size=\"38\" value=\"\""));
    c.end().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_that_fails_again_after_a_redrive_ends_its_journey_at_its_own_time() {
    let c = start(Setup::default()).await;
    let m = msg("k", 0);
    let member = fail_heads(&c.store, std::slice::from_ref(&m), "rejected").await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(
        c.store
            .redrive(&outbox_core::RedriveScope::Ids(vec![m.id]), "try again")
            .await
            .unwrap(),
        1
    );
    let parts = c
        .store
        .rebalance(&member, Duration::from_secs(30))
        .await
        .unwrap();
    let again = outbox_testkit::conformance::claim_all(&c.store, &member, &parts).await;
    assert_eq!(again.len(), 1);
    c.store
        .complete(
            &member,
            &[outbox_core::Outcome::Failed {
                seq: again[0].seq,
                error: "rejected again".into(),
            }],
        )
        .await
        .unwrap();
    let j = c
        .store
        .journey(&outbox_core::JourneyQuery::Id(m.id), 1)
        .await
        .unwrap();
    let steps: Vec<(&str, Option<chrono::DateTime<chrono::Utc>>)> =
        j[0].steps.iter().map(|s| (s.what.as_str(), s.at)).collect();
    let redriven = steps.iter().find(|s| s.0 == "redriven").unwrap().1.unwrap();
    let (last, at) = steps.last().unwrap();
    assert_eq!(*last, "failed", "{steps:?}");
    assert!(
        at.unwrap() >= redriven,
        "the last failure ({at:?}) is after the redrive ({redriven}), not the first failure's time"
    );
    c.end().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inbox_migrated_after_the_console_started_is_found_without_a_restart() {
    let c = start(Setup {
        inbox_opener: true,
        ..Setup::default()
    })
    .await;
    let (s, body) = get(&c.base, "/inbox").await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert!(body.contains("outbox migrate --inbox"), "{body}");
    assert!(
        !body.contains("href=\"/inbox\""),
        "no inbox links without an inbox"
    );
    let db =
        outbox_inbox::InboxDatabase::open(&common::database_url(), &c.schema.render("{schema}"), 2)
            .await
            .unwrap();
    db.migrate().await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (s, _) = get(&c.base, "/inbox").await;
        if s == StatusCode::OK {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the inbox was never found"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let (_, overview) = get(&c.base, "/").await;
    assert!(
        overview.contains("href=\"/inbox\""),
        "the inbox links appear"
    );
    c.end().await;
}
