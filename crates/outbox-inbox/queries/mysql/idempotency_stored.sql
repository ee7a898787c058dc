SELECT stored FROM {schema}.idempotency_key_locks WHERE `key` = ? FOR UPDATE
