-- Fills the naive table with one row per (key, payload) pair of the two arrays, in one
-- statement, and returns the ids the table's default gave them, so the latency ledger can match
-- each one when it reaches the broker.
INSERT INTO {schema}.naive_outbox (aggregate_type, aggregate_id, event_type, payload)
SELECT 'bench', key, 'created', payload::jsonb
FROM unnest($1::text[], $2::text[]) AS r(key, payload)
RETURNING id
