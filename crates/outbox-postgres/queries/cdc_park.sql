-- CDC mode: parks messages the relay could not publish ('failed'), those queued behind them in
-- their key ('waiting'), and those it holds too long while their key's sink is down or whose
-- slot was lost ('retrying', due at their next attempt), in the order given. A row of the table
-- keeps its own seq, so a polling relay that meets the same row (after the slot was lost) finds
-- it parked already (a conflict on its seq) and a key's parked rows sort as polling sorts them,
-- unless that seq would sort it before a row of its key parked earlier (a logical message's:
-- the caller passes NULL for a row after one in the same batch): then, as a logical message (no
-- row), it draws a fresh seq from the outbox's sequence, in stream (commit) order. A message
-- parked before (same id: the stream sent it again after a reconnection) is not parked twice.
-- $1 keys, $2 ids, $3 aggregate types, $4 event types, $5 payloads (JSON text), $6 headers
-- (JSON text), $7 topics, $8 created_at, $9 states, $10 attempts, $11 errors, $12 the rows'
-- seqs (NULL for a logical message), $13 next attempts (NULL but for 'retrying').
INSERT INTO {schema}.outbox_parked
    (partition, seq, aggregate_id, id, aggregate_type, event_type, payload, headers, topic,
     created_at, state, attempts, last_error, next_attempt_at)
SELECT ((hashtext(u.k) & 2147483647) % 64)::smallint,
       CASE WHEN u.s IS NOT NULL AND NOT EXISTS (
                SELECT 1 FROM {schema}.outbox_parked AS later
                WHERE later.partition = ((hashtext(u.k) & 2147483647) % 64)::smallint
                  AND later.aggregate_id = u.k AND later.seq > u.s)
            THEN u.s
            ELSE nextval('{schema}.outbox_seq_v2') END,
       u.k, u.i, u.t, u.e, u.p::jsonb, u.h::jsonb, u.tp, u.c, u.st, u.a, u.err, u.na
FROM unnest($1::text[], $2::uuid[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[],
            $8::timestamptz[], $9::text[], $10::int[], $11::text[], $12::bigint[],
            $13::timestamptz[])
     WITH ORDINALITY AS u(k, i, t, e, p, h, tp, c, st, a, err, s, na, n)
WHERE NOT EXISTS (SELECT 1 FROM {schema}.outbox_parked x WHERE x.id = u.i)
ORDER BY u.n
ON CONFLICT (partition, seq) DO NOTHING
