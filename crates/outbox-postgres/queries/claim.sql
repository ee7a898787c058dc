-- Due pending rows of the member's partitions, in seq order. Keys whose earliest pending row
-- waits for a retry, or that hold a failed row, are skipped whole, so a later row never
-- overtakes an earlier one of the same key. Reads only; no lock outlives the statement.
-- $1 member, $2 partitions (int2[]), $3 limit
SELECT o.seq, o.id, o.aggregate_type, o.aggregate_id, o.event_type,
       o.payload::text AS payload, o.headers::text AS headers, o.topic, o.created_at, o.attempts
FROM {schema}.outbox AS o
WHERE o.state = 'pending'
  AND o.partition = ANY (ARRAY(
        SELECT p.partition FROM {schema}.outbox_partitions AS p
        WHERE p.owner = $1 AND p.lease_until > now() AND p.partition = ANY ($2::int2[])))
  AND (o.next_attempt_at IS NULL OR o.next_attempt_at <= now())
  AND o.aggregate_id <> ALL (ARRAY(
        SELECT b.aggregate_id FROM {schema}.outbox AS b
        WHERE b.state = 'pending' AND b.attempts > 0 AND b.next_attempt_at > now()
          AND b.partition = ANY ($2::int2[])
        UNION
        SELECT f.aggregate_id FROM {schema}.outbox AS f
        WHERE f.state = 'failed' AND f.partition = ANY ($2::int2[])))
ORDER BY o.seq
LIMIT $3
