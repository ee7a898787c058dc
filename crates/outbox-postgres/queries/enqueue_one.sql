-- Inserts one message in the caller's transaction: the same as enqueue.sql for a batch of one,
-- with scalar parameters instead of arrays (the common case, and cheaper to plan and run).
-- It first takes the transaction-level advisory lock of its key, so a second transaction writing
-- the same key waits until the first commits before it draws its `seq`.
WITH locked AS (
    SELECT pg_advisory_xact_lock(hashtext('outbox:{schema}'), hashtext($3))
)
INSERT INTO {schema}.outbox (id, aggregate_type, aggregate_id, event_type, payload, headers, topic)
SELECT $1, $2, $3, $4, $5::jsonb, $6::jsonb, $7
FROM locked
