//! Shared helpers for the integration tests: real PostgreSQL and NATS on this machine, a
//! schema and a stream with a random suffix per test, an independent consumer.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use futures::StreamExt;
use outbox_core::{DestinationTemplate, Store};
use outbox_postgres::{connect_pool, migrate, PgStore, Schema};
use outbox_relay::RelayConfig;
use sqlx::PgPool;

// The testkit's harness, under the names the tests have used.
pub use outbox_testkit::process::{sigterm, wait_exit, Signal};
pub use outbox_testkit::relay::{assert_key_order, interleaved, keys, wait_state};

pub fn database_url() -> String {
    std::env::var("OUTBOX_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://root@127.0.0.1:5432/test".into())
}

pub fn nats_url() -> String {
    std::env::var("OUTBOX_TEST_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into())
}

/// One test's world: a migrated schema and a JetStream stream capturing `<prefix>.>`.
pub struct World {
    pub pool: PgPool,
    pub schema: Schema,
    pub js: jetstream::Context,
    pub stream: String,
    pub prefix: String,
}

impl World {
    pub async fn new() -> Self {
        Self::with_stream(true).await
    }

    pub async fn with_stream(create_stream: bool) -> Self {
        let name = outbox_testkit::unique_name("t");
        let pool = connect_pool(&database_url(), 8)
            .await
            .expect("PostgreSQL must be running");
        let schema = Schema::new(&name).unwrap();
        migrate(&pool, &schema).await.unwrap();
        let client = async_nats::connect(nats_url())
            .await
            .expect("NATS must be running");
        let js = jetstream::new(client);
        let stream = name.to_uppercase();
        if create_stream {
            outbox_sinks::nats::create_stream(&js, &stream, vec![format!("{name}.>")], false)
                .await
                .unwrap();
        }
        Self {
            pool,
            schema,
            js,
            stream,
            prefix: name,
        }
    }

    pub fn store(&self) -> PgStore {
        PgStore::new(self.pool.clone(), self.schema.clone())
    }

    pub fn dyn_store(&self) -> Arc<dyn Store> {
        Arc::new(self.store())
    }

    /// Template that routes everything of this test into its stream.
    pub fn destination(&self) -> String {
        format!("{}.{{aggregate_type}}.{{event_type}}", self.prefix)
    }

    /// A relay config for tests: fast polls, short backoff, this test's destination.
    pub fn relay_config(&self) -> RelayConfig {
        RelayConfig {
            batch_size: 500,
            workers: 2,
            poll_interval: Duration::from_millis(100),
            destination: DestinationTemplate::parse(&self.destination()).unwrap(),
            retry: outbox_core::RetryPolicy {
                max_attempts: 10,
                base: Duration::from_millis(20),
                max: Duration::from_millis(200),
            },
            lease: Duration::from_secs(3),
            member_prefix: "test".into(),
            ..RelayConfig::default()
        }
    }

    /// [`World::relay_config`] routing every row to `destination` (a template).
    pub fn relay_config_to(&self, destination: &str) -> RelayConfig {
        RelayConfig {
            destination: DestinationTemplate::parse(destination).unwrap(),
            ..self.relay_config()
        }
    }

    pub async fn stats(&self) -> outbox_core::Stats {
        self.store().stats().await.unwrap()
    }

    /// Waits until nothing is pending (or panics after `limit`).
    pub async fn wait_drained(&self, limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            let s = self.stats().await;
            if s.pending == 0 {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "not drained after {limit:?}: {s:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub async fn stream_count(&self) -> u64 {
        self.js
            .get_stream(&self.stream)
            .await
            .unwrap()
            .info()
            .await
            .unwrap()
            .state
            .messages
    }

    /// Reads the whole stream with an independent consumer, in stream order.
    pub async fn read_all(
        &self,
        expected: usize,
        limit: Duration,
    ) -> Vec<async_nats::jetstream::Message> {
        let stream = self.js.get_stream(&self.stream).await.unwrap();
        let consumer: jetstream::consumer::PullConsumer = stream
            .create_consumer(jetstream::consumer::pull::Config {
                ack_policy: jetstream::consumer::AckPolicy::None,
                deliver_policy: jetstream::consumer::DeliverPolicy::All,
                ..Default::default()
            })
            .await
            .unwrap();
        let mut msgs = consumer.messages().await.unwrap();
        let mut out = Vec::with_capacity(expected);
        let deadline = Instant::now() + limit;
        while out.len() < expected && Instant::now() < deadline {
            match tokio::time::timeout(Duration::from_millis(500), msgs.next()).await {
                Ok(Some(Ok(m))) => out.push(m),
                // A missed heartbeat under load is reported and the stream goes on.
                Ok(Some(Err(_))) => {}
                Ok(None) => break,
                Err(_) => {}
            }
        }
        // Anything beyond `expected` would be a duplicate: give it a moment to show up.
        while let Ok(Some(Ok(m))) =
            tokio::time::timeout(Duration::from_millis(300), msgs.next()).await
        {
            out.push(m);
        }
        out
    }

    pub async fn drop_all(self) {
        let _ = sqlx::raw_sql(&self.schema.render("DROP SCHEMA {schema} CASCADE"))
            .execute(&self.pool)
            .await;
        let _ = self.js.delete_stream(&self.stream).await;
    }
}

pub fn header(m: &async_nats::jetstream::Message, name: &str) -> Option<String> {
    m.headers
        .as_ref()
        .and_then(|h| h.get(name))
        .map(|v| v.as_str().to_string())
}

pub fn payload_json(m: &async_nats::jetstream::Message) -> serde_json::Value {
    serde_json::from_slice(&m.payload).unwrap()
}

/// A NATS sink for `url` that waits 500 ms for an acknowledgement (inside the publish deadline
/// of [`World::relay_config`]'s 3 s lease): for the tests that stop or restrict a private
/// server.
pub async fn nats_sink(url: &str) -> outbox_sinks::nats::NatsSink {
    let cfg = outbox_sinks::nats::NatsConfig::from_url(&format!("{url}?ack_timeout=500ms"));
    outbox_sinks::nats::NatsSink::connect(cfg.unwrap())
        .await
        .unwrap()
}

/// One `payment` / `p-42` / `created` message, payload `{"amount": 1000}`: for tests that look
/// at how one message travels.
pub fn payment() -> outbox_core::NewMessage {
    outbox_core::NewMessage::new(
        "payment",
        "p-42",
        "created",
        serde_json::json!({"amount": 1000}),
    )
}

/// Path of the `outbox` binary built for these tests; `OUTBOX_TEST_BIN` names another (an
/// older build, to see a new test fail on the code it guards against).
pub fn outbox_bin() -> &'static str {
    static BIN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    BIN.get_or_init(|| {
        std::env::var("OUTBOX_TEST_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_outbox").into())
    })
}

/// (message id, key, `n` from the payload) of each received message, in arrival order.
pub fn deliveries(msgs: &[async_nats::jetstream::Message]) -> Vec<(String, String, u64)> {
    msgs.iter()
        .map(|m| {
            (
                header(m, "outbox-message-id").unwrap(),
                header(m, "outbox-aggregate-id").unwrap(),
                payload_json(m)["n"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// The `outbox` binary run in `cwd`, with no configuration leaking in from the caller's
/// environment (tests pass everything as flags), quiet logs and no stdin.
pub fn outbox_command(cwd: &std::path::Path) -> std::process::Command {
    let mut c = std::process::Command::new(outbox_bin());
    for var in [
        "DATABASE_URL",
        "OUTBOX_DATABASE_URL",
        "OUTBOX_SCHEMA",
        "OUTBOX_SINK",
        "OUTBOX_CONFIG",
        "OUTBOX_BATCH_SIZE",
        "OUTBOX_WORKERS",
        "OUTBOX_ALLOW_DESTINATIONS",
        "OUTBOX_BATCH_BYTES",
        "OUTBOX_STORE_TIMEOUT",
        "OUTBOX_INBOX_SOURCE",
        "OUTBOX_INBOX_BATCH_SIZE",
        "OUTBOX_INBOX_POLL_INTERVAL",
        "OUTBOX_INBOX_RETENTION",
        "OUTBOX_OTLP_ENDPOINT",
        "OUTBOX_CONSOLE_TOKEN",
    ] {
        c.env_remove(var);
    }
    c.env("OUTBOX_LOG", "warn")
        .current_dir(cwd)
        .stdin(std::process::Stdio::null());
    c
}

/// A nats-server of this test's own with JetStream (the testkit's
/// [`outbox_testkit::brokers::nats`]), under the names the inbox and routing tests use.
pub struct PrivateNats(outbox_testkit::process::PrivateServer);

impl PrivateNats {
    pub fn start() -> Self {
        Self(outbox_testkit::brokers::nats())
    }

    pub fn up(&mut self) {
        self.0.start();
    }

    /// Kills the server (SIGKILL).
    pub fn down(&mut self) {
        self.0.stop();
    }

    pub fn url(&self) -> String {
        self.0.url()
    }

    /// Sends `sig` (`-STOP`, `-CONT`) to the server while it runs.
    pub fn signal(&self, sig: &str) {
        self.0.signal(match sig {
            "-STOP" => Signal::Stop,
            "-CONT" => Signal::Cont,
            "-TERM" => Signal::Term,
            _ => Signal::Kill,
        });
    }
}
