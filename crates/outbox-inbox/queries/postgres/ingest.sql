-- Records a batch of received messages, once per id: a message already in the inbox (a
-- redelivery, or a duplicate within the batch) is skipped, and only the ids inserted now come
-- back; the caller queues exactly those for processing, in the same transaction. One statement
-- per batch, in the caller's transaction (the ingest daemon commits before it acknowledges the
-- broker).
-- $1 ids, $2 sources, $3 types, $4 keys, $5 payloads (JSON text), $6 payload formats,
-- $7 headers (JSON text), $8 source positions
INSERT INTO {schema}.inbox_messages
    (id, source, type, key, payload, payload_format, headers, source_position)
SELECT r.id, r.source, r.type, r.key, r.payload::jsonb, r.payload_format, r.headers::jsonb,
       r.source_position
FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[],
            $8::text[])
     WITH ORDINALITY AS r(id, source, type, key, payload, payload_format, headers, source_position, ord)
ORDER BY r.ord
ON CONFLICT (id) DO NOTHING
RETURNING id
