DELETE FROM {schema}.idempotency_keys
    WHERE key IN (SELECT key FROM {schema}.idempotency_keys
                  WHERE created_at < $1
                  LIMIT $2)
