INSERT INTO {schema}.idempotency_key_locks (`key`) VALUES (?) ON DUPLICATE KEY UPDATE `key` = `key`
