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
-- A row whose key has a parked message ahead of it is flagged `held`: the record step parks it
-- too, so the key stays in order, and its payload is never read. `window_rows` counts a
-- partition's rows before the final LIMIT: fewer than $2 means the window is exhausted.
--
-- Bytes: the rows to hand out are measured in seq order (`bytes_upto`, the running sum of their
-- payloads' text length) and a payload is returned only while the sum stays within $7 bytes, or
-- for the first row to hand out when $8 says an oversized one may go alone. The other rows come
-- back without their payload: not handed out, so the record step stops the cursor before the
-- first of them. The running sum sits under the final LIMIT, which stops it: a payload past
-- the $3 rows is never rendered. The caller sizes $3 from the payloads it has seen, so a claim
-- renders few it cannot hand out.
-- The statement also reads the seq high-water mark; being read before the *next* claim's
-- snapshot, it is a valid floor for that snapshot (see `PgStore::claim`).
--
-- $1 partitions (int2[]) and $6 the epochs this member holds them at (ownership is checked when
-- the batch is recorded, not here: a claim writes nothing), $2 rows per partition, $3 rows in
-- all, $4 floor hint, $5 failed rows block their key, $7 payload bytes to hand out, $8 the first
-- row to hand out gets its payload whatever its size
WITH pos AS MATERIALIZED (
    SELECT p.partition, p.epoch, lp.done, lp.done_floor, lp.done_at, lp.published,
           COALESCE(lp.cur, pg_current_snapshot()) AS cur,
           CASE WHEN lp.cur IS NULL THEN GREATEST(lp.done_floor, $4::bigint) ELSE lp.cur_floor END AS cur_floor,
           COALESCE(lp.cur_at, now()) AS cur_at,
           CASE WHEN lp.cur IS NULL THEN 0 ELSE lp.cursor END AS cursor
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
             WHERE a.partition = pos.partition
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
             WHERE (b.partition::text || '/' || b.txid::text) = ANY (ARRAY(
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
), flagged AS (
    SELECT win.*,
           (win.seq IS NOT NULL AND EXISTS (
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
    LIMIT $3
)
SELECT m.partition, m.epoch, m.done::text AS done, m.done_floor, m.done_at,
       m.published, m.cur::text AS cur, m.cur_floor, m.cur_at, m.cursor,
       m.window_rows, m.seq, m.txid::text AS txid, m.id, m.aggregate_type,
       m.aggregate_id, m.event_type,
       CASE WHEN m.seq IS NOT NULL AND NOT m.held
                 AND (m.bytes_upto <= $7::int8 OR (m.handed_upto = 1 AND $8::boolean))
            THEN m.payload::text END AS payload,
       m.headers::text AS headers, m.topic, m.created_at, m.held, m.bytes_upto, m.handed_upto,
       (SELECT CASE WHEN s.is_called THEN s.last_value ELSE s.last_value - 1 END
        FROM {schema}.outbox_seq_v2 AS s) AS seq_high
FROM measured AS m
ORDER BY m.seq NULLS FIRST
