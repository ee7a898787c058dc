INSERT INTO {schema}.idempotency_keys (key, fingerprint, result, events) VALUES ($1, $2, $3::jsonb, $4)
