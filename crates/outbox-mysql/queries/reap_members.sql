DELETE FROM {schema}.outbox_members
WHERE heartbeat_at < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND
