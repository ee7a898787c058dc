UPDATE {schema}.idempotency_key_locks SET stored = TRUE WHERE `key` = ?
