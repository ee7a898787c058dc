-- Detaching without blocking writers or claims (CONCURRENTLY runs outside a transaction).
ALTER TABLE {schema}.outbox DETACH PARTITION {segment} CONCURRENTLY
