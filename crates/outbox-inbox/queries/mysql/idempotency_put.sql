INSERT INTO {schema}.idempotency_keys (`key`, fingerprint, result, events) VALUES (?, ?, ?, ?)
