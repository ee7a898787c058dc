//! Completing in CDC mode: a batch's outcomes settled, the messages that cannot go on parked
//! in `outbox_parked` (in stream order, once each), the parked rows published or failed again
//! updated; and the checkpoints that move the polling positions behind the confirmed slot.

use super::*;

impl CdcStore {
    /// [`Store::complete`] on the stream: the outcomes settled in memory ([`State::settle`]),
    /// then what is to be parked written, and the parked rows published or failed again
    /// updated; the transactions so resolved are confirmed.
    pub(super) async fn complete_stream(&self, outcomes: &[Outcome]) -> Result<u64> {
        let mut s = self.state.lock().await;
        if std::mem::take(&mut s.writing) {
            // The last call was dropped mid-way: the stream is read again, and these outcomes
            // are of messages that come again (see `State::writing`).
            s.stream = None;
            return Ok(0);
        }
        let now = Instant::now();
        let Settled {
            changed,
            done_parked,
            failed_parked,
            to_park,
        } = s.settle(outcomes, now);
        // On an error `writing` stays set: what was to be parked is in the WAL only, and a
        // parked row published or failed again keeps its old state (it is published again,
        // never lost); the next call reads the stream again from the confirmed position.
        s.writing = true;
        let written = async {
            let origins = self.park(to_park).await?;
            if !done_parked.0.is_empty() {
                sqlx::query(&self.names.schema.render(PARKED_DONE_SQL))
                    .bind(&done_parked.0)
                    .bind(&done_parked.1)
                    .execute(&self.pool)
                    .await
                    .map_err(|e| map_sqlx_error("deleting published parked messages", e))?;
            }
            if !failed_parked.0.is_empty() {
                sqlx::query(&self.names.schema.render(PARKED_FAIL_SQL))
                    .bind(&failed_parked.0)
                    .bind(&failed_parked.1)
                    .bind(&failed_parked.2)
                    .bind(&failed_parked.3)
                    .execute(&self.pool)
                    .await
                    .map_err(|e| map_sqlx_error("marking parked messages failed", e))?;
            }
            Ok::<_, Error>(origins)
        }
        .await?;
        s.writing = false;
        // The parked table holds rows now (a failure under skip holds no key, and a redrive
        // from another process must still be read): it is looked at while it does.
        let parked_any = !written.is_empty() || !failed_parked.0.is_empty();
        for o in written {
            s.resolve(o);
        }
        if parked_any || !s.parked_keys.is_empty() {
            s.next_parked_poll.get_or_insert(now + PARKED_POLL);
        }
        s.advance();
        self.save_soon(&mut s);
        Ok(changed)
    }

    /// Writes `rows` into `outbox_parked` in stream order, once each (by id). Returns where
    /// each came from, to resolve once the write committed.
    pub(super) async fn park(&self, rows: Vec<ToPark>) -> Result<Vec<Origin>> {
        park_rows(&self.pool, &self.names, rows).await
    }

    /// Parks `to_park` (nothing to do when empty) and resolves them. On an error `writing`
    /// stays set: those messages are in the WAL only now, and the next call reads it again
    /// from the confirmed position rather than wait for them.
    pub(super) async fn park_now(&self, s: &mut State, to_park: Vec<ToPark>) -> Result<()> {
        if to_park.is_empty() {
            return Ok(());
        }
        s.writing = true;
        let origins = self.park(to_park).await?;
        s.writing = false;
        for o in origins {
            s.resolve(o);
        }
        s.next_parked_poll
            .get_or_insert(Instant::now() + PARKED_POLL);
        s.advance();
        Ok(())
    }

    /// Moves the polling positions to the last mark once the slot passed it, then takes the
    /// next mark: only when messages were handled since, so an idle relay sends nothing.
    pub(super) async fn checkpoint(&self) -> Result<()> {
        let (apply, take) = {
            let s = self.state.lock().await;
            let apply = s.mark.clone().filter(|m| s.confirmed >= m.lsn);
            let free = s.mark.is_none() || apply.is_some();
            (apply, free && s.handled_since_mark > 0)
        };
        if let Some(m) = apply {
            match self.slot_start().await? {
                Some(start) => {
                    let moved: Vec<i16> =
                        sqlx::query_scalar(&self.names.schema.render(CHECKPOINT_SQL))
                            .bind(&m.snapshot)
                            .bind(m.floor)
                            .bind(m.at)
                            .bind(&start)
                            .bind(&m.bound)
                            .fetch_all(&self.pool)
                            .await
                            .map_err(|e| map_sqlx_error("recording a CDC checkpoint", e))?;
                    tracing::debug!(partitions = moved.len(), "CDC checkpoint recorded");
                }
                None => warn!(
                    slot = %self.names.slot,
                    "where the CDC slot starts is not recorded: run `outbox migrate --cdc` once \
                     more, so the polling positions (status, retention, fallback) follow the relay"
                ),
            }
            self.state.lock().await.mark = None;
        }
        if take {
            use sqlx::Row as _;
            let r = sqlx::query(&self.names.schema.render(MARK_SQL))
                .fetch_one(&self.pool)
                .await
                .map_err(|e| map_sqlx_error("marking a CDC checkpoint", e))?;
            let err = |e| map_sqlx_error("marking a CDC checkpoint", e);
            let lsn: String = r.try_get("lsn").map_err(err)?;
            let mark = Mark {
                snapshot: r.try_get("snapshot").map_err(err)?,
                floor: r.try_get("floor").map_err(err)?,
                bound: r.try_get("bound").map_err(err)?,
                lsn: parse_lsn(&lsn).ok_or_else(|| {
                    Error::new(
                        ErrorKind::Database,
                        format!("the server's WAL position `{lsn}` is not an LSN"),
                    )
                })?,
                at: chrono::Utc::now(),
            };
            let mut s = self.state.lock().await;
            s.mark = Some(mark);
            s.handled_since_mark = 0;
        }
        Ok(())
    }
}

/// Writes `rows` into `outbox_parked` in stream order, once each (by id). Returns where each
/// came from, to resolve once the write committed.
pub(super) async fn park_rows(
    pool: &PgPool,
    names: &CdcNames,
    mut rows: Vec<ToPark>,
) -> Result<Vec<Origin>> {
    if rows.is_empty() {
        return Ok(Vec::new());
    }
    // A key's failure first, then what waits behind it.
    rows.sort_by_key(|r| r.held.order);
    let origins = rows.iter().map(|r| r.held.origin).collect();
    let mut cols = ParkColumns::with_capacity(rows.len());
    for r in rows {
        cols.push(r);
    }
    sqlx::query(&names.schema.render(PARK_SQL))
        .bind(&cols.keys)
        .bind(&cols.ids)
        .bind(&cols.types)
        .bind(&cols.events)
        .bind(&cols.payloads)
        .bind(&cols.headers)
        .bind(&cols.topics)
        .bind(&cols.created)
        .bind(&cols.states)
        .bind(&cols.attempts)
        .bind(&cols.errors)
        .bind(&cols.seqs)
        .bind(&cols.next_attempts)
        .execute(pool)
        .await
        .map_err(|e| map_sqlx_error("parking messages the CDC relay could not publish", e))?;
    Ok(origins)
}

/// `outbox_parked` rows as the arrays of one `INSERT … SELECT FROM unnest(…)`.
struct ParkColumns {
    keys: Vec<String>,
    ids: Vec<uuid::Uuid>,
    types: Vec<String>,
    events: Vec<String>,
    payloads: Vec<String>,
    headers: Vec<String>,
    topics: Vec<Option<String>>,
    created: Vec<chrono::DateTime<chrono::Utc>>,
    states: Vec<&'static str>,
    attempts: Vec<i32>,
    errors: Vec<Option<String>>,
    seqs: Vec<Option<i64>>,
    next_attempts: Vec<Option<chrono::DateTime<chrono::Utc>>>,
    /// Keys with a logical message in the batch so far.
    after_emit: HashSet<String>,
}

impl ParkColumns {
    fn with_capacity(n: usize) -> Self {
        Self {
            keys: Vec::with_capacity(n),
            ids: Vec::with_capacity(n),
            types: Vec::with_capacity(n),
            events: Vec::with_capacity(n),
            payloads: Vec::with_capacity(n),
            headers: Vec::with_capacity(n),
            topics: Vec::with_capacity(n),
            created: Vec::with_capacity(n),
            states: Vec::with_capacity(n),
            attempts: Vec::with_capacity(n),
            errors: Vec::with_capacity(n),
            seqs: Vec::with_capacity(n),
            next_attempts: Vec::with_capacity(n),
            after_emit: HashSet::new(),
        }
    }

    fn push(&mut self, r: ToPark) {
        // A row keeps its seq unless a logical message of its key is parked before it in this
        // batch: that one draws a fresh seq, and the row must sort after it.
        let key = &r.held.message.aggregate_id;
        let seq = match r.held.row_seq {
            Some(seq) if !self.after_emit.contains(key) => Some(seq),
            Some(_) => None,
            None => {
                self.after_emit.insert(key.clone());
                None
            }
        };
        self.seqs.push(seq);
        self.next_attempts
            .push((r.state == "retrying").then(|| wall(r.held.due)));
        let m = r.held.message;
        // A malformed message keeps what it carried: JSON as it is, anything else as a JSON
        // string, so the row can be stored and read.
        let json = |b: &[u8]| match serde_json::from_slice::<serde_json::Value>(b) {
            Ok(v) => v.to_string(),
            Err(_) => {
                serde_json::Value::String(String::from_utf8_lossy(b).into_owned()).to_string()
            }
        };
        self.keys.push(m.aggregate_id);
        self.ids.push(m.id);
        self.types.push(m.aggregate_type);
        self.events.push(m.event_type);
        self.payloads.push(json(&m.payload));
        self.headers.push(json(m.headers.as_bytes()));
        self.topics.push(m.topic);
        self.created.push(m.created_at);
        self.states.push(r.state);
        self.attempts.push(m.attempts);
        self.errors.push(r.error);
    }
}
