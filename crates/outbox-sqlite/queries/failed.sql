-- Up to ?1 failed messages, oldest first, with their errors (through the failed-rows index).
SELECT seq, id, aggregate_type, aggregate_id, event_type, payload, headers, topic,
       CAST(round((julianday(created_at) - 2440587.5) * 86400000) AS INTEGER) AS created_ms,
       attempts, last_error
FROM outbox
WHERE state = 'failed'
ORDER BY seq
LIMIT ?1
