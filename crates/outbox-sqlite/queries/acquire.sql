-- Takes up to ?4 free or expired partitions for member ?1. Runs inside the rebalance's
-- BEGIN IMMEDIATE transaction, so no other member can take the same ones meanwhile.
-- ?2 lease end (unix ms), ?3 now (unix ms)
UPDATE outbox_partitions
SET owner = ?1, lease_until = ?2, epoch = epoch + 1
WHERE partition IN (
    SELECT partition FROM outbox_partitions
    WHERE owner IS NULL OR lease_until < ?3
    ORDER BY random()
    LIMIT ?4)
RETURNING partition
