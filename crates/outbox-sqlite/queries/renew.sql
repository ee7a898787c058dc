-- Extends the leases a member holds. ?1 member, ?2 lease end (unix ms)
UPDATE outbox_partitions SET lease_until = ?2
WHERE owner = ?1
RETURNING partition
