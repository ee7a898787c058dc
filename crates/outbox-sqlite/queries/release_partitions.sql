-- Graceful exit: gives back every partition of a member. ?1 member
UPDATE outbox_partitions SET owner = NULL, lease_until = 0 WHERE owner = ?1
