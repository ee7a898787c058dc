-- Gives partitions back so other members can take them at once. $1 member, $2 partitions
UPDATE {schema}.outbox_partitions SET owner = NULL, lease_until = '-infinity'
WHERE owner = $1 AND partition = ANY ($2::int2[])
