-- Every relay partition for `outbox status`: its owner under an unexpired lease, epoch and
-- lease, its latest position (the snapshot bounds as transaction ids, the cursor, when it was
-- taken, the running total published) and its parked and failed messages. One probe of the
-- positions' index per partition and one pass over the small parked table.
WITH parked AS (
    SELECT partition, count(*) AS parked, count(*) FILTER (WHERE state = 'failed') AS failed
    FROM {schema}.outbox_parked
    GROUP BY partition
)
SELECT p.partition::int4 AS partition,
       CASE WHEN p.lease_until > now() THEN p.owner END AS owner,
       p.epoch,
       CASE WHEN p.owner IS NOT NULL AND p.lease_until > '-infinity' THEN p.lease_until END
         AS lease_until,
       coalesce(k.parked, 0) AS parked,
       coalesce(k.failed, 0) AS failed,
       pg_snapshot_xmin(lp.done)::text::int8 AS done_xmin,
       pg_snapshot_xmax(lp.done)::text::int8 AS done_xmax,
       lp.cursor, lp.done_at, lp.published
FROM {schema}.outbox_partitions AS p
LEFT JOIN parked AS k ON k.partition = p.partition
LEFT JOIN LATERAL (
    SELECT x.done, x.cursor, x.done_at, x.published
    FROM {schema}.outbox_positions AS x
    WHERE x.partition = p.partition
    ORDER BY x.id DESC
    LIMIT 1
) AS lp ON true
ORDER BY p.partition
