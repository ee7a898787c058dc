-- The naive handler's dedupe claim, in the message's own transaction: a first delivery inserts
-- a row (one row affected, so the effect runs), a redelivery inserts none. $2 is bound for the
-- same parameter list as the effect's insert and only echoed.
INSERT INTO {schema}.processed_messages (consumer, message_id) VALUES ('naive', $1)
ON CONFLICT DO NOTHING RETURNING $2::text
