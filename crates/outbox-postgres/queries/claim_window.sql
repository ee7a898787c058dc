-- Reads the next rows of each owned partition's window, in seq order, without writing.
--
-- Per partition the latest position gives `done`, and either an open window (`cur`, `cursor`)
-- or none, in which case this statement's own snapshot becomes `cur`. The window is the rows
-- whose txid is visible in `cur` but not in `done`. Every such txid falls in exactly one of three
-- parts, each read through an index in a way whose cost follows the batch, never the table's
-- history, whatever transaction stays open elsewhere:
--   B.  the ids `done` saw running (its xip list): one (partition, txid) probe each (a join,
--       as `txid = ANY(array)` is no index condition for xid8);
--   A1. ids from xmax(done) up to `done_bound`, an id assigned after `done` was taken: the
--       transactions that already had an id when `done` was taken but were above its xmax, and
--       those that began between `done` and the statement that recorded it. A short txid range
--       on the (partition, txid) index: only recent transactions.
--   A2. ids at or above `done_bound`: those transactions began after `done`, so every row they
--       wrote was inserted after it and has a seq above `done_floor`. The (partition, seq) index
--       is walked upward from max(cursor, done_floor) and stops after $2 rows of the window;
--       what it steps over is only rows newer than `cur` or still uncommitted.
--   A3. the safety net under A2's floor: rows of those same transactions whose seq is at or
--       below `done_floor` anyway. The floor is read before `done` was taken and every such
--       transaction got its id after, and PostgreSQL evaluates the `txid` default before the
--       `seq` identity, so there should be none; but a 10-minute run at 1,000 events/s once
--       found 7 such rows, which A2 alone skipped. A3 reads the window's own txid range on the
--       (partition, txid) index, and only while the cursor is still below the floor (the first
--       claim of a window, normally), so it costs one pass over a window, not one per claim.
-- B, A1 and A3 are fenced (OFFSET 0, no ORDER BY): asked for no order, the planner cannot turn their
-- probes into an ordered walk of the partition. A2 states its txid condition through
-- pg_visible_in_snapshot, which no index can serve, so its only path is the ordered seq walk
-- (its one sargable bound is an upper one, for pruning).
--
-- A partition holding $7 parked messages reads no window: it stops advancing (rather than copy
-- an unbounded backlog behind a stuck key) while its parked keys drain.
-- A row whose key has a parked message ahead of it is flagged `held`: the record step parks it
-- too, so the key stays in order, and its payload is never read. `window_rows` counts a
-- partition's rows before the final LIMIT: fewer than $2 means the window is exhausted.
--
-- Bytes: the rows to hand out are measured in seq order (`bytes_upto`, the running sum of their
-- payloads' text length) and a payload is returned only while the sum stays within $8 bytes, or
-- for the first row to hand out when $9 says an oversized one may go alone. The other rows come
-- back without their payload: not handed out, so the record step stops the cursor before the
-- first of them. The running sum sits under the final LIMIT, which stops it: a payload past
-- the $3 rows is never rendered. The caller sizes $3 from the payloads it has seen, so a claim
-- renders few it cannot hand out.
-- The statement also reads the seq high-water mark; being read before the *next* claim's
-- snapshot, it is a valid floor for that snapshot (see `PgStore::claim`).
--
-- $1 partitions (int2[]) and $6 the epochs this member holds them at (ownership is checked when
-- the batch is recorded, not here: a claim writes nothing), $2 rows per partition, $3 rows in
-- all, $4 floor hint, $5 failed rows block their key, $7 parked rows per partition at which the
-- partition's window stops advancing (its parked keys still drain; the relay warns), $8 payload
-- bytes to hand out, $9 the first row to hand out gets its payload whatever its size.
--
-- A claim ahead (read while the previous batch is still being published, see `claim_ahead` in
-- store.rs) continues an open window from where that batch will leave it: $10 cursor, $11 cur,
-- $12 cur_floor and $13 cur_at per partition of $1 replace the recorded window (NULL, or arrays
-- shorter than $1, where there is nothing to continue). `done` is still read from the table:
-- recording a batch that keeps its window open never changes it.
WITH pos AS MATERIALIZED (
    SELECT p.partition, p.epoch, lp.done, lp.done_bound, lp.done_floor, lp.done_at, lp.published,
           lp.cur,
           lp.cur_bound,
           CASE WHEN p.at_cur IS NOT NULL THEN p.at_cur_floor
                WHEN lp.opens THEN GREATEST(lp.done_floor, $4::bigint)
                ELSE lp.cur_floor END AS cur_floor,
           COALESCE(p.at_cur_at, lp.cur_at, now()) AS cur_at,
           CASE WHEN p.at_cur IS NOT NULL THEN p.at_cursor
                WHEN lp.opens THEN 0
                ELSE lp.cursor END AS cursor,
           (SELECT count(*) FROM (SELECT 1 FROM {schema}.outbox_parked AS k
                                  WHERE k.partition = p.partition LIMIT $7) AS c) >= $7
             AS parked_full,
           -- "txid >= done_bound", as a snapshot no index can serve (see A2).
           (lp.done_bound::text || ':' || lp.done_bound::text || ':')::pg_snapshot AS bound_snap,
           -- Rendered once per partition here, not once per row below.
           lp.done::text AS done_text, lp.done_bound::text AS done_bound_text,
           lp.cur::text AS cur_text, lp.cur_bound::text AS cur_bound_text
    FROM unnest($1::int2[], $6::int8[], $10::int8[], $11::text[], $12::int8[], $13::timestamptz[])
         AS p(partition, epoch, at_cursor, at_cur, at_cur_floor, at_cur_at)
    CROSS JOIN LATERAL (
        SELECT x.done, x.done_bound, x.done_floor, x.done_at,
               COALESCE(p.at_cur::pg_snapshot, x.cur, pg_current_snapshot()) AS cur,
               (x.cur IS NULL AND p.at_cur IS NULL) AS opens,
               x.cur_bound, x.cur_floor, x.cur_at, x.cursor, x.published
        FROM {schema}.outbox_positions AS x
        WHERE x.partition = p.partition
        ORDER BY x.id DESC
        LIMIT 1
    ) AS lp
), held_keys AS MATERIALIZED (
    -- Keys with a parked message that holds them back (few: parking is capped).
    SELECT DISTINCT k.partition, k.aggregate_id
    FROM {schema}.outbox_parked AS k
    WHERE k.partition = ANY ($1::int2[]) AND (k.state <> 'failed' OR $5::boolean)
), win AS (
    SELECT pos.*, w.seq, w.txid, w.id, w.aggregate_type, w.aggregate_id, w.event_type,
           w.payload, w.headers, w.topic, w.created_at,
           COALESCE(w.window_rows, 0) AS window_rows
    FROM pos
    LEFT JOIN LATERAL (
        -- Counted here, per partition and after its LIMIT, so that no sort of every row by
        -- partition is needed to count them.
        SELECT lim.*, count(*) OVER () AS window_rows FROM (
        SELECT u.* FROM (
            (SELECT a.seq, a.txid, a.id, a.aggregate_type, a.aggregate_id, a.event_type,
                    a.payload, a.headers, a.topic, a.created_at
             FROM {schema}.outbox AS a
             WHERE NOT pos.parked_full
               AND a.partition = pos.partition
               AND a.seq > GREATEST(pos.cursor, pos.done_floor)
               AND NOT pg_visible_in_snapshot(a.txid, pos.bound_snap)
               AND pg_visible_in_snapshot(a.txid, pos.cur)
               -- Implied by the line above; spelled out so that segments above `cur` (made
               -- ahead, empty) are pruned at run time. An upper bound alone never makes the
               -- txid index attractive for an ordered read.
               AND a.txid < pg_snapshot_xmax(pos.cur)
             ORDER BY a.seq
             LIMIT $2)
            UNION ALL
            (SELECT r.seq, r.txid, r.id, r.aggregate_type, r.aggregate_id, r.event_type,
                    r.payload, r.headers, r.topic, r.created_at
             FROM {schema}.outbox AS r
             WHERE NOT pos.parked_full
               AND r.partition = pos.partition
               AND r.txid >= pg_snapshot_xmax(pos.done)
               AND r.txid < pos.done_bound
               AND pg_visible_in_snapshot(r.txid, pos.cur)
             OFFSET 0)
            UNION ALL
            (SELECT l.seq, l.txid, l.id, l.aggregate_type, l.aggregate_id, l.event_type,
                    l.payload, l.headers, l.topic, l.created_at
             FROM {schema}.outbox AS l
             WHERE NOT pos.parked_full
               AND pos.cursor < pos.done_floor
               AND l.partition = pos.partition
               AND l.txid >= pos.done_bound
               AND l.txid < pg_snapshot_xmax(pos.cur)
               -- Not an index condition on purpose: only the txid range may drive this part.
               AND l.seq - pos.done_floor <= 0
               AND pg_visible_in_snapshot(l.txid, pos.cur)
             OFFSET 0)
            UNION ALL
            (SELECT b.seq, b.txid, b.id, b.aggregate_type, b.aggregate_id, b.event_type,
                    b.payload, b.headers, b.topic, b.created_at
             FROM pg_snapshot_xip(pos.done) AS x(xid)
             CROSS JOIN LATERAL (
                 SELECT * FROM {schema}.outbox AS o
                 WHERE NOT pos.parked_full
                   AND o.partition = pos.partition
                   AND o.txid = x.xid
                   AND pg_visible_in_snapshot(o.txid, pos.cur)
                 OFFSET 0
             ) AS b)
        ) AS u
        -- Outside the fences on purpose: inside, `seq > cursor` would offer the planner the
        -- seq index for B and A1 (a walk of the whole partition) instead of their txid probes.
        WHERE u.seq > pos.cursor
        ORDER BY u.seq
        LIMIT $2
        ) AS lim
    ) AS w ON true
), flagged AS (
    SELECT win.*, (h.aggregate_id IS NOT NULL) AS held
    FROM win
    LEFT JOIN held_keys AS h ON h.partition = win.partition AND h.aggregate_id = win.aggregate_id
), measured AS (
    SELECT f.*,
           sum(CASE WHEN f.seq IS NULL OR f.held THEN 0 ELSE octet_length(f.payload::text) END)
               OVER w AS bytes_upto,
           count(*) FILTER (WHERE f.seq IS NOT NULL AND NOT f.held) OVER w AS handed_upto
    FROM flagged AS f
    WINDOW w AS (ORDER BY f.seq NULLS FIRST ROWS UNBOUNDED PRECEDING)
    ORDER BY f.seq NULLS FIRST
    LIMIT $3
)
SELECT m.partition, m.epoch, m.parked_full, m.done_text AS done,
       m.done_bound_text AS done_bound, m.done_floor, m.done_at,
       m.published, m.cur_text AS cur, m.cur_bound_text AS cur_bound, m.cur_floor,
       m.cur_at, m.cursor, m.window_rows, m.seq, m.txid::text AS txid, m.id,
       m.aggregate_type, m.aggregate_id, m.event_type,
       CASE WHEN m.seq IS NOT NULL AND NOT m.held
                 AND (m.bytes_upto <= $8::int8 OR (m.handed_upto = 1 AND $9::boolean))
            THEN m.payload::text END AS payload,
       m.headers::text AS headers, m.topic, m.created_at, m.held, m.bytes_upto, m.handed_upto,
       (SELECT CASE WHEN s.is_called THEN s.last_value ELSE s.last_value - 1 END
        FROM {schema}.outbox_seq_v2 AS s) AS seq_high
FROM measured AS m
ORDER BY m.seq NULLS FIRST
