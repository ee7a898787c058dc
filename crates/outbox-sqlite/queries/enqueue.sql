-- Inserts a batch of messages in the caller's transaction, in one statement, in array order
-- (so `seq` follows it). ?1 is a JSON array of rows
-- [id, aggregate_type, aggregate_id, event_type, payload, headers, topic or null], with the
-- payload and headers as JSON text, stored byte for byte.
-- SQLite admits one writer at a time: a second transaction writing the same key waits for the
-- first to commit before it inserts, so `seq` order within a key is commit order.
INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, headers, topic)
SELECT json_extract(r.value, '$[0]'),
       json_extract(r.value, '$[1]'),
       json_extract(r.value, '$[2]'),
       json_extract(r.value, '$[3]'),
       json_extract(r.value, '$[4]'),
       json_extract(r.value, '$[5]'),
       json_extract(r.value, '$[6]')
FROM json_each(?1) AS r
ORDER BY r.key
