-- Graceful exit: gives back every partition and the membership. $1 member
WITH gone AS (
    DELETE FROM {schema}.outbox_members WHERE member = $1
)
UPDATE {schema}.outbox_partitions SET owner = NULL, lease_until = '-infinity' WHERE owner = $1
