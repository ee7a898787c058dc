-- A message's journey (Store::journey): the message with id $1, or the latest $3 messages of key
-- $2 and, wherever it lies, the key's head that holds it back (its first parked row that is
-- retrying or failed), newest first, with its parked row if any, the head that holds it back if it
-- waits (through the parked table's key index), and the earliest kept position of its partition
-- that has passed it (the broker acknowledged it by then). "Passed" is the complement of the
-- claim's pending predicate (gauges.sql): visible in `done` and not above the floor of a later
-- transaction, or inside the open window at or below the cursor. A key is found through its
-- partition's (partition, seq) index, newest first; an id has no index (the table is
-- insert-only and partitioned by transaction id) and is a scan, bounded by the caller's
-- statement timeout.
WITH found AS (
    (SELECT o.id, o.seq, o.partition, o.txid, o.aggregate_type, o.aggregate_id, o.event_type,
            o.topic, o.headers, o.payload, o.created_at
     FROM {schema}.outbox AS o
     WHERE $2::text IS NOT NULL
       AND o.partition = ((hashtext($2::text) & 2147483647) % 64)::smallint
       AND o.aggregate_id = $2::text
     ORDER BY o.seq DESC
     LIMIT $3)
    UNION
    (SELECT o.id, o.seq, o.partition, o.txid, o.aggregate_type, o.aggregate_id, o.event_type,
            o.topic, o.headers, o.payload, o.created_at
     FROM (SELECT h.partition, h.seq
           FROM {schema}.outbox_parked AS h
           WHERE $2::text IS NOT NULL
             AND h.partition = ((hashtext($2::text) & 2147483647) % 64)::smallint
             AND h.aggregate_id = $2::text AND h.state <> 'waiting'
           ORDER BY h.seq
           LIMIT 1) AS head
     JOIN {schema}.outbox AS o ON o.partition = head.partition AND o.seq = head.seq)
    UNION ALL
    (SELECT o.id, o.seq, o.partition, o.txid, o.aggregate_type, o.aggregate_id, o.event_type,
            o.topic, o.headers, o.payload, o.created_at
     FROM {schema}.outbox AS o
     WHERE $1::uuid IS NOT NULL AND o.id = $1::uuid
     LIMIT 1)
)
SELECT f.id, f.seq, f.partition::int4 AS partition, f.txid::text::int8 AS txid,
       f.aggregate_type, f.aggregate_id, f.event_type, f.topic, f.headers, f.payload,
       f.created_at,
       k.state, k.attempts, k.next_attempt_at, k.last_error, k.parked_at,
       passed.first_at, latest.recorded_at AS latest_at, held.id AS held_by
FROM found AS f
LEFT JOIN {schema}.outbox_parked AS k ON k.partition = f.partition AND k.seq = f.seq
LEFT JOIN LATERAL (
    SELECT h.id
    FROM {schema}.outbox_parked AS h
    WHERE k.state = 'waiting' AND h.partition = f.partition AND h.aggregate_id = f.aggregate_id
      AND h.state <> 'waiting' AND h.seq < f.seq
    ORDER BY h.seq
    LIMIT 1
) AS held ON true
LEFT JOIN LATERAL (
    SELECT min(x.recorded_at) AS first_at
    FROM {schema}.outbox_positions AS x
    WHERE x.partition = f.partition
      AND (NOT ((f.seq > x.done_floor AND f.txid >= x.done_bound)
                OR (f.txid >= pg_snapshot_xmax(x.done) AND f.txid < x.done_bound)
                OR f.txid IN (SELECT pg_snapshot_xip(x.done)))
           OR (x.cur IS NOT NULL AND pg_visible_in_snapshot(f.txid, x.cur)
               AND f.seq <= x.cursor))
) AS passed ON true
LEFT JOIN LATERAL (
    SELECT x.recorded_at
    FROM {schema}.outbox_positions AS x
    WHERE x.partition = f.partition
    ORDER BY x.id DESC
    LIMIT 1
) AS latest ON true
ORDER BY f.seq DESC
