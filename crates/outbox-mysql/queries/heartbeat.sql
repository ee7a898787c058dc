INSERT INTO {schema}.outbox_members (member, heartbeat_at)
VALUES (?, UTC_TIMESTAMP(6))
ON DUPLICATE KEY UPDATE heartbeat_at = VALUES(heartbeat_at)
