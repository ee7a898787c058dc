UPDATE {schema}.outbox_positions
SET lease_until = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND WHERE owner = ?
