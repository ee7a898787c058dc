//! A claim's reads: the member's remembered state, the owned partitions' positions, the parked
//! keys that are due, each partition's next range of positions, and the rows that cannot be
//! published as stored.

use super::*;

/// How often parked messages are looked at while nothing says a head came due (a redrive or a
/// hand-made change in another process is noticed within this).
const PARKED_RECHECK: Duration = Duration::from_secs(1);

/// What the store keeps per member between calls.
#[derive(Debug, Default)]
pub(super) struct MemberState {
    /// The last claim's ticket, until its batch is recorded; with a number, so a record that
    /// finishes after a newer claim does not drop that claim's ticket.
    pub(super) ticket: Option<(u64, Ticket)>,
    pub(super) claims: u64,
    /// When parked messages were last read, under which `--on-failed` (what is due depends
    /// on it), and the earliest next attempt seen then.
    pub(super) parked_read_at: Option<(Instant, OnFailed)>,
    pub(super) parked_next_due: Option<DateTime<Utc>>,
    /// This member parked or released something since it last read them.
    pub(super) parked_changed: bool,
    /// The `failed` outcomes of the rows the last claim could not read as stored (withheld
    /// from the relay), recorded with its batch.
    pub(super) failed_in_claim: Vec<Outcome>,
}

impl MemberState {
    fn should_read_parked(&self, now: DateTime<Utc>, on_failed: OnFailed) -> bool {
        self.parked_changed
            || self
                .parked_read_at
                .is_none_or(|(t, mode)| mode != on_failed || t.elapsed() >= PARKED_RECHECK)
            || self.parked_next_due.is_some_and(|due| due <= now)
    }
}

/// An owned partition as a claim reads it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Position {
    pub(super) part: i16,
    pub(super) passed: i64,
    pub(super) parked: i64,
    pub(super) fence: Fence,
    /// The last position handed out in the partition.
    pub(super) last: i64,
    /// Every row below this seq is passed: the claim reads no range below it.
    pub(super) passed_below: i64,
}

/// A message from a row selected with `message_columns.sql`; `attempts` from the caller, with
/// its partition and position, and why it cannot be published as stored (`None` when it can).
///
/// A column that does not hold what the SQL contract says (an `id` that is not a UUID, a zero
/// or partly zero `created_at`, text that cannot be read) does not fail the read, which would
/// stop every partition of the claim, again at every retry: the message comes back with a
/// stand-in value (the nil UUID, the epoch, empty text) and the reason, naming the column, and
/// the claim fails that row alone ([`Engine::claim`]). Only the position columns, which the
/// store itself writes, fail the read.
pub(super) fn message_from_row(
    r: &MySqlRow,
    attempts: i32,
) -> Result<(Message, i16, i64, Option<String>)> {
    let get = |e| map_sqlx_error("reading claimed messages", e);
    let seq: i64 = r.try_get("seq").map_err(get)?;
    let part: i16 = r.try_get("part").map_err(get)?;
    let part_seq: i64 = r.try_get("part_seq").map_err(get)?;
    let mut problems: Vec<String> = Vec::new();
    let (id, why) = row_id(r);
    problems.extend(why);
    let (created_at, why) = row_time(r);
    problems.extend(why);
    let mut text = |column: &str| -> String {
        r.try_get::<String, _>(column).unwrap_or_else(|e| {
            problems.push(format!("the column `{column}` cannot be read as text: {e}"));
            String::new()
        })
    };
    let payload = text("payload");
    let aggregate_type = text("aggregate_type");
    let aggregate_id = text("aggregate_id");
    let event_type = text("event_type");
    let headers = text("headers");
    let topic = r.try_get::<Option<String>, _>("topic").unwrap_or_else(|e| {
        problems.push(format!("the column `topic` cannot be read as text: {e}"));
        None
    });
    let message = Message {
        seq,
        id,
        aggregate_type,
        aggregate_id,
        event_type,
        payload: payload.into(),
        headers,
        topic,
        created_at,
        attempts,
    };
    let why = (!problems.is_empty()).then(|| {
        format!(
            "outbox row {seq} cannot be published as stored: {}",
            problems.join("; ")
        )
    });
    Ok((message, part, part_seq, why))
}

/// The row's `id` as a UUID, or the nil UUID and why (naming the column).
pub(super) fn row_id(r: &MySqlRow) -> (uuid::Uuid, Option<String>) {
    match r.try_get::<String, _>("id") {
        Ok(id) => match uuid::Uuid::parse_str(&id) {
            Ok(id) => (id, None),
            Err(e) => (
                uuid::Uuid::nil(),
                Some(format!(
                    "the column `id` holds `{}`, which is not a UUID (8-4-4-4-12 hexadecimal \
                     text): {e}",
                    id.chars().take(64).collect::<String>()
                )),
            ),
        },
        Err(e) => (
            uuid::Uuid::nil(),
            Some(format!("the column `id` cannot be read as text: {e}")),
        ),
    }
}

/// The row's `created_at`, or the epoch and why (naming the column): MariaDB's default
/// `sql_mode` stores zero and partly zero dates, which are no time at all.
pub(super) fn row_time(r: &MySqlRow) -> (DateTime<Utc>, Option<String>) {
    match r.try_get::<NaiveDateTime, _>("created_at") {
        Ok(t) => (utc(t), None),
        Err(e) => (
            DateTime::<Utc>::UNIX_EPOCH,
            Some(format!(
                "the column `created_at` is not a valid time (a zero date?): {e}"
            )),
        ),
    }
}

/// Splits a claim's messages: those the relay gets, and a `failed` outcome for each row that
/// cannot be published as stored (`malformed`: `seq`, why). The later messages of such a row's
/// key in the batch are withheld too (no outcome: they wait behind it, or come again in the
/// next claim), so a key never overtakes its failed message.
pub(super) fn withhold(
    messages: Vec<Message>,
    malformed: &[(i64, String)],
) -> (Vec<Message>, Vec<Outcome>) {
    if malformed.is_empty() {
        return (messages, Vec::new());
    }
    let bad: HashMap<i64, &str> = malformed.iter().map(|(s, w)| (*s, w.as_str())).collect();
    let mut stopped: std::collections::HashSet<String> = std::collections::HashSet::new();
    let mut failed = Vec::new();
    let mut out = Vec::with_capacity(messages.len());
    for m in messages {
        if let Some(why) = bad.get(&m.seq) {
            tracing::warn!(seq = m.seq, error = %why, "an outbox row cannot be published as stored: it goes `failed` alone, other keys flow");
            failed.push(Outcome::Failed {
                seq: m.seq,
                error: (*why).to_string(),
            });
            stopped.insert(m.aggregate_id.clone());
        } else if !stopped.contains(&m.aggregate_id) {
            out.push(m);
        }
    }
    (out, failed)
}

/// `n` copies of `term` joined by `sep`: the part of a claim statement that follows the claim,
/// one bound term per key or partition (see `queries.rs`).
fn terms(n: usize, term: &str, sep: &str) -> String {
    vec![term; n].join(sep)
}

/// Shares `budget` rows among partitions with `available` rows each, evenly, giving what a
/// partition cannot use to the others.
pub(super) fn share(available: &[i64], budget: i64) -> Vec<i64> {
    let mut take = vec![0i64; available.len()];
    let mut left = budget.max(0);
    let mut open: Vec<usize> = (0..available.len()).filter(|&i| available[i] > 0).collect();
    while left > 0 && !open.is_empty() {
        let each = (left / open.len() as i64).max(1);
        let mut still = Vec::new();
        for &i in &open {
            if left == 0 {
                break;
            }
            let give = each.min(available[i] - take[i]).min(left);
            take[i] += give;
            left -= give;
            if take[i] < available[i] {
                still.push(i);
            }
        }
        open = still;
    }
    take
}

impl Engine {
    pub(super) async fn positions(
        &self,
        member: &MemberId,
        partitions: &[i32],
    ) -> Result<Vec<Position>> {
        let rows = sqlx::query(&self.q.positions)
            .bind(member.as_str())
            .fetch_all(&self.pool)
            .await
            .map_err(|e| map_sqlx_error("reading the partitions' positions", e))?;
        let get = |e| map_sqlx_error("reading the partitions' positions", e);
        let mut out = Vec::with_capacity(rows.len());
        for r in rows {
            let part: i16 = r.try_get("part").map_err(get)?;
            if !partitions.contains(&i32::from(part)) {
                continue;
            }
            out.push(Position {
                part,
                passed: r.try_get("passed").map_err(get)?,
                parked: r.try_get("parked").map_err(get)?,
                fence: Fence {
                    epoch: r.try_get("epoch").map_err(get)?,
                    recorded: r.try_get("recorded").map_err(get)?,
                },
                last: r.try_get("n").map_err(get)?,
                passed_below: r.try_get("passed_below").map_err(get)?,
            });
        }
        Ok(out)
    }

    /// The parked keys of `parts` that may go out now, with up to `per_key` of their rows each,
    /// and the earliest next attempt among the heads not due yet.
    pub(super) async fn read_parked(
        &self,
        parts: &[i16],
        on_failed: OnFailed,
        per_key: i64,
        malformed: &mut Vec<(i64, String)>,
    ) -> Result<(Vec<ParkedKey>, Option<DateTime<Utc>>)> {
        let err = |e| map_sqlx_error("reading parked messages", e);
        let sql = match on_failed {
            OnFailed::Block => &self.q.parked_keys_block,
            OnFailed::Skip => &self.q.parked_keys_skip,
        };
        let keys = sqlx::query(sql)
            .bind(csv(parts.iter().copied()))
            .fetch_all(&self.pool)
            .await
            .map_err(err)?;
        let mut due: Vec<(i16, String, i64)> = Vec::new();
        let mut next_due: Option<DateTime<Utc>> = None;
        for r in keys {
            let part: i16 = r.try_get("part").map_err(err)?;
            let key: String = r.try_get("aggregate_id").map_err(err)?;
            let n: i64 = r.try_get("n").map_err(err)?;
            let failed: i64 = r.try_get("failed").map_err(err)?;
            let is_due: i64 = r.try_get("due").map_err(err)?;
            let at: Option<NaiveDateTime> = r.try_get("next_attempt_at").map_err(err)?;
            if failed > 0 && on_failed == OnFailed::Block {
                continue;
            }
            if is_due != 0 {
                due.push((part, key, n));
            } else if let Some(at) = at.map(utc) {
                next_due = Some(next_due.map_or(at, |d| d.min(at)));
            }
        }
        if due.is_empty() {
            return Ok((Vec::new(), next_due));
        }
        let sql = match on_failed {
            OnFailed::Block => &self.q.claim_parked_block,
            OnFailed::Skip => &self.q.claim_parked_skip,
        }
        .replace(
            "{keys}",
            &terms(due.len(), "(part = ? AND aggregate_id = ?)", " OR "),
        );
        let mut select = sqlx::query(&sql);
        for (part, key, _) in &due {
            select = select.bind(*part).bind(key.as_str());
        }
        let rows = select
            .bind(per_key)
            .fetch_all(&self.pool)
            .await
            .map_err(err)?;
        let mut by_key: BTreeMap<(i16, String), Vec<(Message, i64)>> = BTreeMap::new();
        for r in &rows {
            let attempts: i32 = r.try_get("attempts").map_err(err)?;
            let (m, part, part_seq, why) = message_from_row(r, attempts)?;
            if let Some(why) = why {
                malformed.push((m.seq, why));
            }
            by_key
                .entry((part, m.aggregate_id.clone()))
                .or_default()
                .push((m, part_seq));
        }
        let counts: HashMap<(i16, String), i64> =
            due.into_iter().map(|(p, k, n)| ((p, k), n)).collect();
        let keys = by_key
            .into_iter()
            .map(|((part, key), rows)| {
                let complete = counts
                    .get(&(part, key.clone()))
                    .is_some_and(|&n| n <= rows.len() as i64);
                ParkedKey {
                    part,
                    key,
                    rows,
                    complete,
                }
            })
            .collect();
        Ok((keys, next_due))
    }

    /// The next rows of each partition in `take` (`(position, rows)`), each flagged with
    /// whether its key has parked messages. Keeps, per partition, only the run that continues
    /// the position without a gap (there is none unless the trigger was bypassed).
    pub(super) async fn read_windows(
        &self,
        take: &[(Position, i64)],
        probe_parked: bool,
        on_failed: OnFailed,
        bytes: Option<usize>,
        malformed: &mut Vec<(i64, String)>,
    ) -> Result<Vec<WindowRead>> {
        let err = |e| map_sqlx_error("reading the partitions' next messages", e);
        let held = match (probe_parked, on_failed) {
            (false, _) => "0",
            (true, OnFailed::Block) => self.q.claim_held_block.as_str(),
            (true, OnFailed::Skip) => self.q.claim_held_skip.as_str(),
        };
        // With a byte bound the server stops at it. Rows are counted round-robin over the
        // partitions (every partition's first row, then every second row, …, each level in seq
        // order), and a row goes out only if the payloads counted before it stay under the
        // bound. Within a partition that order is its position order, so each partition gives a
        // prefix, and no partition waits behind another's big payloads; `assemble` then trims
        // the merge (by seq) to the exact bound, which drops at most the last row counted. The
        // count runs over a narrow derived table (seq and length only) joined back by key: one
        // running SUM, which the server keeps incrementally. (The gate
        // before took a running MAX per partition, which MariaDB recomputes over the whole frame
        // for every row: 160 ms for a 1,000-row claim of one key, against 7.5 ms for this one.)
        let (template, alias) = match bytes {
            None => (&self.q.claim_window, "o"),
            Some(_) => (&self.q.claim_window_bytes, "i"),
        };
        let sql = template
            .replace("{held}", held)
            .replace("{passed}", &terms(take.len(), "WHEN ? THEN ?", " "))
            .replace(
                "{ranges}",
                &terms(
                    take.len(),
                    &format!("({alias}.part = ? AND {alias}.part_seq BETWEEN ? AND ?)"),
                    " OR ",
                ),
            );
        let mut select = sqlx::query(&sql);
        if bytes.is_some() {
            for (p, _) in take {
                select = select.bind(p.part).bind(p.passed);
            }
        }
        // Ranges wholly passed hold none of these rows: the bound keeps the server from
        // probing each of them (partition pruning), so a claim's cost does not grow with the
        // ranges retention keeps.
        let passed_below = take.iter().map(|(p, _)| p.passed_below).min().unwrap_or(0);
        select = select.bind(passed_below);
        for (p, k) in take {
            select = select.bind(p.part).bind(p.passed + 1).bind(p.passed + k);
        }
        if let Some(bytes) = bytes {
            select = select.bind(i64::try_from(bytes).unwrap_or(i64::MAX));
        }
        let rows = select.fetch_all(&self.pool).await.map_err(err)?;
        let mut by_part: BTreeMap<i16, Vec<(Message, i64, bool)>> = BTreeMap::new();
        for r in &rows {
            let held: i64 = r.try_get("held").map_err(err)?;
            let (m, part, part_seq, why) = message_from_row(r, 0)?;
            if let Some(why) = why {
                malformed.push((m.seq, why));
            }
            by_part
                .entry(part)
                .or_default()
                .push((m, part_seq, held != 0));
        }
        let mut out = Vec::with_capacity(take.len());
        for (p, _) in take {
            let mut rows = by_part.remove(&p.part).unwrap_or_default();
            rows.sort_by_key(|(_, part_seq, _)| *part_seq);
            let run = rows
                .iter()
                .zip(p.passed + 1..)
                .take_while(|((_, part_seq, _), want)| part_seq == want)
                .count();
            if run < rows.len() {
                if self.sequencer.is_some() {
                    // The sequencer read the row from the binlog, which the server writes
                    // just before the row becomes visible: it comes in the next claim.
                    tracing::debug!(
                        partition = p.part,
                        after = p.passed + run as i64,
                        "a sequenced row is not visible yet; rows past it wait a moment"
                    );
                } else {
                    tracing::warn!(
                        partition = p.part,
                        after = p.passed + run as i64,
                        "a gap in a partition's positions: rows past it wait; was the outbox \
                         trigger bypassed or the counter table changed by hand?"
                    );
                }
                rows.truncate(run);
            }
            out.push(WindowRead {
                part: p.part,
                passed: p.passed,
                rows,
            });
        }
        Ok(out)
    }

    /// Reads what `member` may hand out now and remembers it as its ticket; with the rows
    /// read that cannot be published as stored (`seq`, why), which are in the ticket too.
    pub(super) async fn read_claim(
        &self,
        member: &MemberId,
        partitions: &[i32],
        limits: ClaimLimits,
        on_failed: OnFailed,
    ) -> Result<(Vec<Message>, Ticket, Vec<(i64, String)>)> {
        let mut malformed = Vec::new();
        let positions = self.positions(member, partitions).await?;
        let fences: BTreeMap<i16, Fence> = positions.iter().map(|p| (p.part, p.fence)).collect();
        let now = Utc::now();
        let with_parked: Vec<i16> = positions
            .iter()
            .filter(|p| p.parked > 0)
            .map(|p| p.part)
            .collect();
        let read_parked =
            !with_parked.is_empty() && self.state(member, |s| s.should_read_parked(now, on_failed));
        let rows = i64::try_from(limits.rows).unwrap_or(i64::MAX);
        let mut parked = Vec::new();
        if read_parked {
            let (keys, next_due) = self
                .read_parked(&with_parked, on_failed, rows, &mut malformed)
                .await?;
            self.state(member, |s| {
                s.parked_read_at = Some((Instant::now(), on_failed));
                s.parked_next_due = next_due;
                s.parked_changed = false;
            });
            parked = keys;
        }
        let parked_rows: i64 = parked.iter().map(|k| k.rows.len() as i64).sum();
        let parked_bytes: usize = parked
            .iter()
            .flat_map(|k| &k.rows)
            .map(|(m, _)| m.payload.len())
            .sum();
        let budget = rows.saturating_sub(parked_rows);
        // The byte bound left after the parked messages; the first row always goes.
        let bytes =
            (limits.bytes != usize::MAX).then(|| limits.bytes.saturating_sub(parked_bytes).max(1));
        let open: Vec<Position> = positions
            .iter()
            .filter(|p| p.last > p.passed && p.parked < PARKED_CAP)
            .copied()
            .collect();
        let available: Vec<i64> = open.iter().map(|p| p.last - p.passed).collect();
        let take: Vec<(Position, i64)> = open
            .into_iter()
            .zip(share(&available, budget.max(1)))
            .filter(|(_, k)| *k > 0)
            .collect();
        let windows = if take.is_empty() {
            Vec::new()
        } else {
            let probe = take.iter().any(|(p, _)| p.parked > 0);
            self.read_windows(&take, probe, on_failed, bytes, &mut malformed)
                .await?
        };
        let (messages, ticket) = assemble(parked, windows, limits, on_failed, fences);
        Ok((messages, ticket, malformed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_is_shared_evenly_and_what_one_cannot_use_goes_to_the_others() {
        assert_eq!(share(&[100, 100, 100], 90), vec![30, 30, 30]);
        assert_eq!(share(&[5, 100, 100], 90), vec![5, 43, 42]);
        assert_eq!(share(&[0, 3], 10), vec![0, 3]);
        assert_eq!(share(&[10, 10, 10], 2).iter().sum::<i64>(), 2);
        assert_eq!(share(&[], 10), Vec::<i64>::new());
    }
}
