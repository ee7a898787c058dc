-- outbox schema, version 5: the engine's correctness fixes (see docs/engine.md).
--
-- 1. Claims probe one transaction's rows *from the cursor on*: a transaction of a million rows
--    costs each claim one batch of index entries, not the whole transaction. The txid index
--    gains `seq` as a key column (it was an INCLUDE column, unordered within a txid).
--    Building it takes a SHARE lock on each segment while it reads it: writers wait for the
--    build (about a second per million rows on the machine of docs/performance.md). Upgrade
--    when the backlog is small.
-- 2. Positions are compare-and-append: each position names the one it follows (`prev_id`),
--    and a position has at most one successor (a unique index), so a record that was abandoned
--    and lands late finds its predecessor already followed and writes nothing.
-- 3. Each position carries its partition's number of parked messages, so a claim knows without
--    reading the parked table whether a partition has any, and whether it is at the cap.
-- 4. Parked rows are updated at every retry: room on their pages keeps those updates HOT.
-- 5. The claims' seq floor is read under the sequence's buffer lock, in one function that claims
--    and tests share, and assumes a sequence that hands out increasing values one at a time:
--    checked.

CREATE INDEX outbox_partition_txid_seq_idx ON {schema}.outbox (partition, txid, seq);
DROP INDEX {schema}.outbox_partition_txid_idx;

ALTER TABLE {schema}.outbox_positions
    ADD COLUMN prev_id bigint,
    ADD COLUMN parked  bigint NOT NULL DEFAULT 0;
-- At most one successor per position. Positions written before this version have no
-- `prev_id` (NULLs are distinct), and are never a latest position again after the rows below.
CREATE UNIQUE INDEX outbox_positions_successor_idx
    ON {schema}.outbox_positions (partition, prev_id);

-- Every partition's latest position again, following the old latest, with its parked count.
INSERT INTO {schema}.outbox_positions
    (partition, epoch, done, done_bound, done_floor, done_at, cur, cur_bound, cur_floor, cur_at,
     cursor, published, prev_id, parked)
SELECT lp.partition, lp.epoch, lp.done, lp.done_bound, lp.done_floor, lp.done_at, lp.cur,
       lp.cur_bound, lp.cur_floor, lp.cur_at, lp.cursor, lp.published, lp.id,
       (SELECT count(*) FROM {schema}.outbox_parked AS k WHERE k.partition = lp.partition)
FROM generate_series(0, 63) AS g(partition)
CROSS JOIN LATERAL (
    SELECT x.* FROM {schema}.outbox_positions AS x
    WHERE x.partition = g.partition
    ORDER BY x.id DESC
    LIMIT 1
) AS lp;

ALTER TABLE {schema}.outbox_parked SET (fillfactor = 70);

-- The highest seq handed out so far, read under the sequence's buffer lock. A plain
-- `SELECT last_value FROM outbox_seq_v2` is not: it reads the tuple after letting go of the
-- lock, and can see the value `nextval` writes ahead into the WAL (up to 32 above anything
-- handed out, every 32 calls and after each checkpoint), which made claims skip rows. NULL
-- before the first value: 0 is then a floor.
CREATE FUNCTION {schema}.outbox_seq_floor() RETURNS bigint
LANGUAGE sql VOLATILE PARALLEL SAFE AS $$
  SELECT COALESCE(pg_sequence_last_value('{schema}.outbox_seq_v2'::regclass), 0)
$$;

DO $$
BEGIN
  IF EXISTS (SELECT 1 FROM pg_sequence
             WHERE seqrelid = '{schema}.outbox_seq_v2'::regclass
               AND (seqcache <> 1 OR seqincrement <> 1 OR seqcycle)) THEN
    RAISE EXCEPTION 'sequence {schema}.outbox_seq_v2 must have CACHE 1, INCREMENT 1 and NO CYCLE'
      USING HINT = 'ALTER SEQUENCE {schema}.outbox_seq_v2 CACHE 1 INCREMENT 1 NO CYCLE';
  END IF;
END
$$;
