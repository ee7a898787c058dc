//! The synchronous-standby gate: CDC mode publishes a commit only once the synchronous standby
//! has it.
//!
//! The WAL sender decodes a transaction as soon as its commit is flushed *locally*, before a
//! synchronous standby acknowledged it: the writer is still waiting for that acknowledgement when
//! its message can already be published, and if the primary dies then, the promoted standby
//! never had the transaction: a phantom. (Polling cannot do this: a row becomes visible only
//! after the wait ends.) So while `synchronous_standby_names` names a standby, the relay holds
//! back every transaction until a *barrier* of its own covers it: a tiny transaction (one
//! logical message of the group's barrier prefix, no table) whose commit, like any writer's,
//! returns only once the synchronous standby flushed it. WAL is flushed in order, so every
//! commit before the barrier's message is then on the standby. One barrier covers everything
//! committed before it, so at a thousand commits a second the relay runs a barrier every few
//! milliseconds, not one per commit, and the price is about one standby round trip of latency.
//!
//! The barrier runs on a connection of the gate's own with no statement timeout: PostgreSQL
//! turns a cancelled wait for the standby into a successful commit (with a warning), which the
//! gate would take for the standby's acknowledgement. For the same reason an operator who
//! cancels the barrier's backend by hand may let one batch through early.

use std::sync::Arc;
use std::time::Duration;

use outbox_core::Result;
use sqlx::{ConnectOptions as _, Connection as _, PgConnection};
use tokio::sync::watch;

use crate::cdc::setup::CdcNames;

/// How often the gate reads `synchronous_standby_names` again (a standby named later starts
/// gating within this).
const RECHECK: Duration = Duration::from_secs(10);

/// How long after a failed barrier or connection the gate tries again.
const RETRY: Duration = Duration::from_millis(500);

/// Where the gate stands: every commit record that starts before `synced` is on the
/// synchronous standby (or no standby is named: then every position is).
#[derive(Clone)]
pub struct Gate {
    synced: watch::Receiver<u64>,
    want: Arc<watch::Sender<u64>>,
}

impl Gate {
    /// A gate that lets everything through: no synchronous standby to wait for.
    pub fn open() -> Self {
        let (_, synced) = watch::channel(u64::MAX);
        Self {
            synced,
            want: Arc::new(watch::channel(0).0),
        }
    }

    /// Starts the gate's task for `names`' group. It connects as `pool` does, to the server the
    /// pool uses at each (re)connection, so it follows the primary after a failover; it ends
    /// when every clone of the gate is dropped.
    pub fn start(pool: sqlx::PgPool, names: &CdcNames) -> Self {
        let (synced_tx, synced) = watch::channel(0u64);
        let want = Arc::new(watch::channel(0u64).0);
        let prefix = format!("outbox-sync:{}", names.slot);
        tokio::spawn(run(pool, prefix, want.subscribe(), synced_tx));
        Self { synced, want }
    }

    /// Whether a transaction whose commit record starts at `final_lsn` may be published now;
    /// when not, asks for a barrier that covers it (the doorbell `wake` rings once it has).
    pub fn passes(&self, final_lsn: u64) -> bool {
        if final_lsn < *self.synced.borrow() {
            return true;
        }
        self.want.send_if_modified(|w| {
            let more = final_lsn >= *w;
            if more {
                *w = final_lsn + 1;
            }
            more
        });
        false
    }

    /// Waits until the gate moves (for the relay's wake-up).
    pub async fn moved(&mut self) {
        let _ = self.synced.changed().await;
    }
}

/// The gate's task: every [`RECHECK`] it reads the setting. With no standby named the gate is
/// open (every position passes); with one named, it runs a barrier whenever the relay waits for
/// a position the last barrier did not cover.
async fn run(
    pool: sqlx::PgPool,
    prefix: String,
    mut want: watch::Receiver<u64>,
    synced: watch::Sender<u64>,
) {
    let mut conn: Option<PgConnection> = None;
    loop {
        if synced.is_closed() {
            return;
        }
        let c = match conn.as_mut() {
            Some(c) => c,
            None => match connect(&pool).await {
                Ok(c) => conn.insert(c),
                Err(error) => {
                    tracing::warn!(%error, "CDC synchronous-standby gate: cannot connect; will retry");
                    tokio::time::sleep(RETRY).await;
                    continue;
                }
            },
        };
        match standby_named(c).await {
            Ok(false) => {
                synced.send_if_modified(|s| std::mem::replace(s, u64::MAX) != u64::MAX);
                tokio::select! {
                    _ = tokio::time::sleep(RECHECK) => {}
                    _ = synced.closed() => return,
                }
                continue;
            }
            Ok(true) => {}
            Err(error) => {
                tracing::warn!(%error, "CDC synchronous-standby gate: cannot read the setting; will retry");
                conn = None;
                tokio::time::sleep(RETRY).await;
                continue;
            }
        }
        // A standby is named: nothing passes that a barrier has not covered.
        synced.send_if_modified(|s| {
            let open = *s == u64::MAX;
            if open {
                *s = 0;
            }
            open
        });
        let until = tokio::time::Instant::now() + RECHECK;
        loop {
            let wanted = *want.borrow_and_update();
            if wanted > *synced.borrow() {
                match barrier(c, &prefix).await {
                    Ok(covered) => {
                        synced.send_if_modified(|s| {
                            let moved = covered > *s;
                            *s = (*s).max(covered);
                            moved
                        });
                    }
                    Err(error) => {
                        tracing::warn!(%error, "CDC synchronous-standby gate: the barrier failed; will retry");
                        conn = None;
                        tokio::time::sleep(RETRY).await;
                        break;
                    }
                }
                continue;
            }
            tokio::select! {
                changed = want.changed() => if changed.is_err() { return },
                _ = tokio::time::sleep_until(until) => break,
                _ = synced.closed() => return,
            }
        }
    }
}

/// A connection of the gate's own to the server `pool` uses now (the primary), with no
/// statement timeout (see the module documentation), refused when that server is a standby.
async fn connect(pool: &sqlx::PgPool) -> std::result::Result<PgConnection, sqlx::Error> {
    let options = (*pool.connect_options())
        .clone()
        .options([("statement_timeout", "0")]);
    let mut conn = options.connect().await?;
    let standby: bool = sqlx::query_scalar(include_str!("../../queries/in_recovery.sql"))
        .fetch_one(&mut conn)
        .await?;
    if standby {
        let _ = conn.close().await;
        return Err(sqlx::Error::Protocol(
            "the server is a standby; waiting for the primary".into(),
        ));
    }
    Ok(conn)
}

/// Whether `synchronous_standby_names` names any standby.
async fn standby_named(conn: &mut PgConnection) -> std::result::Result<bool, sqlx::Error> {
    let setting: String =
        sqlx::query_scalar(include_str!("../../queries/synchronous_standby_names.sql"))
            .fetch_one(&mut *conn)
            .await?;
    Ok(!crate::cdc::checks::standby_names(&setting).is_empty())
}

/// One barrier: returns the position of its message; every commit record before it is on the
/// synchronous standby once this returns.
async fn barrier(conn: &mut PgConnection, prefix: &str) -> std::result::Result<u64, sqlx::Error> {
    let mut tx = conn.begin().await?;
    sqlx::query(include_str!("../../queries/no_statement_timeout.sql"))
        .execute(&mut *tx)
        .await?;
    sqlx::query(include_str!("../../queries/synchronous_commit_on.sql"))
        .execute(&mut *tx)
        .await?;
    let at: String = sqlx::query_scalar(include_str!("../../queries/cdc_sync_barrier.sql"))
        .bind(prefix)
        .fetch_one(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(crate::cdc::store::parse_lsn(&at).unwrap_or(0))
}

/// Whether the gate's work is needed at all at start: `synchronous_standby_names` names a
/// standby (checked again by the gate itself every [`RECHECK`]).
pub async fn needed(pool: &sqlx::PgPool, names: &CdcNames) -> Result<bool> {
    crate::cdc::checks::check_synchronous_standbys(pool, names).await
}
