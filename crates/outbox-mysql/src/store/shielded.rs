//! [`MysqlStore`]: the relay's store on MySQL/MariaDB, whose every call runs to its end on a
//! task of its own, so that a caller dropping it mid-way cannot leave a connection broken.
//!
//! The relay drops a store call that outlives its deadline. With sqlx's MySQL driver a future
//! dropped mid-statement leaves its connection out of step with the server: one dropped
//! between sending `BEGIN` and counting the transaction returns to the pool inside a
//! transaction nobody ends (every later statement on it runs there, uncommitted, holding its
//! locks, so a `DROP DATABASE` or a maintenance `ALTER TABLE` waits for them for good), and one
//! dropped mid-exchange can keep its pool slot for good. Here the caller that gives up only
//! stops waiting: the work finishes (or fails) on its task, commits or rolls back, and gives
//! its connection back. Its result is then dropped, which every call allows: a `complete`
//! made again finds its batch recorded (the fence moved), a claim's batch is handed out again
//! by the next claim.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use outbox_core::{
    ClaimLimits, Error, ErrorKind, FailedMessage, Maintenance, MemberId, Message, NewMessage,
    OnFailed, Outcome, RedriveScope, Result, Stats, Store,
};
use sqlx::MySqlPool;
use tokio::sync::watch;

use super::Engine;
use crate::schema::Schema;

/// The relay's store on MySQL 8.0.29+ / MariaDB 10.6+ (see the module docs for why each call
/// runs on a task of its own).
#[derive(Debug, Clone)]
pub struct MysqlStore {
    engine: Arc<Engine>,
}

impl MysqlStore {
    /// A store over `pool` (see [`crate::connect_pool`]) for the outbox in database `schema`.
    pub fn new(pool: MySqlPool, schema: Schema) -> Self {
        Self {
            engine: Arc::new(Engine::new(pool, schema)),
        }
    }

    /// The store on the binlog route (`outbox migrate --binlog`): messages are read with the
    /// positions the sequencer gives them, and the store runs the sequencer, reading the
    /// binlog through `url`, while it relays (from its first rebalance, claim or insert; one
    /// sequencer per outbox holds the lease at a time). See docs/engine-mysql.md.
    pub fn binlog(pool: MySqlPool, schema: Schema, url: &str) -> Result<Self> {
        Ok(Self {
            engine: Arc::new(Engine::binlog(pool, schema, url)?),
        })
    }

    /// On the binlog route, the sequencer (`None` on the trigger's).
    pub fn sequencer(&self) -> Option<&crate::binlog::sequencer::Sequencer> {
        self.engine.sequencer()
    }

    /// The pool.
    pub fn pool(&self) -> &MySqlPool {
        self.engine.pool()
    }

    /// The database that holds the outbox.
    pub fn schema(&self) -> &Schema {
        self.engine.schema()
    }

    /// Runs `call` on the engine, on a task of its own, and waits for it.
    async fn run<T, F, Fut>(&self, call: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(Arc<Engine>) -> Fut,
        Fut: Future<Output = Result<T>> + Send + 'static,
    {
        match tokio::spawn(call(self.engine.clone())).await {
            Ok(done) => done,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(e) => Err(Error::new(
                ErrorKind::Other,
                format!("a MySQL store call was cancelled: {e}"),
            )),
        }
    }
}

#[async_trait]
impl Store for MysqlStore {
    async fn join(&self, member: &MemberId) -> Result<()> {
        let member = member.clone();
        self.run(|e| async move { e.join(&member).await }).await
    }

    async fn rebalance(&self, member: &MemberId, lease: Duration) -> Result<Vec<i32>> {
        let member = member.clone();
        self.run(|e| async move { e.rebalance(&member, lease).await })
            .await
    }

    async fn renew(&self, member: &MemberId, lease: Duration) -> Result<usize> {
        let member = member.clone();
        self.run(|e| async move { e.renew(&member, lease).await })
            .await
    }

    async fn claim(
        &self,
        member: &MemberId,
        partitions: &[i32],
        limits: ClaimLimits,
        on_failed: OnFailed,
    ) -> Result<Vec<Message>> {
        let (member, partitions) = (member.clone(), partitions.to_vec());
        self.run(|e| async move { e.claim(&member, &partitions, limits, on_failed).await })
            .await
    }

    async fn complete(&self, member: &MemberId, outcomes: &[Outcome]) -> Result<u64> {
        let (member, outcomes) = (member.clone(), outcomes.to_vec());
        self.run(|e| async move { e.complete(&member, &outcomes).await })
            .await
    }

    async fn report_health(
        &self,
        member: &MemberId,
        circuit: &str,
        sink_error: Option<&str>,
    ) -> Result<()> {
        let (member, circuit) = (member.clone(), circuit.to_string());
        let sink_error = sink_error.map(str::to_string);
        self.run(|e| async move {
            e.report_health(&member, &circuit, sink_error.as_deref())
                .await
        })
        .await
    }

    async fn release(&self, member: &MemberId) -> Result<()> {
        let member = member.clone();
        self.run(|e| async move { e.release(&member).await }).await
    }

    /// Runs until an error, reading no connection: not on a task of its own.
    async fn listen(&self, wake: watch::Sender<u64>) -> Result<()> {
        self.engine.listen(wake).await
    }

    async fn stats(&self) -> Result<Stats> {
        self.run(|e| async move { e.stats().await }).await
    }

    async fn gauges(&self) -> Result<outbox_core::Gauges> {
        self.run(|e| async move { e.gauges().await }).await
    }

    async fn ping(&self) -> Result<()> {
        self.run(|e| async move { e.ping().await }).await
    }

    async fn status_detail(&self) -> Result<outbox_core::status::StatusDetail> {
        self.run(|e| async move { e.status_detail().await }).await
    }

    async fn pending_by_type(&self, cap: i64) -> Result<Vec<outbox_core::status::PendingCell>> {
        self.run(|e| async move { e.pending_by_type(cap).await })
            .await
    }

    async fn maintain(&self, retention: Duration) -> Result<Maintenance> {
        self.run(|e| async move { e.maintain(retention).await })
            .await
    }

    async fn failed(&self, limit: usize) -> Result<Vec<FailedMessage>> {
        self.run(|e| async move { e.failed(limit).await }).await
    }

    async fn failed_matching(
        &self,
        filter: &outbox_core::FailedFilter,
        after: Option<i64>,
        limit: usize,
    ) -> Result<outbox_core::FailedPage> {
        let filter = filter.clone();
        self.run(|e| async move { e.failed_matching(&filter, after, limit).await })
            .await
    }

    async fn redrive(&self, scope: &RedriveScope, reason: &str) -> Result<u64> {
        let (scope, reason) = (scope.clone(), reason.to_string());
        self.run(|e| async move { e.redrive(&scope, &reason).await })
            .await
    }

    async fn insert(&self, messages: &[NewMessage]) -> Result<()> {
        let messages = messages.to_vec();
        self.run(|e| async move { e.insert(&messages).await }).await
    }
}
