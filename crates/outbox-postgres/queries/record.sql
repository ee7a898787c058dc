-- Records one batch in one statement, fenced and compare-and-append.
--
-- Fenced: first it takes FOR SHARE on the batch's partition rows, requiring this member as
-- owner at the epoch it claimed under. A takeover bumps the epoch with an UPDATE, which this
-- lock conflicts with, so a member that lost a partition (a zombie after a pause, or even this
-- member after re-taking it) records nothing for it: it can cause a duplicate delivery, never
-- move a position. FOR SHARE writes no new row version.
--
-- Compare-and-append: each new position names the position its claim read (`prev_id`), and a
-- position has at most one successor (a unique index on (partition, prev_id)), and a record
-- appends only while that position still exists. A record that was abandoned at the store
-- deadline and lands after the retry (or after any later record) finds its predecessor already
-- followed, or pruned with its successor: it appends nothing, and everything else it would
-- write for that partition (parking, retries, releases) depends on that append, so nothing
-- moves back and no released message is parked again. Concurrent appends of one successor
-- wait on the unique index for each other; one wins.
--
-- For the partitions whose position was appended only:
--   * copies messages to park (a retry, a failure, or a row queued behind its key) from the
--     message table into `outbox_parked`, unless parked already;
--   * updates or deletes parked messages that were tried again (a published one is deleted:
--     the parked table is small, and its key is released by draining it in order).
-- Returns the partitions appended, with the new positions' ids (the next record's `prev_id`).
-- $1 member
-- $2/$3 fence: partitions, epochs
-- $4..$15 positions: partition, epoch, done, done_bound, done_floor, done_at, cur, cur_bound,
--         cur_floor, cur_at, cursor, published total
-- $16..$22 to park: partition, txid, seq, state, attempts, delay seconds, error
-- $23..$27 parked tried again: partition, seq, outcome (published|retrying|deferred|failed),
--         delay, error; `deferred` (its sink was not tried) stays retrying without an attempt
-- $28/$29 positions (aligned with $4): the position each follows, parked messages counted
WITH fence AS MATERIALIZED (
    SELECT p.partition
    FROM {schema}.outbox_partitions AS p
    JOIN unnest($2::int2[], $3::int8[]) AS f(partition, epoch) ON f.partition = p.partition
    WHERE p.owner = $1 AND p.epoch = f.epoch
    FOR SHARE OF p
), predecessor AS MATERIALIZED (
    -- Compare-and-append needs the position the claim read to still exist, not only its
    -- successor slot to be free: pruning (prune_positions.sql) deletes a superseded position
    -- together with its successor, which frees the slot, and a record abandoned long before
    -- would then append behind a position that is no longer the latest and become the latest
    -- itself, moving the partition back. FOR KEY SHARE makes a concurrent prune of it wait
    -- until this record commits (it then prunes a position that has a successor, as always),
    -- or, if the prune deleted it first, leaves it out here. One primary-key probe per
    -- partition; it conflicts only with DELETE, and positions are never updated. A record's own
    -- predecessor is the latest position, which no prune deletes; only a record that lands late
    -- can meet a prune, and if that prune already deleted its predecessor's successor the two
    -- wait on each other: PostgreSQL's deadlock check ends one (the late record, whose batch
    -- was recorded by its retry, or the prune, which the next maintenance round runs again).
    SELECT x.partition, x.id
    FROM {schema}.outbox_positions AS x
    JOIN unnest($4::int2[], $28::int8[]) AS q(partition, prev_id)
      ON x.id = q.prev_id AND x.partition = q.partition
    WHERE q.partition IN (SELECT partition FROM fence)
    FOR KEY SHARE OF x
), appended AS (
    -- A bound left NULL is this transaction's own id: assigned now, after the snapshot it
    -- bounds was taken, so every id assigned before that snapshot is smaller.
    INSERT INTO {schema}.outbox_positions
        (partition, epoch, done, done_bound, done_floor, done_at, cur, cur_bound, cur_floor,
         cur_at, cursor, published, prev_id, parked)
    SELECT n.partition, n.epoch, n.done::pg_snapshot,
           COALESCE(n.done_bound::xid8, pg_current_xact_id()), n.done_floor, n.done_at,
           n.cur::pg_snapshot,
           CASE WHEN n.cur IS NOT NULL THEN COALESCE(n.cur_bound::xid8, pg_current_xact_id()) END,
           n.cur_floor, n.cur_at, n.cursor, n.published, n.prev_id, n.parked
    FROM unnest($4::int2[], $5::int8[], $6::text[], $7::text[], $8::int8[], $9::timestamptz[],
                $10::text[], $11::text[], $12::int8[], $13::timestamptz[], $14::int8[], $15::int8[],
                $28::int8[], $29::int8[])
         AS n(partition, epoch, done, done_bound, done_floor, done_at, cur, cur_bound, cur_floor,
              cur_at, cursor, published, prev_id, parked)
    WHERE (n.partition, n.prev_id) IN (SELECT partition, id FROM predecessor)
    ON CONFLICT (partition, prev_id) DO NOTHING
    RETURNING partition, id
), parked AS (
    INSERT INTO {schema}.outbox_parked
        (partition, seq, aggregate_id, id, aggregate_type, event_type, payload, headers, topic,
         created_at, state, attempts, next_attempt_at, last_error)
    SELECT o.partition, o.seq, o.aggregate_id, o.id, o.aggregate_type, o.event_type, o.payload,
           o.headers, o.topic, o.created_at, k.state, k.attempts,
           CASE WHEN k.state = 'retrying' THEN now() + make_interval(secs => k.delay) END,
           k.error
    FROM unnest($16::int2[], $17::text[], $18::int8[], $19::text[], $20::int4[], $21::float8[],
                $22::text[]) AS k(partition, txid, seq, state, attempts, delay, error)
    JOIN {schema}.outbox AS o
      ON o.partition = k.partition AND o.txid = k.txid::xid8 AND o.seq = k.seq
    WHERE k.partition IN (SELECT partition FROM appended)
      -- Parked already (by a CDC relay before its slot was lost, at another seq when a logical
      -- message of its key came before it): a second copy would be published twice, and could
      -- sort ahead of its key's earlier message. A probe of the key's few parked rows.
      AND NOT EXISTS (SELECT 1 FROM {schema}.outbox_parked AS d
                      WHERE d.partition = o.partition AND d.aggregate_id = o.aggregate_id
                        AND d.id = o.id)
    ON CONFLICT (partition, seq) DO NOTHING
), retried AS (
    UPDATE {schema}.outbox_parked AS x
    SET state           = CASE WHEN r.outcome = 'deferred' THEN 'retrying' ELSE r.outcome END,
        attempts        = x.attempts + CASE WHEN r.outcome = 'deferred' THEN 0 ELSE 1 END,
        next_attempt_at = CASE WHEN r.outcome IN ('retrying', 'deferred')
                               THEN now() + make_interval(secs => r.delay) END,
        last_error      = COALESCE(r.error, x.last_error),
        -- A message that gives up again after a redrive failed now, not when first parked:
        -- its journey's last step carries this time.
        parked_at       = CASE WHEN r.outcome = 'failed' THEN now() ELSE x.parked_at END
    FROM unnest($23::int2[], $24::int8[], $25::text[], $26::float8[], $27::text[])
         AS r(partition, seq, outcome, delay, error)
    WHERE x.partition = r.partition AND x.seq = r.seq AND r.outcome <> 'published'
      AND r.partition IN (SELECT partition FROM appended)
), released AS (
    DELETE FROM {schema}.outbox_parked AS x
    USING unnest($23::int2[], $24::int8[], $25::text[]) AS r(partition, seq, outcome)
    WHERE x.partition = r.partition AND x.seq = r.seq AND r.outcome = 'published'
      AND r.partition IN (SELECT partition FROM appended)
)
SELECT partition, id FROM appended
