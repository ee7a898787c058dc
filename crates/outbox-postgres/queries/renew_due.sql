-- The partitions a member owns, with their epochs, extending only the leases that have run a
-- third of their length: afterwards every lease has at least two thirds left. Renewing less
-- often than the once-a-second rebalance keeps this small table from piling up row versions
-- while a long transaction holds the horizon. $1 member, $2 lease seconds
WITH renewed AS (
    UPDATE {schema}.outbox_partitions SET lease_until = now() + make_interval(secs => $2)
    WHERE owner = $1 AND lease_until < now() + make_interval(secs => $2 * 2.0 / 3.0)
    RETURNING partition, epoch
)
SELECT partition, epoch FROM renewed
UNION ALL
SELECT partition, epoch FROM {schema}.outbox_partitions
WHERE owner = $1 AND lease_until >= now() + make_interval(secs => $2 * 2.0 / 3.0)
