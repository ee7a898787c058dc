//! The `outbox` binary as users run it: real processes, signals, `kill -9`, exit codes.

#![allow(clippy::unwrap_used)]

use crate::common;
use std::collections::HashSet;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{assert_key_order, deliveries, header, sigterm, wait_exit, World};
use outbox_core::{NewMessage, Store};

fn outbox() -> Command {
    common::outbox_command(&std::env::temp_dir())
}

fn run(c: &mut Command) -> Output {
    c.stdin(Stdio::null()).output().unwrap()
}

fn relay(w: &World, extra: &[&str]) -> Child {
    outbox()
        .args([
            "relay",
            "--database-url",
            &common::database_url(),
            "--schema",
            w.schema.as_str(),
        ])
        .args([
            "--sink",
            // Short leases below: the ack timeout must fit in a third of them.
            &format!("{}?ack_timeout=500ms", common::nats_url()),
            "--destination",
            &w.destination(),
        ])
        .args(["--poll-interval", "100ms"])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap()
}

async fn owners(w: &World) -> Vec<String> {
    sqlx::query_scalar(&w.schema.render(
        "SELECT DISTINCT owner FROM {schema}.outbox_partitions WHERE owner IS NOT NULL AND lease_until > now()",
    ))
    .fetch_all(&w.pool)
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_killed_with_sigkill_mid_batch_loses_nothing_and_its_leases_are_taken_over() {
    let w = World::new().await;
    let (keys, per_key) = (200usize, 100usize);
    let msgs = common::interleaved(&common::keys("o", keys), 0..per_key);
    for chunk in msgs.chunks(2000) {
        w.store().insert(chunk).await.unwrap();
    }
    // The lease is renewed every third of it, so at the kill between 2/3 and all of it is left:
    // 6 s leaves the checks below at least 4 s before the second relay must have started, on
    // a loaded CI machine too (2 s once left too little).
    let flags = ["--lease", "6s", "--batch-size", "50", "--workers", "1"];
    let mut a = relay(&w, &flags);
    let deadline = Instant::now() + Duration::from_secs(60);
    while w.stream_count().await < 1500 {
        assert!(Instant::now() < deadline, "first relay published nothing");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    a.kill().unwrap(); // SIGKILL: no cleanup, leases stay held until they expire
    a.wait().unwrap();
    let killed_at = chrono::Utc::now();
    let s = w.stats().await;
    assert!(
        s.pending > 0,
        "the relay finished before it could be killed; nothing was tested"
    );
    let dead = owners(&w).await;
    assert_eq!(
        dead.len(),
        1,
        "the killed relay's leases must still be held: {dead:?}"
    );
    // When the dead relay's leases run out (database clock, same host as the broker's), and
    // that it held every partition: whatever the second relay publishes is a takeover.
    let (expiry, held, total): (chrono::DateTime<chrono::Utc>, i64, i64) =
        sqlx::query_as(&w.schema.render(
            "SELECT max(lease_until) FILTER (WHERE owner = $1), count(*) FILTER (WHERE owner = $1),
                    count(*)
             FROM {schema}.outbox_partitions",
        ))
        .bind(&dead[0])
        .fetch_one(&w.pool)
        .await
        .unwrap();
    assert_eq!(held, total, "the killed relay held every partition");
    // Anything the broker stored up to now came from the dead relay's last moments; the second
    // relay starts after this pause, well before the leases expire.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let b_started = chrono::Utc::now();
    assert!(
        b_started < expiry - chrono::Duration::milliseconds(500),
        "the leases ran out before the second relay started ({expiry} vs {b_started}); nothing is tested"
    );

    let mut b = relay(&w, &flags);
    w.wait_drained(Duration::from_secs(120)).await;
    let now = owners(&w).await;
    assert!(
        !now.is_empty() && !now.contains(&dead[0]),
        "partitions must have moved to the new relay: {now:?}"
    );
    sigterm(&b);
    assert!(wait_exit(&mut b, Duration::from_secs(20)).success());

    // Nothing lost, order kept per key; JetStream's Nats-Msg-Id dedupe drops the republished
    // tail of the killed batch.
    let got = w.read_all(keys * per_key, Duration::from_secs(60)).await;
    let ids: HashSet<String> = got
        .iter()
        .map(|m| header(m, "outbox-message-id").unwrap())
        .collect();
    assert_eq!(ids.len(), keys * per_key, "lost messages");
    // The takeover waited for the leases: the second relay's first message reached the broker
    // after they expired (a takeover that ignored them would publish within a second of
    // `b_started`), and not long after (expired leases are taken at the next rebalance).
    let nanos = |t: chrono::DateTime<chrono::Utc>| i128::from(t.timestamp_nanos_opt().unwrap());
    let first_b = got
        .iter()
        .map(|m| m.info().unwrap().published.unix_timestamp_nanos())
        .filter(|&t| t >= nanos(b_started))
        .min()
        .expect("the second relay published nothing");
    let early_ms = (nanos(expiry) - first_b) / 1_000_000;
    assert!(
        early_ms <= 50,
        "the second relay published {early_ms} ms before the dead relay's leases expired"
    );
    assert!(
        -early_ms < 10_000,
        "the takeover came {} ms after the leases expired",
        -early_ms
    );
    eprintln!(
        "takeover: lease expired {} ms after the kill; first publish by the new relay {} ms after expiry",
        (expiry - killed_at).num_milliseconds(),
        -early_ms
    );
    let per_key_got = assert_key_order(deliveries(&got));
    assert!(per_key_got.values().all(|&n| n as usize == per_key));
    w.drop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_finishes_the_batch_releases_partitions_and_exits_zero() {
    let w = World::new().await;
    w.store()
        .insert(&[NewMessage::new(
            "order",
            "a",
            "placed",
            serde_json::json!({}),
        )])
        .await
        .unwrap();
    let mut child = relay(&w, &["--lease", "30s"]);
    w.wait_drained(Duration::from_secs(30)).await;
    assert!(!owners(&w).await.is_empty());
    sigterm(&child);
    let status = wait_exit(&mut child, Duration::from_secs(20));
    assert!(status.success(), "exit status {status:?}");
    assert!(
        owners(&w).await.is_empty(),
        "partitions must be given back on a graceful stop"
    );
    let members: i64 = sqlx::query_scalar(
        &w.schema
            .render("SELECT count(*) FROM {schema}.outbox_members"),
    )
    .fetch_one(&w.pool)
    .await
    .unwrap();
    assert_eq!(members, 0);
    w.drop_all().await;
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_config_exits_non_zero_with_a_message_naming_the_problem() {
    let w = World::new().await;
    let url = common::database_url();
    let schema = w.schema.as_str().to_string();
    let base = |c: &mut Command| {
        c.args([
            "relay",
            "--database-url",
            &url,
            "--schema",
            &schema,
            "--sink",
            "nats://127.0.0.1:4222",
        ]);
    };

    // Unknown key in the file: names the key and the file.
    let dir = std::env::temp_dir().join(outbox_testkit::unique_name("cfg"));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("outbox.toml");
    std::fs::write(&file, "[relay]\nbatch_sise = 10\n").unwrap();
    let mut c = outbox();
    c.arg("--config").arg(&file);
    base(&mut c);
    let o = run(&mut c);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("batch_sise") && stderr(&o).contains(&file.display().to_string()),
        "{}",
        stderr(&o)
    );

    // Wrong type in the file.
    std::fs::write(&file, "[relay]\nbatch_size = \"many\"\n").unwrap();
    let mut c = outbox();
    c.arg("--config").arg(&file);
    base(&mut c);
    let o = run(&mut c);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("batch_size"), "{}", stderr(&o));
    std::fs::remove_dir_all(&dir).ok();

    // Bad environment value: names the variable.
    let mut c = outbox();
    c.env("OUTBOX_BATCH_SIZE", "lots");
    base(&mut c);
    let o = run(&mut c);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("OUTBOX_BATCH_SIZE"), "{}", stderr(&o));

    // Unknown sink scheme and placeholder.
    let o = run(outbox().args([
        "relay",
        "--database-url",
        &url,
        "--schema",
        &schema,
        "--sink",
        "carrier-pigeon://coop",
    ]));
    assert_ne!(o.status.code(), Some(0));
    assert!(stderr(&o).contains("carrier-pigeon"), "{}", stderr(&o));
    let mut c = outbox();
    base(&mut c);
    c.args(["--destination", "x.{nope}"]);
    let o = run(&mut c);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("{nope}"), "{}", stderr(&o));

    // Missing database URL, invalid schema, schema never migrated, password kept out.
    let o = run(outbox().args(["status"]));
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("database URL"), "{}", stderr(&o));
    let o = run(outbox().args([
        "status",
        "--database-url",
        &url,
        "--schema",
        "Robert'); DROP TABLE x;--",
    ]));
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("schema"), "{}", stderr(&o));
    let o = run(outbox().args([
        "relay",
        "--database-url",
        &url,
        "--schema",
        "never_migrated_here",
        "--sink",
        "nats://127.0.0.1:4222",
    ]));
    assert_ne!(o.status.code(), Some(0));
    assert!(stderr(&o).contains("outbox migrate"), "{}", stderr(&o));
    let o = run(outbox().args([
        "status",
        "--database-url",
        "postgres://app:hunter2@127.0.0.1:1/x",
    ]));
    assert_ne!(o.status.code(), Some(0));
    assert!(
        !stderr(&o).contains("hunter2"),
        "password leaked: {}",
        stderr(&o)
    );
    w.drop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_is_idempotent_and_status_json_has_the_documented_keys() {
    let schema = outbox_testkit::unique_name("cli");
    let url = common::database_url();
    let o = run(outbox().args(["migrate", "--database-url", &url, "--schema", &schema]));
    assert!(o.status.success(), "{}", stderr(&o));
    let o = run(outbox().args(["migrate", "--database-url", &url, "--schema", &schema]));
    assert!(o.status.success());
    assert!(String::from_utf8_lossy(&o.stdout).contains("up to date"));

    let pool = outbox_postgres::connect_pool(&url, 2).await.unwrap();
    let store =
        outbox_postgres::PgStore::new(pool.clone(), outbox_postgres::Schema::new(&schema).unwrap());
    store
        .insert(&[
            NewMessage::new("a", "1", "e", serde_json::json!({})),
            NewMessage::new("a", "2", "e", serde_json::json!({})),
        ])
        .await
        .unwrap();
    // The rows are at least this old when status reads them.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let o = run(outbox().args([
        "status",
        "--database-url",
        &url,
        "--schema",
        &schema,
        "--format",
        "json",
    ]));
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["pending"], 2);
    let age = v["oldest_pending_age_seconds"].as_f64().unwrap();
    assert!((1.5..120.0).contains(&age), "oldest pending age {age} s");
    assert_eq!(v["failed"], 0);
    assert_eq!(v["published"], 0);
    let o = run(outbox().args(["status", "--database-url", &url, "--schema", &schema]));
    assert!(String::from_utf8_lossy(&o.stdout).contains("oldest pending age"));
    sqlx::raw_sql(&format!("DROP SCHEMA {schema} CASCADE"))
        .execute(&pool)
        .await
        .unwrap();
}

#[test]
fn flags_override_environment_which_overrides_the_file() {
    let dir = std::env::temp_dir().join(outbox_testkit::unique_name("precedence"));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("outbox.toml"),
        "database_url = \"postgres://app:hunter2@db/app\"\nschema = \"from_file\"\n[relay]\nsink = \"nats://file:4222\"\nworkers = 3\nbatch_size = 300\nlease = \"15s\"\nallow_destinations = [\"file.>\"]\n",
    )
    .unwrap();
    let print = |env: &[(&str, &str)], flags: &[&str]| -> serde_json::Value {
        let mut c = outbox();
        c.current_dir(&dir)
            .args(["relay", "--print-config"])
            .args(flags);
        for (k, v) in env {
            c.env(k, v);
        }
        let o = c.output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        serde_json::from_slice(&o.stdout).unwrap()
    };
    // The file alone (read from the working directory).
    let v = print(&[], &[]);
    assert_eq!(
        (v["workers"].as_u64(), v["batch_size"].as_u64()),
        (Some(3), Some(300))
    );
    assert_eq!(
        (v["schema"].as_str(), v["lease"].as_str()),
        (Some("from_file"), Some("15s"))
    );
    assert_eq!(
        v["database_url"], "postgres://***@db/app",
        "the userinfo never shows"
    );
    // The environment beats the file.
    let env = [("OUTBOX_WORKERS", "4"), ("OUTBOX_SCHEMA", "from_env")];
    let v = print(&env, &[]);
    assert_eq!(
        (v["workers"].as_u64(), v["batch_size"].as_u64()),
        (Some(4), Some(300))
    );
    assert_eq!(v["schema"], "from_env");
    // Flags beat both.
    let v = print(&env, &["--workers", "5", "--schema", "from_flag"]);
    assert_eq!(
        (v["workers"].as_u64(), v["schema"].as_str()),
        (Some(5), Some("from_flag"))
    );
    assert_eq!(v["sink"], "nats://file:4222");
    // The allow-list: file, then a comma list in the environment, then the flag.
    assert_eq!(
        print(&[], &[])["allow_destinations"],
        serde_json::json!(["file.>"])
    );
    let env = [("OUTBOX_ALLOW_DESTINATIONS", "env.>, env2.*.x")];
    assert_eq!(
        print(&env, &[])["allow_destinations"],
        serde_json::json!(["env.>", "env2.*.x"])
    );
    assert_eq!(
        print(
            &env,
            &[
                "--allow-destinations",
                "a.>,b.>",
                "--allow-destinations",
                "c"
            ]
        )["allow_destinations"],
        serde_json::json!(["a.>", "b.>", "c"])
    );
    // A bad pattern, or a template every row would fail, stops the relay before it starts.
    for flags in [
        &["--allow-destinations", "a.>.b"][..],
        &["--destination", "$JS.API.{event_type}"][..],
    ] {
        let o = outbox()
            .current_dir(&dir)
            .args(["relay", "--print-config"])
            .args(flags)
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2), "{flags:?}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn routes_come_from_the_file_or_the_flag_and_bad_ones_stop_the_relay() {
    let dir = std::env::temp_dir().join(outbox_testkit::unique_name("routes"));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("outbox.toml"),
        "database_url = \"postgres://db/app\"\n[relay]\n\
         [[relay.routes]]\nname = \"payments\"\nevent_type = \"payment.*\"\n\
         sink = \"nats://pay:secret@broker:4222\"\ndestination = \"payments.{event_type}\"\n\
         [[relay.routes]]\ntopic = \"audit.*\"\nsink = \"stdout:\"\n",
    )
    .unwrap();
    let run = |flags: &[&str]| {
        outbox()
            .current_dir(&dir)
            .args(["relay", "--print-config"])
            .args(flags)
            .output()
            .unwrap()
    };
    // Routes alone are enough: no default sink, so unmatched rows would end `failed`.
    let o = run(&[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["sink"], serde_json::Value::Null);
    let routes = v["routes"].as_array().unwrap();
    assert_eq!(routes.len(), 2);
    assert_eq!(
        (routes[0]["name"].as_str(), routes[0]["event_type"].as_str()),
        (Some("payments"), Some("payment.*"))
    );
    assert_eq!(
        routes[0]["sink"], "nats://***@broker:4222",
        "credentials never show"
    );
    assert_eq!(routes[0]["destination"], "payments.{event_type}");
    assert_eq!(
        (routes[1]["name"].as_str(), routes[1]["topic"].as_str()),
        (Some("route-2"), Some("audit.*"))
    );
    // The flag replaces the file's routes.
    let o = run(&[
        "--sink",
        "nats://127.0.0.1:4222",
        "--route",
        "aggregate_type=invoice; sink=file:/tmp/x.jsonl",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["routes"].as_array().unwrap().len(), 1);
    assert_eq!(v["routes"][0]["aggregate_type"], "invoice");
    assert_eq!(v["sink"], "nats://127.0.0.1:4222");
    // A rule without a sink, an unknown key, a duplicate name or a destination outside the
    // allow-list stops the relay before it starts, naming the problem.
    for (flags, says) in [
        (&["--route", "event_type=a"][..], "no `sink`"),
        (&["--route", "evt=a; sink=stdout:"][..], "unknown key `evt`"),
        (
            &[
                "--route",
                "name=x; sink=stdout:",
                "--route",
                "name=x; sink=stdout:",
            ][..],
            "named twice",
        ),
        (
            &[
                "--allow-destinations",
                "ok.>",
                "--sink",
                "stdout:",
                "--destination",
                "ok.{event_type}",
                "--route",
                "event_type=a; sink=stdout:; destination=$JS.API.x",
            ][..],
            "$JS",
        ),
    ] {
        let o = run(flags);
        assert_eq!(o.status.code(), Some(2), "{flags:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(says), "{flags:?}: {err}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// PostgreSQL identifiers and channel names stop at 63 bytes. A schema name of that length once
/// made `pg_notify` raise inside the doorbell trigger, and with it every application INSERT
/// into the outbox fail. With `migrate --notify` on such a schema, an app's INSERT succeeds,
/// the doorbell rings on the schema's channel, and a `--listen` relay publishes the row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schema_of_63_characters_with_the_notify_doorbell_accepts_inserts_and_relays_them() {
    let w = World::new().await;
    let mut name = outbox_testkit::unique_name("s63");
    name.push_str(&"x".repeat(63 - name.len()));
    assert_eq!(name.len(), 63);
    let o = run(outbox().args([
        "migrate",
        "--notify",
        "--database-url",
        &common::database_url(),
        "--schema",
        &name,
    ]));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let schema = outbox_postgres::Schema::new(&name).unwrap();
    let mut listener = sqlx::postgres::PgListener::connect_with(&w.pool)
        .await
        .unwrap();
    listener.listen(&schema.channel()).await.unwrap();

    // The insert an app in any language makes.
    sqlx::query(&schema.render(
        "INSERT INTO {schema}.outbox (aggregate_type, aggregate_id, event_type, payload)
         VALUES ('order', 'k', 'placed', '{\"n\": 0}')",
    ))
    .execute(&w.pool)
    .await
    .expect("an INSERT into a 63-character schema's outbox must succeed");
    let note = tokio::time::timeout(Duration::from_secs(5), listener.recv())
        .await
        .expect("the doorbell must ring on the schema's channel")
        .unwrap();
    assert_eq!(note.channel(), schema.channel());

    let mut relay = outbox()
        .args([
            "relay",
            "--database-url",
            &common::database_url(),
            "--schema",
            &name,
            "--sink",
            &common::nats_url(),
            "--destination",
            &w.destination(),
            "--listen",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while w.stream_count().await < 1 {
        assert!(Instant::now() < deadline, "the row was not relayed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A second row, inserted while the relay listens, goes out too.
    sqlx::query(&schema.render(
        "INSERT INTO {schema}.outbox (aggregate_type, aggregate_id, event_type, payload)
         VALUES ('order', 'k', 'placed', '{\"n\": 1}')",
    ))
    .execute(&w.pool)
    .await
    .unwrap();
    while w.stream_count().await < 2 {
        assert!(Instant::now() < deadline, "the second row was not relayed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    sigterm(&relay);
    assert!(wait_exit(&mut relay, Duration::from_secs(20)).success());
    let got = w.read_all(2, Duration::from_secs(10)).await;
    assert_eq!(
        deliveries(&got)
            .into_iter()
            .map(|d| d.2)
            .collect::<Vec<_>>(),
        vec![0, 1]
    );
    sqlx::raw_sql(&schema.render("DROP SCHEMA {schema} CASCADE"))
        .execute(&w.pool)
        .await
        .unwrap();
    w.drop_all().await;
}
