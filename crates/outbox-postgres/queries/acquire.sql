-- Takes up to $3 free or expired partitions for member $1, skipping any another member is
-- taking right now. The candidates are picked once (a materialised CTE), so the LIMIT holds
-- even if the planner would rescan a subquery. $2 lease seconds
WITH picked AS MATERIALIZED (
    SELECT partition FROM {schema}.outbox_partitions
    WHERE owner IS NULL OR lease_until < now()
    ORDER BY random()
    LIMIT $3
    FOR UPDATE SKIP LOCKED
)
UPDATE {schema}.outbox_partitions AS p
SET owner = $1, lease_until = now() + make_interval(secs => $2), epoch = p.epoch + 1
FROM picked
WHERE p.partition = picked.partition
RETURNING p.partition, p.epoch
