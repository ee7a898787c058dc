-- The insert an application of the seed articles runs, one row per business transaction
-- (writers mode's variant (c)). The id comes from the table's default.
INSERT INTO {schema}.naive_outbox (aggregate_type, aggregate_id, event_type, payload)
VALUES ($1, $2, $3, $4::jsonb)
