SELECT o.seq, CAST(o.id AS CHAR) AS id,
CAST(o.aggregate_type AS CHAR) AS aggregate_type,
CAST(o.aggregate_id AS CHAR) AS aggregate_id, CAST(o.event_type AS CHAR) AS event_type,
p.attempts, CAST(p.last_error AS CHAR) AS last_error, o.created_at
FROM {schema}.outbox_parked AS p JOIN {schema}.outbox AS o ON o.seq = p.seq
WHERE p.state = 'failed' ORDER BY p.seq LIMIT ?
