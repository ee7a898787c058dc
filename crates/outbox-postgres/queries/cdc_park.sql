-- CDC mode: parks messages the relay could not publish ('failed') and those queued behind them
-- in their key ('waiting'), in the order given. Each draws a seq from the outbox's sequence, so
-- a key's parked order is the order the stream delivered it (commit order), whatever seq its
-- row had. A message parked before (same id: the stream sent it again after a reconnection) is
-- not parked twice.
-- $1 keys, $2 ids, $3 aggregate types, $4 event types, $5 payloads (JSON text), $6 headers
-- (JSON text), $7 topics, $8 created_at, $9 states, $10 attempts, $11 errors.
INSERT INTO {schema}.outbox_parked
    (partition, seq, aggregate_id, id, aggregate_type, event_type, payload, headers, topic,
     created_at, state, attempts, last_error)
SELECT ((hashtext(u.k) & 2147483647) % 64)::smallint, nextval('{schema}.outbox_seq_v2'),
       u.k, u.i, u.t, u.e, u.p::jsonb, u.h::jsonb, u.tp, u.c, u.st, u.a, u.err
FROM unnest($1::text[], $2::uuid[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[],
            $8::timestamptz[], $9::text[], $10::int[], $11::text[])
     WITH ORDINALITY AS u(k, i, t, e, p, h, tp, c, st, a, err, n)
WHERE NOT EXISTS (SELECT 1 FROM {schema}.outbox_parked x WHERE x.id = u.i)
ORDER BY u.n
