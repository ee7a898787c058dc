-- Inserts a batch of messages in the caller's transaction, in one statement.
-- First it takes a transaction-level advisory lock per distinct key (sorted, so two writers
-- cannot deadlock): a second transaction writing the same key waits until the first commits
-- before it draws its `seq`, so `seq` order within a key is commit order.
INSERT INTO {schema}.outbox (id, aggregate_type, aggregate_id, event_type, payload, headers, topic)
SELECT r.id, r.aggregate_type, r.aggregate_id, r.event_type, r.payload::jsonb, r.headers::jsonb, r.topic
FROM (
        SELECT count(*) AS n
        FROM (
            SELECT pg_advisory_xact_lock(hashtext('outbox:{schema}'), hashtext(k.key))
            FROM (SELECT DISTINCT key FROM unnest($3::text[]) AS key ORDER BY 1) AS k
        ) AS locked
     ) AS lock,
     unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[])
        WITH ORDINALITY AS r(id, aggregate_type, aggregate_id, event_type, payload, headers, topic, ord)
WHERE lock.n >= 0
ORDER BY r.ord
