-- Reads the next rows of each owned partition's window, in seq order, without writing.
--
-- Per partition the latest position gives `done`, and either an open window (`cur`, `cursor`)
-- or none, in which case this statement's own snapshot becomes `cur`. The window is the rows
-- whose txid is visible in `cur` but not in `done`, read in two parts whose cost follows the
-- batch, never the table's history, whatever transaction stays open elsewhere:
--   A. transactions that began after `done` (txid >= xmax(done)): their rows were all inserted
--      after `done` was taken, so their seqs lie above `done_floor`. The (partition, seq) index
--      is walked upward from max(cursor, done_floor) and stops after $2 rows of the window;
--      what it steps over is only rows newer than `cur` or still uncommitted.
--   B. transactions `done` saw running (its xip list): one index probe each, on the
--      (partition || '/' || txid) expression index, which nothing else can use.
-- Runtime pruning of the txid-ranged segments keeps part A on the newest segments.
--
-- A partition holding $7 parked messages reads no window: it stops advancing (rather than copy
-- an unbounded backlog behind a stuck key) while its parked keys drain.
-- A row whose key has a parked message ahead of it is flagged `held`: the record step parks it
-- too, so the key stays in order. `window_rows` counts a partition's rows before the final
-- LIMIT: fewer than $2 means the window is exhausted.
-- The statement also reads the seq high-water mark; being read before the *next* claim's
-- snapshot, it is a valid floor for that snapshot (see `PgStore::claim`).
--
-- $1 partitions (int2[]) and $6 the epochs this member holds them at (ownership is checked when
-- the batch is recorded, not here: a claim writes nothing), $2 rows per partition, $3 rows in
-- all, $4 floor hint, $5 failed rows block their key, $7 parked rows per partition at which the
-- partition's window stops advancing (its parked keys still drain; the relay warns)
WITH pos AS MATERIALIZED (
    SELECT p.partition, p.epoch, lp.done, lp.done_floor, lp.done_at, lp.published,
           COALESCE(lp.cur, pg_current_snapshot()) AS cur,
           CASE WHEN lp.cur IS NULL THEN GREATEST(lp.done_floor, $4::bigint) ELSE lp.cur_floor END AS cur_floor,
           COALESCE(lp.cur_at, now()) AS cur_at,
           CASE WHEN lp.cur IS NULL THEN 0 ELSE lp.cursor END AS cursor,
           (SELECT count(*) FROM (SELECT 1 FROM {schema}.outbox_parked AS k
                                  WHERE k.partition = p.partition LIMIT $7) AS c) >= $7
             AS parked_full
    FROM unnest($1::int2[], $6::int8[]) AS p(partition, epoch)
    CROSS JOIN LATERAL (
        SELECT x.done, x.done_floor, x.done_at, x.cur, x.cur_floor, x.cur_at, x.cursor, x.published
        FROM {schema}.outbox_positions AS x
        WHERE x.partition = p.partition
        ORDER BY x.id DESC
        LIMIT 1
    ) AS lp
), win AS (
    SELECT pos.*, w.seq, w.txid, w.id, w.aggregate_type, w.aggregate_id, w.event_type,
           w.payload, w.headers, w.topic, w.created_at,
           count(w.seq) OVER (PARTITION BY pos.partition) AS window_rows
    FROM pos
    LEFT JOIN LATERAL (
        SELECT u.* FROM (
            (SELECT a.seq, a.txid, a.id, a.aggregate_type, a.aggregate_id, a.event_type,
                    a.payload, a.headers, a.topic, a.created_at
             FROM {schema}.outbox AS a
             WHERE NOT pos.parked_full
               AND a.partition = pos.partition
               AND a.seq > GREATEST(pos.cursor, pos.done_floor)
               AND a.txid >= pg_snapshot_xmax(pos.done)
               AND a.txid < pg_snapshot_xmax(pos.cur)
               AND pg_visible_in_snapshot(a.txid, pos.cur)
             ORDER BY a.seq
             LIMIT $2)
            UNION ALL
            (SELECT b.seq, b.txid, b.id, b.aggregate_type, b.aggregate_id, b.event_type,
                    b.payload, b.headers, b.topic, b.created_at
             FROM {schema}.outbox AS b
             WHERE NOT pos.parked_full
               AND (b.partition::text || '/' || b.txid::text) = ANY (ARRAY(
                       SELECT pos.partition::text || '/' || x::text
                       FROM pg_snapshot_xip(pos.done) AS x))
               AND pg_visible_in_snapshot(b.txid, pos.cur)
               AND b.seq > pos.cursor
             -- A fence: asked for no order, the probes cannot be turned into an ordered walk.
             OFFSET 0)
        ) AS u
        ORDER BY u.seq
        LIMIT $2
    ) AS w ON true
)
SELECT win.partition, win.epoch, win.parked_full, win.done::text AS done, win.done_floor, win.done_at,
       win.published, win.cur::text AS cur, win.cur_floor, win.cur_at, win.cursor,
       win.window_rows, win.seq, win.txid::text AS txid, win.id, win.aggregate_type,
       win.aggregate_id, win.event_type, win.payload::text AS payload,
       win.headers::text AS headers, win.topic, win.created_at,
       (win.seq IS NOT NULL AND EXISTS (
           SELECT 1 FROM {schema}.outbox_parked AS k
           WHERE k.partition = win.partition AND k.aggregate_id = win.aggregate_id
             AND (k.state <> 'failed' OR $5::boolean))) AS held,
       (SELECT CASE WHEN s.is_called THEN s.last_value ELSE s.last_value - 1 END
        FROM {schema}.outbox_seq_v2 AS s) AS seq_high
FROM win
ORDER BY win.seq NULLS FIRST
LIMIT $3
