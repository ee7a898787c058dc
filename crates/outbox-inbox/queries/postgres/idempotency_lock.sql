SELECT pg_try_advisory_xact_lock(hashtextextended('outbox-idempotency:' || $1 || ':' || $2, 0))
