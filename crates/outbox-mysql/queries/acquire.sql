UPDATE {schema}.outbox_positions
SET owner = ?, lease_until = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, epoch = epoch + 1
WHERE FIND_IN_SET(part, ?)
