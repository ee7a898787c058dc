-- Every relay partition for `outbox status`: its owner under an unexpired lease, epoch and
-- lease end (unix ms), and its messages set aside (waiting for a later attempt, or failed)
-- through their own small indexes. ?1 now (unix ms)
WITH aside AS (
    SELECT partition, count(*) AS parked, sum(state = 'failed') AS failed FROM (
        SELECT partition, state FROM outbox INDEXED BY outbox_waiting_idx
        WHERE state = 'pending' AND next_attempt_at IS NOT NULL
        UNION ALL
        SELECT partition, state FROM outbox INDEXED BY outbox_failed_idx
        WHERE state = 'failed')
    GROUP BY partition
)
SELECT p.partition, CASE WHEN p.lease_until > ?1 THEN p.owner END AS owner, p.epoch,
       CASE WHEN p.owner IS NOT NULL AND p.lease_until > 0 THEN p.lease_until END AS lease_until,
       coalesce(a.parked, 0) AS parked, coalesce(a.failed, 0) AS failed
FROM outbox_partitions AS p
LEFT JOIN aside AS a ON a.partition = p.partition
ORDER BY p.partition
