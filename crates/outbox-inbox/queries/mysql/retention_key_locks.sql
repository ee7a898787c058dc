DELETE FROM {schema}.idempotency_key_locks
    WHERE created_at < $1
      AND NOT EXISTS (SELECT 1 FROM {schema}.idempotency_keys AS k
                      WHERE k.`key` = {schema}.idempotency_key_locks.`key`)
    LIMIT $2
