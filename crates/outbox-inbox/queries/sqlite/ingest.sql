-- Records a batch of received messages, once per id: a message already in the inbox (a
-- redelivery, or a duplicate within the batch) is skipped, and only the ids inserted now come
-- back; the caller queues exactly those for processing, in the same transaction.
-- ?1 the batch as a JSON array of [id, source, type, key, payload (JSON text), payload format,
-- headers (JSON text), source position or null]
INSERT INTO inbox_messages (id, source, type, key, payload, payload_format, headers, source_position)
SELECT json_extract(j.value, '$[0]'), json_extract(j.value, '$[1]'), json_extract(j.value, '$[2]'),
       json_extract(j.value, '$[3]'), json_extract(j.value, '$[4]'), json_extract(j.value, '$[5]'),
       json_extract(j.value, '$[6]'), json_extract(j.value, '$[7]')
FROM json_each(?1) AS j
WHERE true
ORDER BY j.key
ON CONFLICT (id) DO NOTHING
RETURNING id
