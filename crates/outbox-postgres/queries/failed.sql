-- Up to $1 failed messages, oldest first, with their errors. Reads only the small parked table.
SELECT id, seq, aggregate_type, aggregate_id, event_type, attempts, last_error, created_at
FROM {schema}.outbox_parked
WHERE state = 'failed'
ORDER BY seq
LIMIT $1
