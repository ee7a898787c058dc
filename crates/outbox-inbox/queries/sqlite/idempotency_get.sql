SELECT fingerprint, result, events FROM idempotency_keys WHERE key = ?1
