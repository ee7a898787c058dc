//! What keeps the console safe when it is reachable: the Host allow-list (DNS rebinding), the
//! session's two cookies (a followed link reads, only the console's own pages act), sign-out,
//! the redirect after `?token=` staying on the console, the hardening headers.

// Test code: a failed expectation should panic with its message.
#![allow(clippy::unwrap_used)]

mod common;

use common::{client, fail_heads, field, msg, start, Setup, TOKEN};
use reqwest::StatusCode;

/// The `name=value` of each Set-Cookie of `r`.
fn cookies(r: &reqwest::Response) -> Vec<String> {
    r.headers()
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap().split(';').next().unwrap().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_naming_a_foreign_host_is_refused_before_anything_is_read() {
    // The docs' first example: loopback, no token. A rebinding page reaches it under its own
    // name; it must get nothing, and act on nothing.
    let c = start(Setup {
        token: None,
        allowed_hosts: vec!["console.example".into()],
        ..Setup::default()
    })
    .await;
    let failing = msg("k", 0);
    fail_heads(&c.store, std::slice::from_ref(&failing), "rejected").await;
    let port = c.base.rsplit(':').next().unwrap().to_string();
    let as_host = |host: String, path: &str| {
        client()
            .get(format!("{}{path}", c.base))
            .header("host", host)
            .send()
    };
    let evil = as_host(
        format!("evil.example:{port}"),
        &format!("/redrive?id={}", failing.id),
    )
    .await
    .unwrap();
    assert_eq!(evil.status(), StatusCode::FORBIDDEN);
    let said = evil.text().await.unwrap();
    assert!(
        said.contains("evil.example") && said.contains("--allowed-host"),
        "the refusal says why and what to do: {said}"
    );
    assert!(!said.contains("csrf"), "nothing of the page leaks");
    // A POST with Host and Origin both foreign, and a CSRF token read elsewhere: refused.
    let page = as_host(
        format!("127.0.0.1:{port}"),
        &format!("/redrive?id={}", failing.id),
    )
    .await
    .unwrap();
    assert_eq!(page.status(), StatusCode::OK);
    let csrf = field(&page.text().await.unwrap(), "csrf");
    let post = client()
        .post(format!("{}/redrive", c.base))
        .header("host", format!("evil.example:{port}"))
        .header("origin", format!("http://evil.example:{port}"))
        .header("sec-fetch-site", "same-origin")
        .form(&[
            ("csrf", csrf.as_str()),
            ("ids", &failing.id.to_string()),
            ("reason", "r"),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(post.status(), StatusCode::FORBIDDEN);
    assert_eq!(
        c.store.failed(10).await.unwrap().len(),
        1,
        "nothing redriven"
    );
    // Loopback names, IP addresses and the allowed name are served.
    for host in [
        format!("localhost:{port}"),
        format!("[::1]:{port}"),
        format!("127.0.0.1:{port}"),
        "console.example".to_string(),
        "CONSOLE.example:443".to_string(),
    ] {
        let r = as_host(host.clone(), "/").await.unwrap();
        assert_eq!(r.status(), StatusCode::OK, "{host}");
    }
    c.end().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_followed_link_reads_only_the_consoles_own_pages_act_and_sign_out_ends_the_session() {
    let c = start(Setup::default()).await;
    let failing = msg("k", 0);
    fail_heads(&c.store, std::slice::from_ref(&failing), "rejected").await;

    // Sign in with the link; the landing never leaves the console, whatever the path says.
    let r = client()
        .get(format!("{}//evil.example/x?token={TOKEN}", c.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    assert_eq!(r.headers()["location"], "/evil.example/x");
    let both = cookies(&r);
    let lax = both[0].clone();
    let all = both.join("; ");

    // A link followed from another site carries only the Lax cookie: the page opens.
    let read = client()
        .get(format!("{}/redrive?id={}", c.base, failing.id))
        .header("cookie", &lax)
        .send()
        .await
        .unwrap();
    assert_eq!(read.status(), StatusCode::OK);
    for (name, want) in [
        ("x-frame-options", "DENY"),
        ("referrer-policy", "same-origin"),
        ("x-content-type-options", "nosniff"),
    ] {
        assert_eq!(read.headers()[name], want, "{name}");
    }
    let csrf = field(&read.text().await.unwrap(), "csrf");
    let form = [
        ("csrf", csrf.clone()),
        ("ids", failing.id.to_string()),
        ("reason", "fixed".to_string()),
    ];
    let act = |cookie: String| {
        client()
            .post(format!("{}/redrive", c.base))
            .header("cookie", cookie)
            .header("origin", c.base.clone())
            .form(&form)
            .send()
    };
    // An action with only what a cross-site request carries: refused, nothing redriven.
    let refused = act(lax.clone()).await.unwrap();
    assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(c.store.failed(10).await.unwrap().len(), 1);
    // From the console's own page (both cookies): it acts.
    let done = act(all.clone()).await.unwrap();
    assert_eq!(done.status(), StatusCode::SEE_OTHER);
    assert!(c.store.failed(10).await.unwrap().is_empty());

    // Sign out: the session is refused from then on, and the browser told to drop it.
    let out = client()
        .post(format!("{}/signout", c.base))
        .header("cookie", &all)
        .header("origin", c.base.clone())
        .form(&[("csrf", csrf.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(out.status(), StatusCode::OK);
    let cleared: Vec<String> = out
        .headers()
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap().to_string())
        .collect();
    assert!(cleared.len() == 2 && cleared.iter().all(|c| c.contains("Max-Age=0")));
    let after = client()
        .get(format!("{}/", c.base))
        .header("cookie", &all)
        .send()
        .await
        .unwrap();
    assert_eq!(after.status(), StatusCode::UNAUTHORIZED);

    // The bearer scheme in any case; the favicon answers without an error.
    let lower = client()
        .get(format!("{}/", c.base))
        .header("authorization", format!("bearer {TOKEN}"))
        .send()
        .await
        .unwrap();
    assert_eq!(lower.status(), StatusCode::OK);
    let icon = client()
        .get(format!("{}/favicon.ico", c.base))
        .send()
        .await
        .unwrap();
    assert_eq!(icon.status(), StatusCode::NO_CONTENT);
    c.end().await;
}
