-- CDC mode: parked messages to publish again, each key in its order: under block ($2) every row
-- of each key that has no failed row (a redrive turned it back to 'retrying'); under skip every
-- row that is not failed. A key whose head is not due yet (a retry, a sink that was down) waits
-- whole. Keys the relay holds in memory ($3) are left out, so they cannot fill the batch. Up to
-- $1 rows. Read only while the parked table has rows; it is small by design.
SELECT partition, seq, id, aggregate_type, aggregate_id, event_type, payload::text AS payload,
       headers::text AS headers, topic, created_at, attempts
FROM {schema}.outbox_parked p
WHERE p.state <> 'failed'
  AND NOT (p.aggregate_id = ANY ($3::text[]))
  AND NOT ($2 AND EXISTS (
    SELECT 1 FROM {schema}.outbox_parked f
    WHERE f.partition = p.partition AND f.aggregate_id = p.aggregate_id AND f.state = 'failed'))
  AND NOT EXISTS (
    SELECT 1 FROM {schema}.outbox_parked d
    WHERE d.partition = p.partition AND d.aggregate_id = p.aggregate_id AND d.seq <= p.seq
      AND d.state = 'retrying' AND d.next_attempt_at > now())
ORDER BY p.partition, p.aggregate_id, p.seq
LIMIT $1
