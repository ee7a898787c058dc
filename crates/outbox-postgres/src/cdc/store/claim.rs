//! A claim in CDC mode: due heads of held keys, redriven rows of `outbox_parked`, then the
//! stream; the parked table's keys and rows as a claim reads them.

use super::*;

impl CdcStore {
    /// [`Store::claim`] on the stream: what was handed out and never answered goes back first;
    /// then due heads of held keys, redriven parked rows, and the stream, within the limits.
    pub(super) async fn claim_stream(
        &self,
        limits: ClaimLimits,
        on_failed: OnFailed,
    ) -> Result<Vec<Message>> {
        let mut s = self.state.lock().await;
        s.on_failed = on_failed;
        if std::mem::take(&mut s.writing) {
            s.stream = None;
        }
        // Handed out by a claim whose answer never reached the worker (it failed after handing
        // out, or was dropped): back to their keys' queues, in order, before anything new.
        let leftover = s.drain_inflight();
        s.requeue(leftover);
        self.connect(&mut s).await?;
        let mut batch = Batch::new(limits);
        // Due heads of held keys first: they are older than anything the stream still has.
        let now = Instant::now();
        s.take_due(now, on_failed, &mut batch);
        let stuck = s.stuck_to_park(now, self.park_after);
        batch.to_park.extend(stuck);
        // Written before the parked rows are read again below, which resets the parked keys
        // from the table.
        self.park_now(&mut s, std::mem::take(&mut batch.to_park))
            .await?;
        // Redriven parked rows, only while `outbox_parked` has rows.
        if s.next_parked_poll.is_some_and(|t| t <= now) && batch.out.len() < limits.rows {
            let room = limits.rows - batch.out.len();
            s.writing = true;
            let rows = self.parked_due(&mut s, room).await?;
            for h in rows {
                if !batch.fits(&h.message) {
                    break;
                }
                batch.bytes += h.message.payload.len();
                s.hand_out(h, &mut batch.out);
            }
            self.refresh_parked_keys(&mut s).await?;
            s.writing = false;
        }
        // Then the stream (see `State::take_stream`).
        let (ended, gated) = s.take_stream(&self.gate, now, on_failed, &mut batch);
        let Batch { out, to_park, .. } = batch;
        self.park_now(&mut s, to_park).await?;
        if let Some(e) = ended {
            warn!(error = %e, "CDC stream ended; reconnecting from the confirmed position");
            s.stream = None;
            if out.is_empty() {
                return Err(e);
            }
        }
        self.save_soon(&mut s);
        let more = !gated && s.stream.as_ref().is_some_and(|st| !st.items.is_empty());
        self.more.store(more, Ordering::Relaxed);
        Ok(out)
    }

    pub(super) async fn refresh_parked_keys(&self, s: &mut State) -> Result<()> {
        // Under block a failed row holds its key; under skip only rows still to publish do.
        // The table is read again while it holds any row, failed ones included: a redrive
        // turns one back to `retrying` from another process, under either policy.
        let rows: Vec<(Option<String>, i64)> = sqlx::query_as(
            &self
                .names
                .schema
                .render(include_str!("../../../queries/cdc_parked_keys.sql")),
        )
        .bind(s.on_failed == OnFailed::Block)
        .fetch_all(&self.pool)
        .await
        .map_err(|e| map_sqlx_error("reading the parked keys", e))?;
        let any = rows.first().is_some_and(|(_, n)| *n > 0);
        s.parked_keys = rows.into_iter().filter_map(|(k, _)| k).collect();
        s.next_parked_poll = any.then(|| Instant::now() + PARKED_POLL);
        Ok(())
    }

    /// Redriven parked rows of keys the store does not hold, in key order.
    pub(super) async fn parked_due(&self, s: &mut State, room: usize) -> Result<Vec<Held>> {
        // Keys the relay holds (in flight, or waiting for a retry) are left out in SQL, so
        // they cannot fill the batch and starve the others.
        let busy: Vec<String> = s
            .inflight
            .values()
            .map(|h| h.message.aggregate_id.clone())
            .chain(s.held.keys().cloned())
            .collect::<HashSet<String>>()
            .into_iter()
            .collect();
        let rows: Vec<ParkedRow> = sqlx::query_as(&self.names.schema.render(PARKED_READ_SQL))
            .bind(i64::try_from(room).unwrap_or(i64::MAX))
            .bind(s.on_failed == OnFailed::Block)
            .bind(&busy)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| map_sqlx_error("reading redriven parked messages", e))?;
        let now = Instant::now();
        Ok(rows
            .into_iter()
            .map(|r| Held {
                origin: Origin::Parked {
                    partition: r.partition,
                    seq: r.seq,
                },
                message: Message {
                    seq: 0,
                    id: r.id,
                    aggregate_type: r.aggregate_type,
                    aggregate_id: r.aggregate_id,
                    event_type: r.event_type,
                    payload: Bytes::from(r.payload),
                    headers: r.headers,
                    topic: r.topic,
                    created_at: r.created_at,
                    attempts: r.attempts,
                },
                due: now,
                taken: now,
                order: 0,
                malformed: None,
                row_seq: None,
            })
            .collect())
    }
}

#[derive(sqlx::FromRow)]
pub(super) struct ParkedRow {
    partition: i16,
    seq: i64,
    id: uuid::Uuid,
    aggregate_type: String,
    aggregate_id: String,
    event_type: String,
    payload: String,
    headers: String,
    topic: Option<String>,
    created_at: chrono::DateTime<chrono::Utc>,
    attempts: i32,
}
