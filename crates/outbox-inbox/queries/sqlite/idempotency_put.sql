INSERT INTO idempotency_keys (key, fingerprint, result, events) VALUES (?1, ?2, ?3, ?4)
