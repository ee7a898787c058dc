-- The naive ingest: one message recorded per transaction, a redelivery absorbed by the key.
INSERT INTO {schema}.naive_inbox (id, key) VALUES ($1, $2) ON CONFLICT DO NOTHING
