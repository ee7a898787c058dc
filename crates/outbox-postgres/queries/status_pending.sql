-- Pending messages by partition, aggregate type, event type and topic, for `outbox status`:
-- the count of stats.sql (the claim's own predicate, per partition up to $1 rows, plus the
-- parked messages that are not failed) with the fields a route is chosen by, and the age of the
-- oldest message of each group. At most $2 groups. Reads what stats.sql reads, and the rows'
-- type columns; nothing writes.
WITH pos AS MATERIALIZED (
    SELECT lp.*, pg_current_snapshot() AS now_snap
    FROM generate_series(0, 63) AS g(partition)
    CROSS JOIN LATERAL (
        SELECT x.partition, x.done, x.done_bound, x.done_floor, x.cur, x.cursor
        FROM {schema}.outbox_positions AS x
        WHERE x.partition = g.partition
        ORDER BY x.id DESC
        LIMIT 1
    ) AS lp
), pend AS (
    SELECT pos.partition, w.seq, w.created_at, w.aggregate_type, w.event_type, w.topic
    FROM pos
    CROSS JOIN LATERAL (
        SELECT u.seq, u.created_at, u.aggregate_type, u.event_type, u.topic FROM (
            SELECT a.seq, a.created_at, a.txid, a.aggregate_type, a.event_type, a.topic
            FROM {schema}.outbox AS a
            WHERE a.partition = pos.partition AND a.seq > pos.done_floor
              AND a.txid >= pos.done_bound
              AND pg_visible_in_snapshot(a.txid, pos.now_snap)
            UNION ALL
            (SELECT r.seq, r.created_at, r.txid, r.aggregate_type, r.event_type, r.topic
             FROM {schema}.outbox AS r
             WHERE r.partition = pos.partition
               AND r.txid >= pg_snapshot_xmax(pos.done) AND r.txid < pos.done_bound
               AND pg_visible_in_snapshot(r.txid, pos.now_snap)
             OFFSET 0)
            UNION ALL
            (SELECT b.seq, b.created_at, b.txid, b.aggregate_type, b.event_type, b.topic
             FROM pg_snapshot_xip(pos.done) AS x(xid)
             CROSS JOIN LATERAL (
                 SELECT o.seq, o.created_at, o.txid, o.aggregate_type, o.event_type, o.topic
                 FROM {schema}.outbox AS o
                 WHERE o.partition = pos.partition AND o.txid = x.xid
                   AND pg_visible_in_snapshot(o.txid, pos.now_snap)
                 OFFSET 0
             ) AS b)
        ) AS u
        WHERE NOT (pos.cur IS NOT NULL AND pg_visible_in_snapshot(u.txid, pos.cur)
                   AND u.seq <= pos.cursor)
        LIMIT $1
    ) AS w
), rows AS (
    SELECT partition, created_at, aggregate_type, event_type, topic FROM pend
    UNION ALL
    SELECT partition, created_at, aggregate_type, event_type, topic
    FROM {schema}.outbox_parked WHERE state <> 'failed'
)
SELECT partition::int4 AS partition, aggregate_type, event_type, topic,
       count(*) AS pending,
       extract(epoch FROM now() - min(created_at))::float8 AS oldest_pending_age_seconds
FROM rows
GROUP BY partition, aggregate_type, event_type, topic
ORDER BY min(created_at)
LIMIT $2
