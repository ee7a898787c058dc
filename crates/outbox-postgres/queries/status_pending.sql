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
{pending_rows}
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
