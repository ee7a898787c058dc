//! Operating the relay and the inbox: `/metrics` scraped over HTTP from the `outbox` binary
//! while rows are published, parked and failed and while a broker is down, `/readyz` following
//! the sinks' circuits, and `/livez` failing when a worker is wedged (in-process, with a sink
//! that blocks its thread: the one wedge no deadline can cut). Each test has its own schema,
//! stream and broker where it stops one; waits are for outcomes, with generous limits.

#![allow(clippy::unwrap_used)]

use crate::common;
use std::collections::BTreeSet;
use std::process::{Child, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::World;
use outbox_core::{NewMessage, Store};
use outbox_testkit::process::free_port;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const WAIT: Duration = Duration::from_secs(90);

/// One `GET` over HTTP/1.1; `None` while nothing listens.
async fn get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    let req = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.ok()?;
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), s.read_to_end(&mut raw))
        .await
        .ok()?
        .ok()?;
    let text = String::from_utf8_lossy(&raw).to_string();
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, body.to_string()))
}

/// The sum of the samples of `name` whose labels include every one of `labels`; `None` when no
/// sample matches.
fn value(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let mut found = None;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, v)) = line.rsplit_once(' ') else {
            continue;
        };
        let (n, set) = match series.split_once('{') {
            Some((n, rest)) => (n, rest.trim_end_matches('}')),
            None => (series, ""),
        };
        if n != name {
            continue;
        }
        let has = |k: &str, want: &str| set.split(',').any(|kv| kv == format!("{k}=\"{want}\""));
        if labels.iter().all(|(k, want)| has(k, want)) {
            *found.get_or_insert(0.0) += v.parse::<f64>().unwrap();
        }
    }
    found
}

/// The metric families a scrape holds (`# TYPE` lines).
fn families(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

/// Scrapes `/metrics` until `ok` holds for a scrape; panics with the last scrape after `WAIT`.
async fn wait_scrape(port: u16, what: &str, ok: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + WAIT;
    let mut last = String::new();
    while Instant::now() < deadline {
        if let Some((200, body)) = get(port, "/metrics").await {
            if ok(&body) {
                return body;
            }
            last = body;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("waited {WAIT:?} for {what}; last scrape:\n{last}");
}

/// Asks `path` until it answers `status`; returns the body.
async fn wait_probe(port: u16, path: &str, status: u16) -> String {
    let deadline = Instant::now() + WAIT;
    let mut last = None;
    while Instant::now() < deadline {
        match get(port, path).await {
            Some((s, body)) if s == status => return body,
            other => last = other,
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{path} did not answer {status} within {WAIT:?}; last: {last:?}");
}

/// A NATS server of the test's own (so it can be stopped) holding the test's stream.
async fn private_nats_with_stream(w: &World) -> common::PrivateNats {
    let nats = common::PrivateNats::start();
    let js = async_nats::jetstream::new(async_nats::connect(nats.url()).await.unwrap());
    outbox_sinks::nats::create_stream(&js, &w.stream, vec![format!("{}.>", w.prefix)], true)
        .await
        .unwrap();
    nats
}

/// `outbox relay` with its metrics on a port of its own, killed when dropped.
struct RelayProcess {
    child: Child,
    port: u16,
}

impl RelayProcess {
    fn start(w: &World, sink: &str, extra: &[&str]) -> Self {
        let port = free_port();
        let dir = std::env::temp_dir();
        let child = common::outbox_command(&dir)
            .arg("relay")
            .args(["--database-url", &common::database_url()])
            .args(["--schema", w.schema.as_str()])
            .args(["--sink", sink])
            .args(["--destination", &w.destination()])
            .args(["--metrics-addr", &format!("127.0.0.1:{port}")])
            .args(["--workers", "2", "--lease", "3s", "--poll-interval", "50ms"])
            .args(extra)
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        Self { child, port }
    }
}

impl Drop for RelayProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn order(key: &str, aggregate_type: &str, n: u32) -> NewMessage {
    NewMessage::new(aggregate_type, key, "placed", serde_json::json!({ "n": n }))
}

/// Published rows move `outbox_published_total` and the latency histogram; a row the broker
/// rejects (no stream captures its subject) moves the error counter, shows as parked while it
/// waits for its retry, then as failed once its budget is spent; the store figures come back
/// to nothing pending. And every family the relay exports is one the catalogue documents.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_move_as_rows_are_published_parked_and_failed() {
    let w = World::with_stream(false).await;
    outbox_sinks::nats::create_stream(&w.js, &w.stream, vec![format!("{}.ok.>", w.prefix)], false)
        .await
        .unwrap();
    let relay = RelayProcess::start(
        &w,
        &format!("{}?ack_timeout=500ms", common::nats_url()),
        &[
            "--max-attempts",
            "2",
            "--backoff-base",
            "6s",
            "--backoff-max",
            "6s",
        ],
    );
    wait_probe(relay.port, "/readyz", 200).await;
    let rows: Vec<NewMessage> = (0..20)
        .map(|n| order(&format!("k{}", n % 5), "ok", n))
        .collect();
    w.store().insert(&rows).await.unwrap();
    w.store()
        .insert(&[order("poison", "lost", 0)])
        .await
        .unwrap();
    let nats = [("sink", "nats"), ("route", "default")];
    let parked = wait_scrape(
        relay.port,
        "20 published and the rejected row parked",
        |m| {
            value(m, "outbox_published_total", &nats) >= Some(20.0)
                && value(m, "outbox_retrying_messages", &[]) == Some(1.0)
        },
    )
    .await;
    assert!(value(&parked, "outbox_parked_messages", &[]) >= Some(1.0));
    assert!(
        value(
            &parked,
            "outbox_publish_errors_total",
            &[("sink", "nats"), ("kind", "rejected")]
        ) >= Some(1.0),
        "{parked}"
    );
    assert_eq!(value(&parked, "outbox_failed_messages", &[]), Some(0.0));
    let failed = wait_scrape(relay.port, "the rejected row failed", |m| {
        value(m, "outbox_failed_messages", &[]) == Some(1.0)
            && value(m, "outbox_pending_messages", &[]) == Some(0.0)
    })
    .await;
    assert_eq!(value(&failed, "outbox_failed_total", &nats), Some(1.0));
    assert_eq!(value(&failed, "outbox_retries_total", &nats), Some(1.0));
    assert_eq!(value(&failed, "outbox_retrying_messages", &[]), Some(0.0));
    assert_eq!(
        value(&failed, "outbox_oldest_pending_age_seconds", &[]),
        Some(0.0)
    );
    assert!(
        value(&failed, "outbox_end_to_end_latency_seconds_count", &nats) >= Some(20.0),
        "{failed}"
    );
    assert!(value(&failed, "outbox_claim_duration_seconds_count", &[]) >= Some(1.0));
    assert!(value(&failed, "outbox_record_duration_seconds_count", &[]) >= Some(1.0));
    assert!(value(&failed, "outbox_batch_messages_sum", &[]) >= Some(21.0));
    assert!(value(&failed, "outbox_publish_duration_seconds_count", &nats) >= Some(1.0));
    assert_eq!(value(&failed, "outbox_partitions_owned", &[]), Some(64.0));
    assert_eq!(value(&failed, "outbox_circuit_state", &nats), Some(0.0));
    assert_eq!(value(&failed, "outbox_store_up", &[]), Some(1.0));
    assert!(value(&failed, "outbox_segments", &[]) >= Some(1.0));
    assert!(value(
        &failed,
        "outbox_retention_pin_age_seconds",
        &[("pin", "position")]
    )
    .is_some());
    // The backlog by route (read at the first scrape, then every 30 s).
    assert!(
        value(
            &failed,
            "outbox_route_pending_messages",
            &[("route", "default")]
        )
        .is_some(),
        "{failed}"
    );
    assert!(value(
        &failed,
        "outbox_route_oldest_pending_age_seconds",
        &[("route", "default")]
    )
    .is_some());
    // What a scrape holds is what the catalogue (and so docs/operations.md) lists, no more.
    let documented = catalogue(&[
        outbox_relay::telemetry::CATALOGUE,
        outbox_observe::RELAY_CATALOGUE,
    ]);
    assert_eq!(families(&failed), documented, "{failed}");
    save_scrape("relay", &failed);
    w.drop_all().await;
}

fn catalogue(parts: &[&[outbox_relay::telemetry::MetricDef]]) -> BTreeSet<String> {
    parts
        .iter()
        .flat_map(|c| c.iter())
        .map(|d| d.name.to_string())
        .collect()
}

/// Keeps a live scrape for `scripts/check_dashboard.py` when OUTBOX_SCRAPE_DIR is set (the
/// dashboard check then reads what a running process exported, not a list).
fn save_scrape(name: &str, text: &str) {
    if let Ok(dir) = std::env::var("OUTBOX_SCRAPE_DIR") {
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            std::path::Path::new(&dir).join(format!("{name}.prom")),
            text,
        )
        .unwrap();
    }
}

/// A row written while the broker is down waits, and the oldest-pending-age gauge says so,
/// growing while it waits; once the broker is back the row goes out and the gauge drops to
/// zero. The relay stays live throughout: a broker outage is no reason to restart it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_oldest_pending_age_tracks_a_row_held_back_by_a_stopped_broker() {
    let w = World::with_stream(false).await;
    let mut nats = private_nats_with_stream(&w).await;
    let relay = RelayProcess::start(&w, &format!("{}?ack_timeout=500ms", nats.url()), &[]);
    wait_probe(relay.port, "/readyz", 200).await;
    w.store().insert(&[order("a", "order", 0)]).await.unwrap();
    wait_scrape(relay.port, "the first row published", |m| {
        value(m, "outbox_published_total", &[]) == Some(1.0)
            && value(m, "outbox_pending_messages", &[]) == Some(0.0)
    })
    .await;
    nats.down();
    w.store().insert(&[order("b", "order", 1)]).await.unwrap();
    let held = wait_scrape(relay.port, "the held row's age past 3 s", |m| {
        value(m, "outbox_oldest_pending_age_seconds", &[]) >= Some(3.0)
            && value(m, "outbox_pending_messages", &[]) == Some(1.0)
    })
    .await;
    let first = value(&held, "outbox_oldest_pending_age_seconds", &[]).unwrap();
    wait_scrape(relay.port, "the held row's age growing", |m| {
        value(m, "outbox_oldest_pending_age_seconds", &[]) >= Some(first + 2.0)
    })
    .await;
    assert_eq!(get(relay.port, "/livez").await.map(|r| r.0), Some(200));
    nats.up();
    let back = wait_scrape(relay.port, "the held row published", |m| {
        value(m, "outbox_pending_messages", &[]) == Some(0.0)
            && value(m, "outbox_oldest_pending_age_seconds", &[]) == Some(0.0)
    })
    .await;
    assert!(value(&back, "outbox_published_total", &[]) >= Some(2.0));
    w.drop_all().await;
}

/// Scrapes close together share one read of the store (at most one a second, so the query
/// costs a drain nothing however often Prometheus asks), and a later scrape reads it again:
/// five scrapes back to back show at most two values of the store query's duration, and a row
/// written afterwards still shows as pending.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scrapes_close_together_share_one_read_of_the_store() {
    let w = World::with_stream(false).await;
    let mut nats = private_nats_with_stream(&w).await;
    let relay = RelayProcess::start(&w, &format!("{}?ack_timeout=500ms", nats.url()), &[]);
    wait_probe(relay.port, "/readyz", 200).await;
    let mut durations = Vec::new();
    for _ in 0..5 {
        let (_, m) = get(relay.port, "/metrics").await.unwrap();
        durations.push(value(&m, "outbox_store_query_duration_seconds", &[]).unwrap());
    }
    durations.dedup();
    assert!(
        durations.len() <= 2,
        "each scrape read the store: {durations:?}"
    );
    nats.down();
    w.store().insert(&[order("a", "order", 0)]).await.unwrap();
    wait_scrape(relay.port, "the row pending on a later read", |m| {
        value(m, "outbox_pending_messages", &[]) == Some(1.0)
    })
    .await;
    nats.up();
    w.drop_all().await;
}

/// With the only sink's broker down, the circuit opens and, once it has been open longer than
/// `--unready-after`, `/readyz` fails (naming the sinks) while `/livez` passes; when the broker
/// returns, the circuit closes and `/readyz` passes again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_fails_while_every_circuit_is_open_and_passes_when_the_broker_returns() {
    let w = World::with_stream(false).await;
    let mut nats = private_nats_with_stream(&w).await;
    let relay = RelayProcess::start(
        &w,
        &format!("{}?ack_timeout=500ms", nats.url()),
        &["--unready-after", "1s"],
    );
    let ready = wait_probe(relay.port, "/readyz", 200).await;
    assert!(ready.contains("ok database: answers"), "{ready}");
    nats.down();
    let rows: Vec<NewMessage> = (0..10)
        .map(|n| order(&format!("k{n}"), "order", n))
        .collect();
    w.store().insert(&rows).await.unwrap();
    let unready = wait_probe(relay.port, "/readyz", 503).await;
    // Open, or half-open while a probe publish is out: either way not closed for too long.
    assert!(
        unready.contains("FAIL sinks: default=nats open")
            || unready.contains("FAIL sinks: default=nats half-open"),
        "{unready}"
    );
    let live = wait_probe(relay.port, "/livez", 200).await;
    assert!(live.contains("ok worker 0"), "{live}");
    let open = wait_scrape(relay.port, "the circuit open", |m| {
        value(m, "outbox_circuit_state", &[("sink", "nats")]) == Some(2.0)
    })
    .await;
    assert!(value(&open, "outbox_circuit_open_seconds", &[("sink", "nats")]) > Some(0.0));
    assert!(
        value(
            &open,
            "outbox_publish_errors_total",
            &[("sink", "nats"), ("kind", "unavailable")]
        ) >= Some(1.0),
        "{open}"
    );
    nats.up();
    wait_probe(relay.port, "/readyz", 200).await;
    wait_scrape(relay.port, "every row published", |m| {
        value(m, "outbox_pending_messages", &[]) == Some(0.0)
            && value(m, "outbox_circuit_state", &[("sink", "nats")]) == Some(0.0)
    })
    .await;
    w.drop_all().await;
}

/// A worker whose sink blocks its thread never finishes its step: no publish deadline can fire
/// on a task that never yields. `/livez` fails, naming the worker, once it has been silent for
/// the live bound; when the call returns, the worker moves again and `/livez` passes.
///
/// The relay runs on a runtime of its own, on its own thread, with its own pool: a thread
/// blocked inside a runtime can hold up tasks queued on it (tokio does not steal a worker's
/// next-to-run slot), and the wedge must not reach the probe server or this test's timers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn livez_fails_while_a_worker_is_wedged_and_passes_once_it_moves_again() {
    let w = World::new().await;
    let sink = Arc::new(outbox_testkit::sinks::BlockingSink::new(
        outbox_testkit::sinks::MemorySink::default(),
    ));
    let mut cfg = w.relay_config();
    cfg.workers = 1;
    cfg.store_timeout = Duration::from_secs(1);
    let relay_stop = tokio_util::sync::CancellationToken::new();
    let (health_tx, health_rx) = tokio::sync::oneshot::channel();
    let relay_thread = {
        let (sink, stop, schema) = (sink.clone(), relay_stop.clone(), w.schema.clone());
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let pool = outbox_postgres::connect_pool(&common::database_url(), 4)
                    .await
                    .unwrap();
                let store = Arc::new(outbox_postgres::PgStore::new(pool, schema));
                let relay = outbox_relay::Relay::new(store, sink, cfg);
                health_tx.send(relay.health()).unwrap();
                relay.run(stop).await;
            });
        })
    };
    let health = health_rx.await.unwrap();
    let target =
        outbox_observe::Target::relay(w.dyn_store(), health, outbox_observe::DEFAULT_UNREADY_AFTER);
    let server = outbox_observe::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let port = server.local_addr().unwrap().port();
    let exporter = outbox_observe::Exporter::detached(&[outbox_observe::RELAY_CATALOGUE]).unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let serving = tokio::spawn(outbox_observe::serve(
        server,
        exporter,
        Arc::new(target),
        stop.clone(),
    ));
    wait_probe(port, "/readyz", 200).await;
    assert!(wait_probe(port, "/livez", 200)
        .await
        .contains("ok worker 0"));
    sink.arm();
    w.store().insert(&[order("a", "order", 0)]).await.unwrap();
    let wedged = wait_probe(port, "/livez", 503).await;
    assert_eq!(sink.blocked(), 1);
    assert!(wedged.contains("FAIL worker 0"), "{wedged}");
    sink.release();
    wait_probe(port, "/livez", 200).await;
    w.wait_drained(WAIT).await;
    relay_stop.cancel();
    tokio::task::spawn_blocking(move || relay_thread.join().unwrap())
        .await
        .unwrap();
    stop.cancel();
    serving.await.unwrap();
    w.drop_all().await;
}

/// `outbox inbox --metrics-addr`: the daemon counts what it received and the duplicates it
/// absorbed, and the processing queue's figures say what waits for the handlers (the lag) and
/// what they gave up on. The handlers' own metrics (handled, failures, latency by type) are
/// recorded in the process that runs the processor: here, this test's, with a recorder
/// installed (the only test of this binary that installs one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inbox_metrics_count_received_duplicates_lag_and_handler_outcomes() {
    use outbox_inbox::{Handlers, InboxDatabase, InboxProcessor, InboxSchema, ProcessorConfig};
    let name = outbox_testkit::unique_name("ibx");
    let db = InboxDatabase::open(&common::database_url(), &name, 8)
        .await
        .unwrap();
    db.migrate().await.unwrap();
    let stream = name.to_uppercase();
    let js = async_nats::jetstream::new(async_nats::connect(common::nats_url()).await.unwrap());
    outbox_sinks::nats::create_stream(&js, &stream, vec![format!("{name}.>")], false)
        .await
        .unwrap();
    let mut ids = Vec::new();
    for (n, kind) in ["ok", "ok", "ok", "ok", "bad"].iter().enumerate() {
        let id = uuid::Uuid::now_v7();
        ids.push(id);
        let mut h = async_nats::HeaderMap::new();
        h.insert("outbox-message-id", id.to_string().as_str());
        h.insert("outbox-event-type", *kind);
        h.insert("outbox-aggregate-id", format!("k{n}").as_str());
        js.publish_with_headers(format!("{name}.x"), h, "{}".into())
            .await
            .unwrap()
            .await
            .unwrap();
    }
    // The first message once more: a redelivery the inbox must absorb.
    let mut h = async_nats::HeaderMap::new();
    h.insert("outbox-message-id", ids[0].to_string().as_str());
    h.insert("outbox-event-type", "ok");
    js.publish_with_headers(format!("{name}.x"), h, "{}".into())
        .await
        .unwrap()
        .await
        .unwrap();
    let port = free_port();
    let mut daemon = common::outbox_command(&std::env::temp_dir())
        .arg("inbox")
        .args(["--database-url", &common::database_url()])
        .args(["--schema", &name])
        .args([
            "--source",
            &format!("{}?stream={stream}", common::nats_url()),
        ])
        .args(["--metrics-addr", &format!("127.0.0.1:{port}")])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let ingested = wait_scrape(port, "6 received, 1 duplicate, 5 waiting", |m| {
        value(m, "outbox_inbox_received_total", &[]) == Some(6.0)
            && value(m, "outbox_inbox_duplicates_total", &[]) == Some(1.0)
            && value(m, "outbox_inbox_pending_messages", &[]) == Some(5.0)
    })
    .await;
    assert!(value(&ingested, "outbox_inbox_lag_seconds", &[]) > Some(0.0));
    assert!(value(&ingested, "outbox_inbox_ingest_duration_seconds_count", &[]) >= Some(1.0));
    assert_eq!(value(&ingested, "outbox_inbox_store_up", &[]), Some(1.0));
    assert!(wait_probe(port, "/livez", 200)
        .await
        .contains("ok ingest of"));
    wait_probe(port, "/readyz", 200).await;
    let documented = catalogue(&[
        outbox_inbox::telemetry::DAEMON_CATALOGUE,
        outbox_observe::INBOX_CATALOGUE,
    ]);
    assert_eq!(families(&ingested), documented, "{ingested}");

    // The handlers, in this process, with its own recorder.
    let exporter =
        outbox_observe::Exporter::install(&[outbox_inbox::telemetry::PROCESSOR_CATALOGUE]).unwrap();
    let pool = db.tables().postgres().expect("a PostgreSQL URL").pool();
    let handlers = Handlers::new()
        .on_fn("ok", |_tx, _m| Box::pin(async { Ok(()) }))
        .on_fn("bad", |_tx, _m| {
            Box::pin(async { Err(outbox_inbox::HandlerError::permanent("refused")) })
        });
    let processor = InboxProcessor::postgres(
        pool.clone(),
        InboxSchema::new(&name).unwrap(),
        handlers,
        ProcessorConfig {
            lease: Duration::from_secs(3),
            ..ProcessorConfig::default()
        },
    )
    .unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let running = tokio::spawn(processor.run(stop.clone()));
    let handled = wait_scrape(port, "nothing waiting, one failed", |m| {
        value(m, "outbox_inbox_pending_messages", &[]) == Some(0.0)
            && value(m, "outbox_inbox_failed_messages", &[]) == Some(1.0)
    })
    .await;
    assert_eq!(value(&handled, "outbox_inbox_lag_seconds", &[]), Some(0.0));
    stop.cancel();
    running.await.unwrap();
    let mine = exporter.render();
    assert_eq!(
        value(&mine, "outbox_inbox_handled_total", &[("type", "ok")]),
        Some(4.0),
        "{mine}"
    );
    assert_eq!(
        value(
            &mine,
            "outbox_inbox_handler_failures_total",
            &[("type", "bad"), ("kind", "permanent")]
        ),
        Some(1.0),
        "{mine}"
    );
    assert_eq!(
        value(&mine, "outbox_inbox_handler_duration_seconds_count", &[]),
        Some(5.0),
        "{mine}"
    );
    save_scrape("inbox", &format!("{ingested}\n{mine}"));
    let _ = daemon.kill();
    let _ = daemon.wait();
    let _ = js.delete_stream(&stream).await;
    if let Some(store) = db.tables().postgres() {
        let (pool, schema) = (store.pool(), db.schema());
        for s in [schema.tables().as_str(), schema.queue().as_str()] {
            let _ = sqlx::raw_sql(&format!("DROP SCHEMA {s} CASCADE"))
                .execute(pool)
                .await;
        }
    }
}
