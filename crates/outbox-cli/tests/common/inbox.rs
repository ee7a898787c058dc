//! Helpers of the `outbox inbox` tests (`inbox.rs`, `inbox_<broker>.rs`; included with
//! `#[path]`): a migrated inbox in a schema of its own, the daemon as a process, and the check
//! that every published message is in the inbox and its queue exactly once, in key order.

#![allow(dead_code, clippy::unwrap_used)] // each test binary uses a different subset

use std::collections::{HashMap, HashSet};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sqlx::PgPool;
use uuid::Uuid;

/// A published test message: id, key, and `n`, its payload `{"n": n}`.
pub type Published = (Uuid, String, i64);

/// The message type every test publisher sets (`outbox-event-type`).
pub const MESSAGE_TYPE: &str = "order.paid";

fn outbox() -> Command {
    crate::common::outbox_command(&std::env::temp_dir())
}

/// A migrated inbox (through `outbox migrate --inbox`) in a schema of its own.
pub struct Inbox {
    pub pool: PgPool,
    pub schema: String,
}

impl Inbox {
    pub async fn new() -> Self {
        let schema = outbox_testkit::unique_name("ibx");
        let o = outbox()
            .args([
                "migrate",
                "--inbox",
                "--database-url",
                &crate::common::database_url(),
                "--schema",
                &schema,
            ])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        assert!(String::from_utf8_lossy(&o.stdout).contains("applied migrations [1]"));
        let pool = outbox_postgres::connect_pool(&crate::common::database_url(), 4)
            .await
            .unwrap();
        Self { pool, schema }
    }

    /// `outbox inbox` into this inbox from `source`, `batch` messages per batch, polling every
    /// 20 ms; standard output discarded.
    pub fn command(&self, source: &str, batch: usize) -> Command {
        let mut c = outbox();
        c.args([
            "inbox",
            "--database-url",
            &crate::common::database_url(),
            "--schema",
            &self.schema,
            "--batch-size",
            &batch.to_string(),
            "--poll-interval",
            "20ms",
        ])
        .env("OUTBOX_INBOX_SOURCE", source)
        .stdout(Stdio::null());
        c
    }

    /// The daemon running, its log on the test's standard error.
    pub fn daemon(&self, source: &str, batch: usize) -> Child {
        self.command(source, batch)
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap()
    }

    pub async fn count(&self) -> i64 {
        sqlx::query_scalar(&format!(
            "SELECT count(*) FROM {}.inbox_messages",
            self.schema
        ))
        .fetch_one(&self.pool)
        .await
        .unwrap()
    }

    pub async fn wait_count(&self, n: i64, limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            let got = self.count().await;
            if got >= n {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{got} of {n} messages in the inbox after {limit:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Every published message exactly once in the inbox and once in its queue, with its key,
    /// type and payload, and each key's values in publish order in both.
    pub async fn check(&self, published: &[Published]) {
        self.check_with(published, true).await;
    }

    /// [`Inbox::check`] without the order (a source that keeps none, like an SQS standard
    /// queue).
    pub async fn check_unordered(&self, published: &[Published]) {
        self.check_with(published, false).await;
    }

    async fn check_with(&self, published: &[Published], ordered: bool) {
        let rows: Vec<(Uuid, String, String, serde_json::Value)> = sqlx::query_as(&format!(
            "SELECT id, type, key, payload FROM {}.inbox_messages ORDER BY seq",
            self.schema
        ))
        .fetch_all(&self.pool)
        .await
        .unwrap();
        assert_eq!(rows.len(), published.len());
        let want: HashMap<Uuid, (&String, i64)> =
            published.iter().map(|(id, k, n)| (*id, (k, *n))).collect();
        let mut seen = HashSet::new();
        let mut last: HashMap<String, i64> = HashMap::new();
        for (id, message_type, key, payload) in &rows {
            assert!(seen.insert(*id), "{id} twice");
            let (k, n) = want
                .get(id)
                .copied()
                .unwrap_or_else(|| panic!("unknown id {id}"));
            assert_eq!(message_type, MESSAGE_TYPE);
            assert_eq!(k, key);
            assert_eq!(payload["n"].as_i64(), Some(n));
            let prev = last.insert(key.clone(), n);
            if ordered {
                assert!(
                    prev.is_none_or(|p| p < n),
                    "key {key}: {n} recorded after {prev:?}"
                );
            }
        }
        let (queued, distinct): (i64, i64) = sqlx::query_as(&format!(
            "SELECT count(*), count(DISTINCT id) FROM {}_inbox.outbox",
            self.schema
        ))
        .fetch_one(&self.pool)
        .await
        .unwrap();
        assert_eq!(
            (queued, distinct),
            (published.len() as i64, published.len() as i64),
            "queued once each"
        );
        if !ordered {
            return;
        }
        let queue_order: Vec<(String, serde_json::Value)> = sqlx::query_as(&format!(
            "SELECT aggregate_id, payload FROM {}_inbox.outbox ORDER BY seq",
            self.schema
        ))
        .fetch_all(&self.pool)
        .await
        .unwrap();
        let mut last: HashMap<String, i64> = HashMap::new();
        for (key, payload) in queue_order {
            let n = payload["n"].as_i64().unwrap();
            let prev = last.insert(key.clone(), n);
            assert!(
                prev.is_none_or(|p| p < n),
                "queue: key {key}: {n} after {prev:?}"
            );
        }
    }

    pub async fn drop_all(self) {
        let _ = sqlx::raw_sql(&format!(
            "DROP SCHEMA IF EXISTS {0} CASCADE; DROP SCHEMA IF EXISTS {0}_inbox CASCADE",
            self.schema
        ))
        .execute(&self.pool)
        .await;
    }
}

/// `per_key` messages for each of `keys` keys (`k0`, `k1`, …), interleaved; `n` counts from
/// `first`.
pub fn workload(keys: usize, per_key: usize, first: i64) -> Vec<Published> {
    let mut out = Vec::new();
    for n in 0..per_key {
        for k in 0..keys {
            out.push((Uuid::now_v7(), format!("k{k}"), first + n as i64));
        }
    }
    out
}

/// `msgs` cut, in order, into publish calls holding each key at most once (and at most ten
/// messages): like the relay, which has one message of a key in flight at a time. (A sink
/// sends a call's messages concurrently, so two of one key in one call could swap.)
pub fn calls(msgs: &[Published]) -> Vec<&[Published]> {
    let mut out = Vec::new();
    let mut start = 0;
    for i in 0..msgs.len() {
        let repeats = msgs[start..i].iter().any(|m| m.1 == msgs[i].1);
        if repeats || i - start == 10 {
            out.push(&msgs[start..i]);
            start = i;
        }
    }
    if start < msgs.len() {
        out.push(&msgs[start..]);
    }
    out
}
