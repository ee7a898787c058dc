-- The raw SQL insert of the outbox's SQL contract, as a producer without the writer API writes
-- it (writers mode's variant (b)): the table's defaults and trigger do the rest.
INSERT INTO {schema}.outbox (aggregate_type, aggregate_id, event_type, payload)
VALUES ($1, $2, $3, $4::jsonb)
