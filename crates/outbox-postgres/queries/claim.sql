-- Due pending rows of the member's partitions. Each partition contributes a prefix of its
-- pending rows in seq order (at most $4 rows), read through the (partition, seq) index, so the
-- cost follows the batch size, not the backlog. A key lives in one partition, so a prefix per
-- partition keeps every key's rows in order. Keys whose earliest pending row waits for a retry,
-- or (when $5, the default `block` policy) that hold a failed row, are skipped whole.
-- Reads only; no lock outlives the statement.
-- $1 member, $2 partitions (int2[]), $3 limit, $4 rows per partition, $5 failed rows block
WITH owned AS (
    SELECT p.partition FROM {schema}.outbox_partitions AS p
    WHERE p.owner = $1 AND p.lease_until > now() AND p.partition = ANY ($2::int2[])
), blocked AS (
    SELECT b.aggregate_id FROM {schema}.outbox AS b
    WHERE b.state = 'pending' AND b.attempts > 0 AND b.next_attempt_at > now()
      AND b.partition = ANY ($2::int2[])
    UNION
    SELECT f.aggregate_id FROM {schema}.outbox AS f
    WHERE $5::boolean AND f.state = 'failed' AND f.partition = ANY ($2::int2[])
)
SELECT o.seq, o.id, o.aggregate_type, o.aggregate_id, o.event_type,
       o.payload::text AS payload, o.headers::text AS headers, o.topic, o.created_at, o.attempts
FROM owned
CROSS JOIN LATERAL (
    SELECT * FROM {schema}.outbox AS x
    WHERE x.partition = owned.partition
      AND x.state = 'pending'
      AND (x.next_attempt_at IS NULL OR x.next_attempt_at <= now())
      AND x.aggregate_id <> ALL (ARRAY(SELECT aggregate_id FROM blocked))
    ORDER BY x.seq
    LIMIT $4
) AS o
ORDER BY o.seq
LIMIT $3
