-- The pending rows of one partition, at most $1 of them: the body of a LATERAL subquery, included
-- by stats.sql, status_pending.sql and gauges.sql (`{pending_rows}`), with `pos` in scope
-- (partition, done, done_bound, done_floor, cur, cursor, and now_snap: the reader's snapshot).
-- Returns seq and txid, then whatever further columns of the row the including statement
-- asks for (`o.`-qualified).
--
-- Pending is the claim's own predicate: visible in now_snap, not visible in `done`, and not
-- passed by the open window (visible in `cur` with a seq at or below `cursor`). It is split the
-- way claim_window.sql splits the window, so each part walks an index range that starts past
-- what the position has passed: during a long window (a million rows one transaction wrote,
-- half drained) nothing here reads the half already sent. One predicate applied after a scan of
-- the partition's whole txid range read every one of those rows before its LIMIT; a scrape then
-- cost the database 0.5–1.3 s in the middle of such a drain.
--   N.  No open window (`cur` NULL): txids at or above `done_bound`, seq above `done_floor`.
--   C.  An open window: txids at or above `done_bound` that `cur` sees committed, seq above
--       max(cursor, done_floor), walked on (partition, seq).
--   L.  An open window: txids at or above `done_bound` that `cur` does not see: its running
--       list, one probe per txid, and those at or above its xmax, one range of (partition,
--       txid).
--   R.  txids from xmax(done) up to `done_bound`, found by a loose scan (one probe per txid),
--       and B. those `done` saw running (its xip list): per txid, one range of (partition,
--       txid, seq) above the cursor when `cur` sees the txid committed, whole otherwise.
-- Every part is ordered by its index and the statement runs with bitmap scans and sorts priced
-- out (READ_BEGIN in store/mod.rs), so no plan reads a whole range before the LIMIT applies.
SELECT u.* FROM (
    -- N
    (SELECT o.seq, o.txid{cols} FROM {schema}.outbox AS o
     WHERE pos.cur IS NULL
       AND o.partition = pos.partition AND o.seq > pos.done_floor
       AND o.txid >= pos.done_bound
       AND pg_visible_in_snapshot(o.txid, pos.now_snap)
     ORDER BY o.seq
     LIMIT $1)
    UNION ALL
    -- C
    (SELECT o.seq, o.txid{cols} FROM {schema}.outbox AS o
     WHERE pos.cur IS NOT NULL
       AND o.partition = pos.partition AND o.seq > GREATEST(pos.cursor, pos.done_floor)
       AND o.txid >= pos.done_bound AND o.txid < pg_snapshot_xmax(pos.cur)
       AND pg_visible_in_snapshot(o.txid, pos.cur)
     ORDER BY o.seq
     LIMIT $1)
    UNION ALL
    -- L, the running list of `cur`
    (SELECT o.* FROM pg_snapshot_xip(pos.cur) AS x(xid)
     CROSS JOIN LATERAL (
         SELECT o.seq, o.txid{cols} FROM {schema}.outbox AS o
         WHERE o.partition = pos.partition AND o.txid = x.xid
         ORDER BY o.seq
         LIMIT $1
     ) AS o
     WHERE x.xid >= pos.done_bound AND pg_visible_in_snapshot(x.xid, pos.now_snap))
    UNION ALL
    -- L, at or above the xmax of `cur`
    (SELECT o.seq, o.txid{cols} FROM {schema}.outbox AS o
     WHERE pos.cur IS NOT NULL
       AND o.partition = pos.partition
       AND o.txid >= GREATEST(pg_snapshot_xmax(pos.cur), pos.done_bound)
       AND pg_visible_in_snapshot(o.txid, pos.now_snap)
     ORDER BY o.txid
     LIMIT $1)
    UNION ALL
    -- R and B
    (SELECT o.* FROM (
         WITH RECURSIVE t(txid) AS (
             (SELECT r.txid FROM {schema}.outbox AS r
              WHERE r.partition = pos.partition
                AND r.txid >= pg_snapshot_xmax(pos.done) AND r.txid < pos.done_bound
              ORDER BY r.txid
              LIMIT 1)
             UNION ALL
             SELECT (SELECT r.txid FROM {schema}.outbox AS r
                     WHERE r.partition = pos.partition
                       AND r.txid > t.txid AND r.txid < pos.done_bound
                     ORDER BY r.txid
                     LIMIT 1)
             FROM t
             WHERE t.txid IS NOT NULL
         )
         SELECT t.txid FROM t WHERE t.txid IS NOT NULL
         UNION ALL
         SELECT x.xid FROM pg_snapshot_xip(pos.done) AS x(xid)
     ) AS y
     CROSS JOIN LATERAL (
         SELECT o.seq, o.txid{cols} FROM {schema}.outbox AS o
         WHERE o.partition = pos.partition AND o.txid = y.txid
           AND o.seq > CASE WHEN pos.cur IS NOT NULL AND pg_visible_in_snapshot(y.txid, pos.cur)
                            THEN pos.cursor
                            ELSE '-9223372036854775808'::int8 END
         ORDER BY o.seq
         LIMIT $1
     ) AS o
     WHERE pg_visible_in_snapshot(y.txid, pos.now_snap))
) AS u
LIMIT $1
