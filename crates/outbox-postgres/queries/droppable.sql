-- Segments every reader has passed: their whole txid range lies below the oldest transaction
-- that any partition's `done` snapshot saw running, so every row in them is visible in every
-- position (published, or copied into the parked table), and no transaction that could still
-- insert into them is alive. Also closed for at least $1 seconds (retention).
WITH horizon AS (
    SELECT min(pg_snapshot_xmin(lp.done)) AS xmin
    FROM generate_series(0, 63) AS g(partition)
    CROSS JOIN LATERAL (
        SELECT x.done FROM {schema}.outbox_positions AS x
        WHERE x.partition = g.partition
        ORDER BY x.id DESC
        LIMIT 1
    ) AS lp
)
SELECT s.name
FROM {schema}.outbox_segments AS s, horizon
WHERE s.hi <= horizon.xmin
  AND s.closed_at IS NOT NULL
  AND s.closed_at <= now() - make_interval(secs => $1)
ORDER BY s.lo
