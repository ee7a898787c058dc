//! Completing a batch: the outcomes of the claimed rows, recorded in one statement fenced by the
//! epoch each row was claimed under.

use super::*;

impl SqliteStore {
    /// [`Store::complete`]: one statement records every outcome, fenced by the epoch its row was
    /// claimed under.
    pub(super) async fn complete_batch(
        &self,
        member: &MemberId,
        outcomes: &[Outcome],
    ) -> Result<u64> {
        if outcomes.is_empty() {
            return Ok(0);
        }
        let epochs = self
            .claimed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(member.as_str())
            .cloned()
            .unwrap_or_default();
        // An outcome for a row this member did not claim has no epoch: it is not recorded.
        let rows: Vec<(i64, &str, Option<&str>, i64, i64)> = outcomes
            .iter()
            .map(|o| {
                let epoch = epochs.get(&o.seq()).copied().unwrap_or(-1);
                match o {
                    Outcome::Published { seq } => (*seq, "published", None, 0, epoch),
                    Outcome::Retry { seq, error, delay } => {
                        (*seq, "pending", Some(error.as_str()), millis(*delay), epoch)
                    }
                    Outcome::Deferred { seq, error, delay } => (
                        *seq,
                        "deferred",
                        Some(error.as_str()),
                        millis(*delay),
                        epoch,
                    ),
                    Outcome::Failed { seq, error } => {
                        (*seq, "failed", Some(error.as_str()), 0, epoch)
                    }
                }
            })
            .collect();
        let rows = serde_json::to_string(&rows).map_err(|e| {
            Error::with_source(ErrorKind::Other, "encoding publish results as JSON", e)
        })?;
        let now = Utc::now();
        let done = sqlx::query(&self.q.complete)
            .bind(member.as_str())
            .bind(rows)
            .bind(now.timestamp_millis())
            .bind(now.to_rfc3339_opts(SecondsFormat::Millis, true))
            .execute(&self.pool)
            .await
            .map_err(|e| map_sqlx_error("recording publish results", e))?;
        Ok(done.rows_affected())
    }
}
