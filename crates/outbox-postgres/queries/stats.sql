-- Counts for `outbox status`, from the positions and the parked table; nothing here reads the
-- message table's history. Pending is the claim's own predicate (visible now, not yet passed by
-- the partition's position), counted per partition up to $1 rows, plus the parked messages that
-- are not failed; partitions holding $2 parked messages have stopped advancing. The oldest pending age is the oldest of each partition's next window row and
-- of the parked messages still to deliver.
WITH pos AS MATERIALIZED (
    SELECT lp.*, pg_current_snapshot() AS now_snap
    FROM generate_series(0, 63) AS g(partition)
    CROSS JOIN LATERAL (
        SELECT x.partition, x.done, x.done_bound, x.done_floor, x.cur, x.cursor, x.published
        FROM {schema}.outbox_positions AS x
        WHERE x.partition = g.partition
        ORDER BY x.id DESC
        LIMIT 1
    ) AS lp
), pend AS (
    SELECT pos.partition, w.seq, w.created_at
    FROM pos
    CROSS JOIN LATERAL (
        SELECT u.seq, u.created_at FROM (
            SELECT a.seq, a.created_at, a.txid FROM {schema}.outbox AS a
            WHERE a.partition = pos.partition AND a.seq > pos.done_floor
              AND a.txid >= pos.done_bound
              AND pg_visible_in_snapshot(a.txid, pos.now_snap)
            UNION ALL
            (SELECT r.seq, r.created_at, r.txid FROM {schema}.outbox AS r
             WHERE r.partition = pos.partition
               AND r.txid >= pg_snapshot_xmax(pos.done) AND r.txid < pos.done_bound
               AND pg_visible_in_snapshot(r.txid, pos.now_snap)
             OFFSET 0)
            UNION ALL
            (SELECT b.seq, b.created_at, b.txid
             FROM pg_snapshot_xip(pos.done) AS x(xid)
             CROSS JOIN LATERAL (
                 SELECT o.seq, o.created_at, o.txid FROM {schema}.outbox AS o
                 WHERE o.partition = pos.partition AND o.txid = x.xid
                   AND pg_visible_in_snapshot(o.txid, pos.now_snap)
                 OFFSET 0
             ) AS b)
        ) AS u
        WHERE NOT (pos.cur IS NOT NULL AND pg_visible_in_snapshot(u.txid, pos.cur)
                   AND u.seq <= pos.cursor)
        LIMIT $1
    ) AS w
)
SELECT
  (SELECT count(*) FROM pend)
    + (SELECT count(*) FROM {schema}.outbox_parked WHERE state <> 'failed') AS pending,
  (SELECT extract(epoch FROM now() - least(
      (SELECT min(created_at) FROM pend),
      (SELECT min(created_at) FROM {schema}.outbox_parked WHERE state <> 'failed')))::float8)
    AS oldest_pending_age_seconds,
  (SELECT count(*) FROM {schema}.outbox_parked WHERE state = 'failed') AS failed,
  (SELECT coalesce(sum(published), 0)::int8 FROM pos) AS published,
  (SELECT count(*) FROM {schema}.outbox_parked WHERE state = 'retrying') AS retrying,
  (SELECT count(*) FROM {schema}.outbox_parked) AS parked,
  (SELECT count(*) FROM (SELECT partition FROM {schema}.outbox_parked GROUP BY partition
                         HAVING count(*) >= $2) AS f) AS partitions_at_parking_cap,
  (SELECT count(*) FROM (SELECT DISTINCT partition, aggregate_id
                         FROM {schema}.outbox_parked) AS k) AS blocked_keys
