SELECT fingerprint, result::text AS result, events FROM {schema}.idempotency_keys WHERE key = $1
