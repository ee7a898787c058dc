-- Reads the next rows of each owned partition's window, in seq order, without writing.
--
-- Per partition the latest position gives `done`, and either an open window (`cur`, `cursor`)
-- or none, in which case this statement's own snapshot becomes `cur`. The window is the rows
-- whose txid is visible in `cur` but not in `done`. Every such txid falls in exactly one of
-- three parts. Each part reads only rows above the cursor, in seq order, at most $3 of them,
-- through an index that returns them in that order, so a claim's cost follows its batch: never
-- the table's history, never the size of a transaction, whatever stays open elsewhere.
--   B.  txids `done` saw running (its xip list) that `cur` sees committed: per txid, one range
--       of the (partition, txid, seq) index from the cursor on.
--   A1. txids from xmax(done) up to `done_bound`, an id assigned after `done` was taken (the
--       id of the transaction that recorded it): transactions that already had an id when
--       `done` was taken but were above its xmax, and those that began before it was recorded.
--       Their txids are found by a loose scan of the (partition, txid, seq) index (one probe
--       per txid present in the partition, whatever its number of rows); each is then read
--       like a B txid.
--   A2. txids at or above `done_bound`: those transactions got their id after the floor
--       `done_floor` was read, and draw a row's seq only after they have an id, so every row
--       they wrote has a seq above that floor. The (partition, seq) index is walked upward from
--       max(cursor, done_floor) over a span of at most $13 seqs, and stops after $3 rows of the
--       window. What it steps over is rows newer than `cur` and rows of transactions still being
--       written; those are invisible to this statement, so the index scan skips them itself, a
--       heap visit each, unseen by any LIMIT: the span is what bounds that work. When the span
--       ends below the floor this statement read, the claim returns no row above its end
--       (`scan_to`) and, returning fewer than $3 rows, leaves the window open with the cursor
--       there (ticket.rs `read_to`). `txid >= xmin(done)` prunes the segments below the window
--       at run time, so the walk probes only the segments that can hold it, however many days
--       of segments retention keeps.
-- The claim transaction runs with enable_sort off (see `read_claim` in store/claim.rs): each part has
-- an index path that yields its rows in the order it asks for, and any plan that would read a
-- whole txid range or partition and sort it instead is priced out, whatever the statistics.
--
-- The floor: `outbox_seq_floor()` (migration 5) reads the sequence under its buffer lock. A
-- plain `SELECT last_value FROM` the sequence does not, and can see the value `nextval` writes
-- ahead into the WAL (up to 32 above anything handed out, every 32 calls), which once made A2
-- skip rows. Read in this statement, after `cur` was taken and before the transaction that records
-- `cur` gets the id that becomes its bound, it is a valid floor for the next window (see
-- docs/engine.md). The sequence is checked to be uncached and increasing at migrate and start.
--
-- A partition holding $6 parked messages reads no window: it stops advancing (rather than copy
-- an unbounded backlog behind a stuck key) while its parked keys drain. The count comes with
-- the position (kept by every record), so the parked table is not read for it.
-- A row whose key has a parked message ahead of it is flagged `held`: the record step parks it
-- too, so the key stays in order, and its payload is never read. Only partitions whose position
-- counts parked messages probe the parked table, one index probe per row returned.
-- `window_rows` counts a partition's rows before the final LIMIT: fewer than $3 means the
-- window is exhausted.
--
-- Bytes: the rows to hand out are measured in seq order (`bytes_upto`, the running sum of their
-- payloads' text length) and a payload is returned only while the sum stays within $7 bytes, or
-- for the first row to hand out when $8 says an oversized one may go alone. The other rows come
-- back without their payload: not handed out, so the record step stops the cursor before the
-- first of them. The running sum sits under the final LIMIT, which stops it: a payload past
-- the $4 rows is never rendered. The caller sizes $4 from the payloads it has seen, so a claim
-- renders few it cannot hand out.
--
-- $1 partitions (int2[]) and $2 the epochs this member holds them at (ownership is checked when
-- the batch is recorded, not here: a claim writes nothing), $3 rows per partition at most, $4 rows in
-- all, $5 failed rows block their key, $6 parked rows per partition at which the partition's
-- window stops advancing (its parked keys still drain; the relay warns), $7 payload bytes to
-- hand out, $8 the first row to hand out gets its payload whatever its size, $13 the seqs A2's
-- walk may span (`walk_span` in store/claim.rs), $14 the rows each partition of $1 may return (`lim`,
-- at most $3; below it for partitions that had no rows at the last claim).
--
-- A claim ahead (read while the previous batch is still being published, see `claim_ahead` in
-- store/mod.rs) continues an open window from where that batch will leave it: $9 cursor, $10 cur,
-- $11 cur_floor and $12 cur_at per partition of $1 replace the recorded window (NULL, or arrays
-- shorter than $1, where there is nothing to continue). `done` is still read from the table:
-- recording a batch that keeps its window open never changes it.
WITH floor AS MATERIALIZED (
    SELECT {schema}.outbox_seq_floor() AS seq_high
), pos AS MATERIALIZED (
    SELECT p.partition, p.epoch, lp.id AS prev_id, lp.parked, lp.done, lp.done_bound,
           floor.seq_high, COALESCE(p.lim, $3) AS lim,
           lp.done_floor, lp.done_at, lp.published, lp.cur, lp.cur_bound,
           CASE WHEN p.at_cur IS NOT NULL THEN p.at_cur_floor
                WHEN lp.opens THEN GREATEST(lp.done_floor, floor.seq_high)
                ELSE lp.cur_floor END AS cur_floor,
           COALESCE(p.at_cur_at, lp.cur_at, now()) AS cur_at,
           CASE WHEN p.at_cur IS NOT NULL THEN p.at_cursor
                WHEN lp.opens THEN 0
                ELSE lp.cursor END AS cursor,
           lp.parked >= $6 AS parked_full,
           -- Rendered once per partition here, not once per row below.
           lp.done::text AS done_text, lp.done_bound::text AS done_bound_text,
           lp.cur::text AS cur_text, lp.cur_bound::text AS cur_bound_text
    FROM unnest($1::int2[], $2::int8[], $9::int8[], $10::text[], $11::int8[], $12::timestamptz[],
                $14::int8[])
         AS p(partition, epoch, at_cursor, at_cur, at_cur_floor, at_cur_at, lim)
    CROSS JOIN floor
    CROSS JOIN LATERAL (
        SELECT x.id, x.parked, x.done, x.done_bound, x.done_floor, x.done_at,
               COALESCE(p.at_cur::pg_snapshot, x.cur, pg_current_snapshot()) AS cur,
               (x.cur IS NULL AND p.at_cur IS NULL) AS opens,
               x.cur_bound, x.cur_floor, x.cur_at, x.cursor, x.published
        FROM {schema}.outbox_positions AS x
        WHERE x.partition = p.partition
        ORDER BY x.id DESC
        LIMIT 1
    ) AS lp
), win AS (
    SELECT pos.*, w.scan_to, w.seq, w.txid, w.id, w.aggregate_type, w.aggregate_id,
           w.event_type, w.payload, w.headers, w.topic, w.created_at,
           COALESCE(w.window_rows, 0) AS window_rows
    FROM pos
    LEFT JOIN LATERAL (
        WITH probed AS MATERIALIZED (
            -- B and A1: the transactions each names, every one read alike from the cursor on,
            -- at most `lim` rows, in seq order.
            SELECT r.* FROM (
                -- A1: a loose scan of the txids present in the partition.
                (WITH RECURSIVE t(txid) AS (
                     (SELECT o.txid FROM {schema}.outbox AS o
                      WHERE o.partition = pos.partition
                        AND o.txid >= pg_snapshot_xmax(pos.done) AND o.txid < pos.done_bound
                      ORDER BY o.txid
                      LIMIT 1)
                     UNION ALL
                     SELECT (SELECT o.txid FROM {schema}.outbox AS o
                             WHERE o.partition = pos.partition
                               AND o.txid > t.txid AND o.txid < pos.done_bound
                             ORDER BY o.txid
                             LIMIT 1)
                     FROM t
                     WHERE t.txid IS NOT NULL
                 )
                 SELECT t.txid FROM t WHERE t.txid IS NOT NULL)
                UNION ALL
                -- B: the txids `done` saw running.
                SELECT x.xid FROM pg_snapshot_xip(pos.done) AS x(xid)
            ) AS y(txid)
            CROSS JOIN LATERAL (
                SELECT o.seq, o.txid, o.id, o.aggregate_type, o.aggregate_id, o.event_type,
                       o.payload, o.headers, o.topic, o.created_at
                FROM {schema}.outbox AS o
                WHERE o.partition = pos.partition AND o.txid = y.txid AND o.seq > pos.cursor
                ORDER BY o.seq
                LIMIT pos.lim
            ) AS r
            WHERE NOT pos.parked_full AND pg_visible_in_snapshot(y.txid, pos.cur)
            ORDER BY r.seq
            LIMIT pos.lim
        ), walk AS (
            -- A2's walk, over at most $13 seqs from the floor and the cursor on, and no further
            -- than the last of a full batch of B and A1 rows. The span is the budget, not a
            -- LIMIT: rows of transactions still running are invisible to this statement, so the
            -- index scan steps over them without returning them, and only a bound on the index
            -- range bounds that work. The run condition on `mine_upto` stops the walk at the
            -- (`lim` + 1)th row of its own. `txid >= xmin(done)` filters no row it could meet (a
            -- row above `done_floor` is not visible in `done`), but prunes older segments at run
            -- time.
            SELECT v.* FROM (
                SELECT a.*, count(*) FILTER (WHERE a.mine) OVER (ORDER BY a.seq) AS mine_upto
                FROM (
                    SELECT e.seq, e.txid, e.id, e.aggregate_type, e.aggregate_id, e.event_type,
                           e.payload, e.headers, e.topic, e.created_at,
                           (e.txid >= pos.done_bound
                            AND pg_visible_in_snapshot(e.txid, pos.cur)) AS mine
                    FROM {schema}.outbox AS e
                    WHERE NOT pos.parked_full
                      AND e.partition = pos.partition
                      AND e.seq > GREATEST(pos.cursor, pos.done_floor)
                      AND e.seq <= LEAST(GREATEST(pos.cursor, pos.done_floor) + $13,
                                         (SELECT CASE WHEN count(*) >= pos.lim THEN max(q.seq) END
                                          FROM probed AS q))
                      AND e.txid >= pg_snapshot_xmin(pos.done)
                    ORDER BY e.seq
                ) AS a
            ) AS v
            WHERE v.mine_upto <= pos.lim
        )
        SELECT lim.*, count(lim.seq) OVER () AS window_rows, edge.scan_to
        FROM (
            -- Where the walk's span ended, if rows of this window can lie past it: it read every
            -- row up to there, and nothing above. Past `cur_floor` there are none: every row
            -- visible in `cur` drew its seq before `cur` was taken, and `cur_floor` was read
            -- after that (for a window this statement opens it is the floor read here, after its
            -- snapshot). The floor read now only grows past it, so a window already walked to
            -- its `cur_floor` is not stepped on through seqs it cannot hold, a position
            -- appended per claim, while other partitions draw seqs faster than a span per claim.
            -- Rows above are not returned (B or A1 rows there could sit above A2 rows it never
            -- reached), and a window that returns fewer than `lim` rows is not read to its end:
            -- the record moves its cursor to `scan_to`.
            SELECT CASE WHEN NOT pos.parked_full
                             AND GREATEST(pos.cursor, pos.done_floor) + $13
                                 < LEAST(pos.seq_high, pos.cur_floor)
                        THEN GREATEST(pos.cursor, pos.done_floor) + $13 END AS scan_to
        ) AS edge
        LEFT JOIN LATERAL (
            -- Counted here, per partition and after its LIMIT, so that no sort of every row by
            -- partition is needed to count them.
            SELECT u.* FROM (
                SELECT k.seq, k.txid, k.id, k.aggregate_type, k.aggregate_id, k.event_type,
                       k.payload, k.headers, k.topic, k.created_at
                FROM walk AS k WHERE k.mine
                UNION ALL
                SELECT * FROM probed
            ) AS u
            WHERE u.seq <= COALESCE(edge.scan_to, 9223372036854775807)
            ORDER BY u.seq
            LIMIT pos.lim
        ) AS lim ON true
    ) AS w ON true
), flagged AS (
    SELECT win.*,
           (win.seq IS NOT NULL AND win.parked > 0 AND EXISTS (
                SELECT 1 FROM {schema}.outbox_parked AS k
                WHERE k.partition = win.partition AND k.aggregate_id = win.aggregate_id
                  AND (k.state <> 'failed' OR $5::boolean))) AS held
    FROM win
), measured AS (
    SELECT f.*,
           sum(CASE WHEN f.seq IS NULL OR f.held THEN 0 ELSE octet_length(f.payload::text) END)
               OVER w AS bytes_upto,
           count(*) FILTER (WHERE f.seq IS NOT NULL AND NOT f.held) OVER w AS handed_upto
    FROM flagged AS f
    WINDOW w AS (ORDER BY f.seq NULLS FIRST ROWS UNBOUNDED PRECEDING)
    ORDER BY f.seq NULLS FIRST
    LIMIT $4
)
SELECT m.partition, m.epoch, m.prev_id, m.scan_to, m.parked, m.parked_full, m.done_text AS done,
       m.done_bound_text AS done_bound, m.done_floor, m.done_at,
       m.published, m.cur_text AS cur, m.cur_bound_text AS cur_bound, m.cur_floor,
       m.cur_at, m.cursor, m.window_rows, m.seq, m.txid::text AS txid, m.id,
       m.aggregate_type, m.aggregate_id, m.event_type,
       CASE WHEN m.seq IS NOT NULL AND NOT m.held
                 AND (m.bytes_upto <= $7::int8 OR (m.handed_upto = 1 AND $8::boolean))
            THEN m.payload::text END AS payload,
       m.headers::text AS headers, m.topic, m.created_at, m.held, m.bytes_upto, m.handed_upto
FROM measured AS m
ORDER BY m.seq NULLS FIRST
