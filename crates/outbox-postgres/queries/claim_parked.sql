-- Parked messages that are due, for the owned partitions: for every parked key whose head (its
-- lowest parked seq) is due, that key's parked rows in seq order, so a released key drains in
-- order at batch speed. With $3 (the default `block` policy) a failed head holds its key; with
-- `skip` failed rows are passed over and the rest of the key flows.
-- Reads only the small parked table. $1 partitions (int2[]), $2 rows per key, $3 failed rows
-- block their key, $4 rows in all
WITH heads AS (
    SELECT DISTINCT ON (k.partition, k.aggregate_id)
           k.partition, k.aggregate_id, k.state, k.next_attempt_at
    FROM {schema}.outbox_parked AS k
    WHERE k.partition = ANY ($1::int2[]) AND (k.state <> 'failed' OR $3::boolean)
    ORDER BY k.partition, k.aggregate_id, k.seq
)
SELECT r.partition, r.seq, r.id, r.aggregate_type, r.aggregate_id, r.event_type,
       r.payload::text AS payload, r.headers::text AS headers, r.topic, r.created_at,
       r.attempts, r.state
FROM heads AS h
CROSS JOIN LATERAL (
    SELECT * FROM {schema}.outbox_parked AS x
    WHERE x.partition = h.partition AND x.aggregate_id = h.aggregate_id AND x.state <> 'failed'
    ORDER BY x.seq
    LIMIT $2
) AS r
WHERE h.state <> 'failed' AND (h.next_attempt_at IS NULL OR h.next_attempt_at <= now())
ORDER BY r.seq
LIMIT $4
