//! The relay's memory is bounded by bytes, not rows: a backlog of large payloads drained with
//! the default batch size keeps its peak resident set near the byte bound of one claim.

#![allow(clippy::unwrap_used)]

use crate::common;
use std::process::Stdio;
use std::time::Duration;

use common::{sigterm, wait_exit, World};
use outbox_core::{NewMessage, Store};
use outbox_relay::RelayConfig;

/// Peak resident set (`VmHWM`) of process `pid`, in bytes.
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kb * 1024
}

/// Runs `outbox relay` to the file sink over `w`'s outbox until it is drained; returns the
/// relay's peak resident set.
async fn drain_and_measure(w: &World, out: &std::path::Path) -> u64 {
    let mut child = common::outbox_command(&std::env::temp_dir())
        .args([
            "relay",
            "--database-url",
            &common::database_url(),
            "--schema",
            w.schema.as_str(),
            "--sink",
            &format!("file:{}", out.display()),
            "--poll-interval",
            "100ms",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    w.wait_drained(Duration::from_secs(240)).await;
    let peak = peak_rss(child.id());
    sigterm(&child);
    assert!(wait_exit(&mut child, Duration::from_secs(30)).success());
    peak
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_megabyte_payloads_keep_peak_rss_under_the_byte_bound_plus_a_constant() {
    let dir = std::env::temp_dir().join(outbox_testkit::unique_name("memory"));
    std::fs::create_dir_all(&dir).unwrap();

    // The same relay with a tiny backlog: what the process needs whatever the payloads.
    let small = World::new().await;
    small
        .store()
        .insert(&[NewMessage::new("doc", "d", "stored", serde_json::json!({})); 1])
        .await
        .unwrap();
    let baseline = drain_and_measure(&small, &dir.join("small.jsonl")).await;
    small.drop_all().await;

    // 120 payloads of 1 MB (the largest NATS accepts by default), over a few keys: the default
    // batch of 1,000 rows would hold all of them at once.
    let w = World::new().await;
    let data = "x".repeat(1_000_000);
    for chunk in 0..12 {
        let msgs: Vec<NewMessage> = (0..10)
            .map(|i| {
                NewMessage::new(
                    "doc",
                    format!("d{}", i % 4),
                    "stored",
                    serde_json::json!({ "n": chunk * 10 + i, "data": data }),
                )
            })
            .collect();
        w.store().insert(&msgs).await.unwrap();
    }
    let out = dir.join("big.jsonl");
    let peak = drain_and_measure(&w, &out).await;
    let lines = std::fs::read_to_string(&out).unwrap().lines().count();
    assert_eq!(lines, 120, "every message reached the file once");

    // The payloads the relay holds at once (shared by its two workers), plus working room: a
    // row in the driver's buffer per worker, the file sink's line, and glibc's arenas keeping
    // freed 1 MB blocks (its mmap threshold rises after the first large free). Measured over the
    // baseline: 29-30 MiB in plaintext, 39-48 MiB over TLS (the default `sslmode=prefer` takes it
    // where the server offers it: rustls's records are copied into the driver's buffer), 20-22
    // MiB with `MALLOC_MMAP_THRESHOLD_=262144`. Unbounded by bytes the relay held every payload:
    // 120 MiB over the baseline (304 MiB in all before claims were bounded by bytes).
    let bound = RelayConfig::default().batch_bytes as u64;
    let slack = 56 * 1024 * 1024;
    let allowed = baseline + bound + slack;
    println!(
        "peak RSS {} MiB with 1 MB payloads; {} MiB with one small row; bound {} MiB",
        peak >> 20,
        baseline >> 20,
        bound >> 20
    );
    assert!(
        peak < allowed,
        "peak RSS {} MiB exceeds the byte bound {} MiB + {} MiB baseline + {} MiB",
        peak >> 20,
        bound >> 20,
        baseline >> 20,
        slack >> 20
    );
    w.drop_all().await;
    std::fs::remove_dir_all(&dir).ok();
}

/// `--batch-bytes`, `OUTBOX_BATCH_BYTES` and `[relay] batch_bytes` set the bound, in that order
/// of precedence; nonsense is refused with the source named.
#[test]
fn batch_bytes_comes_from_flag_environment_or_file() {
    let dir = std::env::temp_dir().join(outbox_testkit::unique_name("batch_bytes"));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("outbox.toml"),
        "database_url = \"postgres://db/app\"\n[relay]\nsink = \"file:x.jsonl\"\nbatch_bytes = \"2MiB\"\n",
    )
    .unwrap();
    let print = |env: &[(&str, &str)], flags: &[&str]| {
        let mut c = common::outbox_command(&dir);
        c.args(["relay", "--print-config"]).args(flags);
        for (k, v) in env {
            c.env(k, v);
        }
        c.output().unwrap()
    };
    let bytes = |o: std::process::Output| -> u64 {
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap()["batch_bytes"]
            .as_u64()
            .unwrap()
    };
    assert_eq!(bytes(print(&[], &[])), 2 << 20);
    let env = [("OUTBOX_BATCH_BYTES", "512KiB")];
    assert_eq!(bytes(print(&env, &[])), 512 << 10);
    assert_eq!(bytes(print(&env, &["--batch-bytes", "8MB"])), 8_000_000);
    let o = print(&[("OUTBOX_BATCH_BYTES", "heaps")], &[]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("OUTBOX_BATCH_BYTES"));
    let o = print(&[], &["--batch-bytes", "10"]);
    assert_eq!(o.status.code(), Some(2), "below the 1 KiB minimum");
    std::fs::remove_dir_all(&dir).ok();
}
