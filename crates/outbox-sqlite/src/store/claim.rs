//! A claim's read: the next pending rows of the owned partitions, with the epoch each row's
//! partition had when it was claimed.

use super::*;

pub(super) fn message_from_row(r: &SqliteRow) -> Result<Message> {
    let get = |e| map_sqlx_error("reading claimed messages", e);
    let seq: i64 = r.try_get("seq").map_err(get)?;
    let id: String = r.try_get("id").map_err(get)?;
    let id = uuid::Uuid::parse_str(&id)
        .map_err(|e| malformed(format!("outbox row {seq}: id `{id}` is not a UUID: {e}")))?;
    let created_ms: Option<i64> = r.try_get("created_ms").map_err(get)?;
    let created_at = created_ms
        .and_then(DateTime::from_timestamp_millis)
        .ok_or_else(|| malformed(format!("outbox row {seq}: created_at is not a time")))?;
    Ok(Message {
        seq,
        id,
        aggregate_type: r.try_get("aggregate_type").map_err(get)?,
        aggregate_id: r.try_get("aggregate_id").map_err(get)?,
        event_type: r.try_get("event_type").map_err(get)?,
        payload: r.try_get::<String, _>("payload").map_err(get)?.into(),
        headers: r.try_get("headers").map_err(get)?,
        topic: r.try_get("topic").map_err(get)?,
        created_at,
        attempts: r.try_get("attempts").map_err(get)?,
    })
}

impl SqliteStore {
    /// [`Store::claim`]: the next rows of `partitions`, row by row, with the epochs they were
    /// claimed under.
    pub(super) async fn read_claim(
        &self,
        member: &MemberId,
        partitions: &[i32],
        limits: ClaimLimits,
        on_failed: OnFailed,
    ) -> Result<Vec<Message>> {
        if partitions.is_empty() || limits.rows == 0 {
            return Ok(Vec::new());
        }
        // Row by row: each payload is in memory once, as its message's.
        let mut rows = sqlx::query(&self.q.claim)
            .bind(member.as_str())
            .bind(partitions_json(partitions))
            .bind(now_ms())
            .bind(i64::try_from(limits.rows).unwrap_or(i64::MAX))
            .bind(on_failed == OnFailed::Block)
            .bind(i64::try_from(limits.bytes).unwrap_or(i64::MAX))
            .fetch(&self.pool);
        let mut epochs = std::collections::HashMap::new();
        let mut messages = Vec::new();
        while let Some(r) = rows
            .try_next()
            .await
            .map_err(|e| map_sqlx_error("claiming pending messages", e))?
        {
            let m = message_from_row(&r)?;
            let epoch: i64 = r
                .try_get("epoch")
                .map_err(|e| map_sqlx_error("reading claimed messages", e))?;
            epochs.insert(m.seq, epoch);
            messages.push(m);
        }
        self.claimed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(member.0.clone(), epochs);
        Ok(messages)
    }
}
