UPDATE {schema}.outbox_positions
SET owner = NULL, lease_until = '1970-01-01 00:00:00'
WHERE owner = ? AND FIND_IN_SET(part, ?)
