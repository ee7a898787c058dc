//! Completing a batch: the plans of its partitions written in one transaction, each only if
//! its fence still holds (owned by the member, same epoch, nothing recorded since the claim).

use super::*;

impl Engine {
    /// Writes `plans` in one transaction, each partition only if its fence still holds (owned
    /// by `member`, same epoch, no record since its claim). Returns the outcomes settled.
    pub(super) async fn complete_plans(
        &self,
        member: &MemberId,
        plans: &[PartPlan],
    ) -> Result<u64> {
        if plans.is_empty() {
            return Ok(0);
        }
        let err =
            |what: &'static str| move |e| map_sqlx_error(&format!("recording a batch: {what}"), e);
        let r = |sql: &str| self.schema.render(sql);
        let mut tx = self.pool.begin().await.map_err(err("begin"))?;
        let mut lock =
            QueryBuilder::<MySql>::new(r(include_str!("../../queries/record_lock_head.sql")));
        let mut each = lock.separated(", ");
        for p in plans {
            each.push_bind(p.part);
        }
        lock.push(") ORDER BY part FOR UPDATE");
        let rows = lock
            .build()
            .fetch_all(&mut *tx)
            .await
            .map_err(err("locking the partitions"))?;
        let mut current: HashMap<i16, (i64, i64, Option<String>)> = HashMap::new();
        for r in rows {
            let part: i16 = r.try_get("part").map_err(err("reading partitions"))?;
            current.insert(
                part,
                (
                    r.try_get("epoch").map_err(err("reading partitions"))?,
                    r.try_get("recorded").map_err(err("reading partitions"))?,
                    r.try_get("owner").map_err(err("reading partitions"))?,
                ),
            );
        }
        let fenced: Vec<&PartPlan> = plans
            .iter()
            .filter(|p| {
                current
                    .get(&p.part)
                    .is_some_and(|(epoch, recorded, owner)| {
                        *epoch == p.fence.epoch
                            && *recorded == p.fence.recorded
                            && owner.as_deref() == Some(member.as_str())
                    })
            })
            .collect();
        if fenced.is_empty() {
            tx.rollback().await.map_err(err("rollback"))?;
            return Ok(0);
        }
        let parks: Vec<_> = fenced.iter().flat_map(|p| &p.parks).collect();
        if !parks.is_empty() {
            let mut upsert =
                QueryBuilder::<MySql>::new(r(include_str!("../../queries/park_head.sql")));
            upsert.push_values(parks, |mut row, k| {
                row.push_bind(k.seq)
                    .push_bind(k.part)
                    .push_bind(k.part_seq)
                    .push_bind(k.key.as_str())
                    .push_bind(k.state)
                    .push_bind(k.attempts)
                    .push("UTC_TIMESTAMP(6) + INTERVAL ")
                    .push_bind_unseparated(k.next_attempt_in.map(micros))
                    .push_unseparated(" MICROSECOND")
                    .push_bind(k.error.as_deref());
            });
            upsert.push(
                " ON DUPLICATE KEY UPDATE state = VALUES(state), attempts = VALUES(attempts), \
                 next_attempt_at = VALUES(next_attempt_at), last_error = VALUES(last_error)",
            );
            upsert
                .build()
                .execute(&mut *tx)
                .await
                .map_err(err("parking messages"))?;
        }
        let deletes: Vec<i64> = fenced
            .iter()
            .flat_map(|p| p.deletes.iter().copied())
            .collect();
        if !deletes.is_empty() {
            let mut delete =
                QueryBuilder::<MySql>::new(r(include_str!("../../queries/unpark_head.sql")));
            let mut each = delete.separated(", ");
            for seq in &deletes {
                each.push_bind(*seq);
            }
            delete.push(")");
            delete
                .build()
                .execute(&mut *tx)
                .await
                .map_err(err("releasing parked messages"))?;
        }
        let mut update =
            QueryBuilder::<MySql>::new(r(include_str!("../../queries/record_positions_head.sql")));
        for p in &fenced {
            update.push(" WHEN ").push_bind(p.part).push(" THEN ");
            match p.passed {
                Some(passed) => update.push_bind(passed),
                None => update.push("passed"),
            };
        }
        update.push(" ELSE passed END, parked = parked + CASE part");
        for p in &fenced {
            update
                .push(" WHEN ")
                .push_bind(p.part)
                .push(" THEN ")
                .push_bind(p.parked_delta);
        }
        update.push(" ELSE 0 END, passed_at = UTC_TIMESTAMP(6) WHERE part IN (");
        let mut each = update.separated(", ");
        for p in &fenced {
            each.push_bind(p.part);
        }
        update.push(")");
        update
            .build()
            .execute(&mut *tx)
            .await
            .map_err(err("moving the positions"))?;
        tx.commit().await.map_err(err("commit"))?;
        Ok(fenced.iter().map(|p| p.settled).sum())
    }
}
