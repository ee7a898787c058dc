-- Extends the leases a member holds and its heartbeat. $1 member, $2 lease seconds
WITH beat AS (
    UPDATE {schema}.outbox_members SET heartbeat_at = now() WHERE member = $1
)
UPDATE {schema}.outbox_partitions SET lease_until = now() + make_interval(secs => $2)
WHERE owner = $1
RETURNING partition, epoch
