//! The console over a real PostgreSQL outbox, driven over HTTP as a browser would: the token,
//! the figures against `outbox status --format json`'s report, a redrive with a reason that
//! makes a failed message flow in key order, its journey, and the refusals (no token, a
//! cross-site POST, a stale CSRF token, a read-only console).

// Test code: a failed expectation should panic with its message.
#![allow(clippy::unwrap_used)]

mod common;

use common::{client, console, field, figure, get, msg, start, Setup, TOKEN};
use outbox_core::Outcome;
use outbox_testkit::conformance::{claim_all, sole_member};
use reqwest::StatusCode;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redrive_with_a_reason_makes_a_failed_message_flow_in_key_order_and_its_journey_tells_it()
{
    let c = console(false).await;
    let a: Vec<_> = (0..3).map(|n| msg("k1", n)).collect();
    let other = msg("k2", 0);
    c.store.insert(&a).await.unwrap();
    c.store.insert(std::slice::from_ref(&other)).await.unwrap();
    let (m, parts) = sole_member(&c.store).await;
    let got = claim_all(&c.store, &m, &parts).await;
    assert_eq!(got.len(), 4);
    let head = got.iter().find(|r| r.id == a[0].id).unwrap().seq;
    let outcomes: Vec<Outcome> = got
        .iter()
        .filter(|r| r.aggregate_id == "k2")
        .map(|r| Outcome::Published { seq: r.seq })
        .chain([Outcome::Failed {
            seq: head,
            error: "broker said no: message too large".into(),
        }])
        .collect();
    c.store.complete(&m, &outcomes).await.unwrap();

    // The overview shows what `outbox status --format json` reports.
    let (status, json) = get(&c.base, "/?format=json").await;
    assert_eq!(status, StatusCode::OK);
    let report: serde_json::Value = serde_json::from_str(&json).unwrap();
    let (status, page) = get(&c.base, "/").await;
    assert_eq!(status, StatusCode::OK);
    for name in ["pending", "failed", "parked", "retrying", "blocked_keys"] {
        assert_eq!(
            figure(&page, name),
            report[name].to_string(),
            "{name} on the overview"
        );
    }
    assert_eq!(figure(&page, "failed"), "1");
    assert!(page.contains("<svg class=\"chart\""), "charts are drawn");
    assert!(!page.contains("<script"), "no script on any page");
    let (_, parts_page) = get(&c.base, "/partitions").await;
    assert_eq!(
        figure(&parts_page, "partitions_owned"),
        report["partitions"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| !p["owner"].is_null())
            .count()
            .to_string()
    );
    let (_, retention) = get(&c.base, "/retention").await;
    assert_eq!(
        figure(&retention, "segments"),
        report["retention"]["segments"].to_string()
    );

    // Failed, filtered by key and error; the preview lists what the redrive will do.
    let (_, failed) = get(&c.base, "/failed?key=k1&error=TOO+LARGE").await;
    assert_eq!(figure(&failed, "failed_shown"), "1");
    assert!(failed.contains(&a[0].id.to_string()));
    let (_, none) = get(&c.base, "/failed?key=k2").await;
    assert_eq!(figure(&none, "failed_shown"), "0");
    let (_, preview) = get(&c.base, "/redrive?key=k1").await;
    assert_eq!(figure(&preview, "redrive_count"), "1");
    let csrf = field(&preview, "csrf");
    let ids = field(&preview, "ids");
    assert_eq!(ids, a[0].id.to_string());

    let post = |form: Vec<(&'static str, String)>, origin: &'static str| {
        let url = format!("{}/redrive", c.base);
        async move {
            let mut r = client().post(url).bearer_auth(TOKEN).form(&form);
            if !origin.is_empty() {
                r = r.header("origin", origin);
            }
            let r = r.send().await.unwrap();
            let status = r.status();
            let to = r
                .headers()
                .get("location")
                .map(|l| l.to_str().unwrap().to_string());
            (status, to.unwrap_or(r.text().await.unwrap()))
        }
    };
    let own = Box::leak(c.base.clone().into_boxed_str());
    let good = |reason: &str| {
        vec![
            ("csrf", csrf.clone()),
            ("ids", ids.clone()),
            ("reason", reason.to_string()),
        ]
    };
    // Refused: another site, a stale CSRF token, no reason. Nothing is redriven by them.
    let (s, body) = post(good("x"), "http://evil.example").await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{body}");
    let mut stale = good("x");
    stale[0].1 = "not-the-token".into();
    assert_eq!(post(stale, own).await.0, StatusCode::FORBIDDEN);
    assert_eq!(post(good("  "), own).await.0, StatusCode::BAD_REQUEST);
    assert_eq!(c.store.failed(10).await.unwrap().len(), 1);

    let (s, done) = post(good("raised the broker's size limit"), own).await;
    assert_eq!(
        s,
        StatusCode::SEE_OTHER,
        "answered by a redirect to the result: {done}"
    );
    assert!(c.store.failed(10).await.unwrap().is_empty());
    // The result page, as often as it is reloaded: it redrives nothing more.
    assert!(done.starts_with("/redrive/done?r="), "{done}");
    for _ in 0..2 {
        let (s, result) = get(&c.base, &done).await;
        assert_eq!(s, StatusCode::OK);
        assert_eq!(figure(&result, "redriven"), "1");
    }
    let audited: i64 = sqlx::query_scalar(
        &c.schema
            .render("SELECT count(*) FROM {schema}.outbox_redrives"),
    )
    .fetch_one(&c.pool)
    .await
    .unwrap();
    assert_eq!(audited, 1, "one audit row: a reload redrove nothing");

    // It flows first, its key's waiting messages behind it, in order.
    let released = claim_all(&c.store, &m, &parts).await;
    let want: Vec<_> = a.iter().map(|x| x.id).collect();
    assert_eq!(released.iter().map(|r| r.id).collect::<Vec<_>>(), want);
    let outcomes: Vec<_> = released
        .iter()
        .map(|r| Outcome::Published { seq: r.seq })
        .collect();
    c.store.complete(&m, &outcomes).await.unwrap();

    // Its journey: written, the failed attempt, the redrive with its reason, published.
    let (s, journey) = get(&c.base, &format!("/messages?id={}", a[0].id)).await;
    assert_eq!(s, StatusCode::OK, "{journey}");
    assert_eq!(figure(&journey, "state"), "published");
    let order = [
        "<strong>written</strong>",
        "<strong>failed</strong>",
        "1 failed attempt(s); last error: broker said no: message too large",
        "<strong>redriven</strong>",
        "raised the broker&#39;s size limit (console, from 127.0.0.1)",
        "<strong>published</strong>",
    ];
    let mut from = 0;
    for step in order {
        let at = journey[from..]
            .find(step)
            .unwrap_or_else(|| panic!("{step} missing or out of order in {journey}"));
        from += at + step.len();
    }
    assert!(journey.contains("traceparent"), "headers are shown");
    let (_, by_key) = get(&c.base, "/messages?key=k1").await;
    assert_eq!(by_key.matches("class=\"journey\"").count(), 3);
    let (s, bad) = get(&c.base, "/messages?id=not-a-uuid").await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert!(bad.contains("is not a message id"));
    c.end().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_needs_the_token_and_a_link_with_it_starts_a_session() {
    let c = console(false).await;
    let r = client().get(format!("{}/", c.base)).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    assert!(r.text().await.unwrap().contains("needs its token"));
    let r = client()
        .get(format!("{}/failed", c.base))
        .bearer_auth("wrong-token-wrong-token")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    let r = client()
        .get(format!("{}/failed?key=a&token={TOKEN}", c.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    assert_eq!(r.headers()["location"], "/failed?key=a");
    let cookies: Vec<String> = r
        .headers()
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap().to_string())
        .collect();
    assert_eq!(cookies.len(), 2, "{cookies:?}");
    assert!(cookies
        .iter()
        .all(|c| c.contains("HttpOnly") && !c.contains(TOKEN)));
    assert!(cookies[0].contains("SameSite=Lax") && cookies[1].contains("SameSite=Strict"));
    let r = client()
        .get(format!("{}/failed?key=a", c.base))
        .header("cookie", cookies[0].split(';').next().unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK, "the Lax cookie reads pages");
    assert!(r.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .contains("default-src 'none'"));
    let (s, _) = get(&c.base, "/inbox").await;
    assert_eq!(s, StatusCode::NOT_FOUND, "no inbox: said so");
    c.end().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_console_shows_pages_and_refuses_actions() {
    let c = console(true).await;
    c.store.insert(&[msg("k", 0)]).await.unwrap();
    let (s, failed) = get(&c.base, "/failed").await;
    assert_eq!(s, StatusCode::OK);
    assert!(
        !failed.contains("redrive…"),
        "no redrive link when read-only"
    );
    let (s, _) = get(&c.base, "/redrive?key=k").await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    let r = client()
        .post(format!("{}/redrive", c.base))
        .bearer_auth(TOKEN)
        .form(&[("ids", uuid::Uuid::now_v7().to_string())])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    assert!(r.text().await.unwrap().contains("read-only"));
    let (s, journey) = get(&c.base, "/messages?key=k").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(figure(&journey, "state"), "pending");
    c.end().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn where_the_inbox_shares_the_database_a_journey_ends_with_its_receipt_and_handling() {
    let c = start(Setup {
        with_inbox: true,
        ..Setup::default()
    })
    .await;
    let sent = msg("k", 0);
    c.store.insert(std::slice::from_ref(&sent)).await.unwrap();
    let (_, before) = get(&c.base, &format!("/messages?id={}", sent.id)).await;
    assert_eq!(figure(&before, "inbox_state"), "not received");
    // The inbox records it under the outbox's message id; its processor handles it.
    let inbox = c.inbox.clone().unwrap();
    inbox.insert(std::slice::from_ref(&sent)).await.unwrap();
    let (m, parts) = sole_member(&inbox).await;
    let got = claim_all(&inbox, &m, &parts).await;
    assert_eq!(got.len(), 1);
    inbox
        .complete(&m, &[Outcome::Published { seq: got[0].seq }])
        .await
        .unwrap();
    let (s, after) = get(&c.base, &format!("/messages?id={}", sent.id)).await;
    assert_eq!(s, StatusCode::OK, "{after}");
    assert_eq!(figure(&after, "inbox_state"), "handled");
    assert!(after.contains("<strong>received</strong>") && after.contains("its handler succeeded"));
    let (s, page) = get(&c.base, "/inbox").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(
        figure(&page, "published"),
        "1",
        "handled on the inbox overview"
    );
    c.end().await;
}
