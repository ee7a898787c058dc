DELETE FROM {schema}.idempotency_keys WHERE created_at < $1 LIMIT $2
