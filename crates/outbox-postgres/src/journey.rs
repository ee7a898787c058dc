//! [`Store::journey`](outbox_core::Store::journey) for PostgreSQL: a message's row, its parked
//! copy, its redrives and the earliest kept position that passed it, read in two statements
//! (journey.sql, journey_redrives.sql) and laid out as steps.
//!
//! The engine keeps no row per attempt or per acknowledgement (it is insert-only: a batch moves
//! a position), so the journey says what the store can prove: when the row was written and by
//! which transaction, the attempts and last error it had at each redrive (the audit trail) and
//! now (the parked row), and that a position passed it, with the earliest kept position's time
//! as the latest the broker can have acknowledged it.

use chrono::{DateTime, Utc};
use outbox_core::{Journey, JourneyQuery, JourneyState, JourneyStep, Result};
use sqlx::{PgPool, Row};

use crate::error::map_sqlx_error;
use crate::schema::Schema;

/// How long a lookup may take: a search by id scans the table (ids have no index).
const LOOKUP_TIMEOUT: &str = include_str!("../queries/lookup_timeout.sql");

/// The messages `query` names and what happened to each.
pub(crate) async fn journey(
    pool: &PgPool,
    schema: &Schema,
    query: &JourneyQuery,
    limit: usize,
) -> Result<Vec<Journey>> {
    let err = |e| map_sqlx_error("tracing a message's journey", e);
    let (id, key) = match query {
        JourneyQuery::Id(id) => (Some(*id), None),
        JourneyQuery::Key(key) => (None, Some(key.as_str())),
    };
    let mut tx = pool.begin().await.map_err(err)?;
    sqlx::query(LOOKUP_TIMEOUT)
        .execute(&mut *tx)
        .await
        .map_err(err)?;
    let rows = sqlx::query(&schema.render(include_str!("../queries/journey.sql")))
        .bind(id)
        .bind(key)
        .bind(i64::try_from(limit.max(1)).unwrap_or(i64::MAX))
        .fetch_all(&mut *tx)
        .await
        .map_err(err)?;
    let ids: Vec<uuid::Uuid> = rows
        .iter()
        .map(|r| r.try_get("id"))
        .collect::<std::result::Result<_, _>>()
        .map_err(err)?;
    let redrives = sqlx::query(&schema.render(include_str!("../queries/journey_redrives.sql")))
        .bind(&ids)
        .fetch_all(&mut *tx)
        .await
        .map_err(err)?;
    tx.commit().await.map_err(err)?;
    rows.iter()
        .map(|r| lay_out(r, &redrives).map_err(err))
        .collect()
}

/// One message's journey from its row of journey.sql and the audit rows of every message found.
fn lay_out(
    r: &sqlx::postgres::PgRow,
    redrives: &[sqlx::postgres::PgRow],
) -> std::result::Result<Journey, sqlx::Error> {
    let id: uuid::Uuid = r.try_get("id")?;
    let seq: i64 = r.try_get("seq")?;
    let partition: i32 = r.try_get("partition")?;
    let txid: i64 = r.try_get("txid")?;
    let created_at: DateTime<Utc> = r.try_get("created_at")?;
    let mut steps = vec![JourneyStep::new(
        Some(created_at),
        "written",
        format!("committed by transaction {txid}; seq {seq} in partition {partition}"),
    )];
    let mut redriven_at = None;
    for a in redrives {
        if a.try_get::<uuid::Uuid, _>("message_id")? != id {
            continue;
        }
        let at: DateTime<Utc> = a.try_get("redriven_at")?;
        let attempts: i32 = a.try_get("attempts")?;
        let error: Option<String> = a.try_get("last_error")?;
        let reason: String = a.try_get("reason")?;
        steps.push(JourneyStep::new(
            None,
            "failed",
            format!(
                "{attempts} failed attempt(s); last error: {}",
                error.as_deref().unwrap_or("none recorded")
            ),
        ));
        steps.push(JourneyStep::new(
            Some(at),
            "redriven",
            format!("given a fresh budget; reason: {reason}"),
        ));
        redriven_at = Some(at);
    }
    let parked: Option<String> = r.try_get("state")?;
    let state = match parked.as_deref() {
        Some(s) => {
            let attempts: i32 = r.try_get("attempts")?;
            let error: Option<String> = r.try_get("last_error")?;
            let parked_at: DateTime<Utc> = r.try_get("parked_at")?;
            let next: Option<DateTime<Utc>> = r.try_get("next_attempt_at")?;
            let error = error.as_deref().unwrap_or("none recorded");
            let (state, what, detail) = match s {
                "failed" => (
                    JourneyState::Failed,
                    "failed",
                    format!("gave up after {attempts} attempt(s); last error: {error}; waits for a redrive"),
                ),
                "waiting" => (
                    JourneyState::Waiting,
                    "parked",
                    "waits behind an earlier message of its key that is retrying or failed".into(),
                ),
                _ => (
                    JourneyState::Retrying,
                    "parked",
                    format!(
                        "{attempts} failed attempt(s) so far; last error: {error}; next attempt {}",
                        next.map_or("when the relay next claims".into(), |t| t.to_rfc3339())
                    ),
                ),
            };
            steps.push(JourneyStep::new(Some(parked_at), what, detail));
            state
        }
        None => match r.try_get::<Option<DateTime<Utc>>, _>("first_at")? {
            Some(first) => {
                let detail = match redriven_at {
                    // Published from the parked table after the redrive: the parked copy is
                    // deleted on acknowledgement, and no time is kept for it.
                    Some(_) => "acknowledged by the broker after the redrive".to_string(),
                    // A message published after retries was passed when it was parked: the
                    // time is when it left the partition's flow, the acknowledgement came then
                    // or later.
                    None => format!(
                        "acknowledged by the broker: passed by the partition's position recorded \
                         at {} and not parked now",
                        first.to_rfc3339()
                    ),
                };
                let at = if redriven_at.is_some() {
                    None
                } else {
                    Some(first)
                };
                steps.push(JourneyStep::new(at, "published", detail));
                JourneyState::Published
            }
            None => {
                let latest: Option<DateTime<Utc>> = r.try_get("latest_at")?;
                steps.push(JourneyStep::new(
                    None,
                    "pending",
                    match latest {
                        Some(t) => format!(
                            "no position has passed it yet (the partition's latest was recorded \
                             at {})",
                            t.to_rfc3339()
                        ),
                        None => "no relay has read its partition yet".into(),
                    },
                ));
                JourneyState::Pending
            }
        },
    };
    Ok(Journey {
        id,
        seq,
        partition: Some(partition),
        aggregate_type: r.try_get("aggregate_type")?,
        aggregate_id: r.try_get("aggregate_id")?,
        event_type: r.try_get("event_type")?,
        topic: r.try_get("topic")?,
        headers: r.try_get("headers")?,
        payload: r.try_get("payload")?,
        state,
        steps,
        held_by: r.try_get("held_by")?,
    })
}
