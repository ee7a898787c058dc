//! Completing a batch: the fenced, compare-and-append statement that records its outcomes
//! (`record.sql`), cancelled on the server when its call is abandoned, and the guards that give
//! a taken ticket back.

use super::*;

/// Puts a taken ticket back for its member when dropped armed: on an error, or when the call
/// that holds it is abandoned.
pub(super) struct TicketGuard<'a> {
    pub(super) store: &'a PgStore,
    pub(super) member: &'a MemberId,
    pub(super) ticket: Option<Ticket>,
}

impl TicketGuard<'_> {
    /// The batch is recorded: nothing to put back.
    pub(super) fn disarm(mut self) {
        self.ticket = None;
    }
}

impl Drop for TicketGuard<'_> {
    fn drop(&mut self) {
        if let Some(ticket) = self.ticket.take() {
            self.store.state(self.member, |s| {
                // A newer claim's ticket wins: this batch is then handed out again.
                if s.ticket.is_none() {
                    s.ticket = Some(ticket);
                }
            });
        }
    }
}

/// A record computed but not written (see [`PgStore::hold_completion`]).
#[doc(hidden)]
pub struct HeldCompletion {
    pub(super) member: MemberId,
    pub(super) plan: Plan,
}

/// A statement's connection that, when dropped before [`finished`](Self::finished) (the call
/// running the statement was abandoned), cancels the statement on the server and closes the
/// connection instead of returning it to the pool. Detached first, so the cancel can never hit
/// another statement run on a reused connection.
pub(super) struct CancelOnDrop {
    pub(super) pool: PgPool,
    pub(super) pid: i32,
    pub(super) conn: Option<sqlx::pool::PoolConnection<sqlx::Postgres>>,
}

impl CancelOnDrop {
    pub(super) fn conn(&mut self) -> &mut sqlx::PgConnection {
        // Present until `finished` or drop, which both take `self`'s last use.
        self.conn
            .as_deref_mut()
            .unwrap_or_else(|| unreachable!("the connection is taken only when finished"))
    }

    /// The statement ended (with a result or an error): the connection goes back to the pool.
    pub(super) fn finished(mut self) {
        self.conn = None;
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        let Some(conn) = self.conn.take() else { return };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (pool, pid) = (self.pool.clone(), self.pid);
        let conn = conn.detach();
        runtime.spawn(async move {
            let cancelled = sqlx::query(include_str!("../../queries/cancel_backend.sql"))
                .bind(pid)
                .execute(&pool)
                .await;
            if let Err(error) = cancelled {
                tracing::debug!(pid, %error, "could not cancel an abandoned statement");
            }
            drop(conn);
        });
    }
}

impl PgStore {
    /// What recording `member`'s pending batch with `outcomes` would write, computed now and
    /// written only by [`land_completion`](Self::land_completion), whenever the caller likes: a
    /// record
    /// abandoned at the store deadline that lands late, for tests of compare-and-append. The
    /// pending batch stays pending.
    #[doc(hidden)]
    pub fn hold_completion(
        &self,
        member: &MemberId,
        outcomes: &[Outcome],
    ) -> Option<HeldCompletion> {
        let plan = self.state(member, |s| {
            s.ticket.as_ref().map(|t| t.plan(outcomes, false))
        })?;
        Some(HeldCompletion {
            member: member.clone(),
            plan,
        })
    }

    /// Writes a [`hold_completion`](Self::hold_completion) now, as the record statement would have;
    /// returns the partitions whose position it appended, with their ids.
    #[doc(hidden)]
    pub async fn land_completion(&self, held: &HeldCompletion) -> Result<Vec<(i16, i64)>> {
        self.complete_plan(&held.member, &held.plan).await
    }

    /// Runs the fenced, compare-and-append record statement for `plan`; returns the partitions
    /// whose position was appended, with the new positions' ids.
    ///
    /// If this call is dropped while the statement runs (the relay's store deadline), the
    /// statement is cancelled on the server and its connection closed, never returned to the
    /// pool: an abandoned record should not keep running beside its retry. Should it commit
    /// anyway, compare-and-append makes it harmless (see `record.sql`).
    pub(super) async fn complete_plan(
        &self,
        member: &MemberId,
        plan: &Plan,
    ) -> Result<Vec<(i16, i64)>> {
        let err = |e| map_sqlx_error("recording publish results", e);
        let mut conn = self.pool.acquire().await.map_err(err)?;
        let pid: i32 = sqlx::query_scalar(include_str!("../../queries/backend_pid.sql"))
            .fetch_one(&mut *conn)
            .await
            .map_err(err)?;
        let mut running = CancelOnDrop {
            pool: self.pool.clone(),
            pid,
            conn: Some(conn),
        };
        let (fp, fe): (Vec<i16>, Vec<i64>) = plan.fence.iter().copied().unzip();
        let pos = &plan.positions;
        let park = &plan.park;
        let ret = &plan.retried;
        let appended = sqlx::query_as::<_, (i16, i64)>(&self.q.record)
            .bind(member.as_str())
            .bind(&fp)
            .bind(&fe)
            .bind(pos.iter().map(|p| p.partition).collect::<Vec<_>>())
            .bind(pos.iter().map(|p| p.epoch).collect::<Vec<_>>())
            .bind(pos.iter().map(|p| p.done.as_str()).collect::<Vec<_>>())
            .bind(
                pos.iter()
                    .map(|p| p.done_bound.as_deref())
                    .collect::<Vec<_>>(),
            )
            .bind(pos.iter().map(|p| p.done_floor).collect::<Vec<_>>())
            .bind(pos.iter().map(|p| p.done_at).collect::<Vec<_>>())
            .bind(pos.iter().map(|p| p.cur.as_deref()).collect::<Vec<_>>())
            .bind(
                pos.iter()
                    .map(|p| p.cur_bound.as_deref())
                    .collect::<Vec<_>>(),
            )
            .bind(pos.iter().map(|p| p.cur_floor).collect::<Vec<_>>())
            .bind(pos.iter().map(|p| p.cur_at).collect::<Vec<_>>())
            .bind(pos.iter().map(|p| p.cursor).collect::<Vec<_>>())
            .bind(pos.iter().map(|p| p.published).collect::<Vec<_>>())
            .bind(park.iter().map(|k| k.partition).collect::<Vec<_>>())
            .bind(park.iter().map(|k| k.txid.as_str()).collect::<Vec<_>>())
            .bind(park.iter().map(|k| k.seq).collect::<Vec<_>>())
            .bind(park.iter().map(|k| k.state).collect::<Vec<_>>())
            .bind(park.iter().map(|k| k.attempts).collect::<Vec<_>>())
            .bind(park.iter().map(|k| k.delay_secs).collect::<Vec<_>>())
            .bind(park.iter().map(|k| k.error.as_deref()).collect::<Vec<_>>())
            .bind(ret.iter().map(|r| r.partition).collect::<Vec<_>>())
            .bind(ret.iter().map(|r| r.seq).collect::<Vec<_>>())
            .bind(ret.iter().map(|r| r.outcome).collect::<Vec<_>>())
            .bind(ret.iter().map(|r| r.delay_secs).collect::<Vec<_>>())
            .bind(ret.iter().map(|r| r.error.as_deref()).collect::<Vec<_>>())
            .bind(pos.iter().map(|p| p.prev_id).collect::<Vec<_>>())
            .bind(pos.iter().map(|p| p.parked).collect::<Vec<_>>())
            .fetch_all(running.conn())
            .await
            .map_err(err);
        running.finished();
        appended
    }

    pub(super) fn remember_epochs(&self, member: &MemberId, owned: &[(i16, i64)]) {
        self.state(member, |s| s.epochs = owned.iter().copied().collect());
    }
}
