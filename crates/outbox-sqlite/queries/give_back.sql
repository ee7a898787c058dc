-- Gives partitions back so other members can take them at once. ?1 member, ?2 partitions (JSON array)
UPDATE outbox_partitions SET owner = NULL, lease_until = 0
WHERE owner = ?1 AND partition IN (SELECT value FROM json_each(?2))
