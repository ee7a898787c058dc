-- Due pending rows of the member's partitions, in seq order, read through the pending index
-- (only pending rows, already in seq order: no sort, and the scan stops at the limit). A key
-- lives in one partition, so keeping whole partitions keeps every key's rows in order. Keys
-- whose earliest pending row waits for a retry, or (under the default `block` policy, ?5) that
-- hold a failed row, are skipped whole.
-- One read statement; no lock outlives it. Each row carries its partition's epoch: the fencing
-- token its result is recorded under.
-- Bytes: the candidates' payload lengths are summed in seq order, and only the rows within ?6
-- bytes (the first one whatever its size) are read whole; the rest stay pending untouched.
-- ?1 member, ?2 partitions (JSON array), ?3 now (unix ms), ?4 limit, ?5 failed rows block (1/0),
-- ?6 payload bytes
WITH owned AS (
    SELECT p.partition, p.epoch FROM outbox_partitions AS p
    WHERE p.owner = ?1 AND p.lease_until > ?3
      AND p.partition IN (SELECT value FROM json_each(?2))
), blocked AS (
    SELECT b.aggregate_id FROM outbox AS b
    WHERE b.state = 'pending' AND b.next_attempt_at > ?3
      AND b.partition IN (SELECT partition FROM owned)
    UNION
    SELECT f.aggregate_id FROM outbox AS f
    WHERE ?5 AND f.state = 'failed' AND f.partition IN (SELECT partition FROM owned)
)
, candidates AS (
    SELECT o.seq, octet_length(o.payload) AS bytes
    FROM outbox AS o INDEXED BY outbox_pending_idx
    WHERE o.state = 'pending'
      AND o.partition IN (SELECT partition FROM owned)
      AND (o.next_attempt_at IS NULL OR o.next_attempt_at <= ?3)
      AND o.aggregate_id NOT IN (SELECT aggregate_id FROM blocked)
    ORDER BY o.seq
    LIMIT ?4
), measured AS (
    SELECT c.seq,
           sum(c.bytes) OVER w AS bytes_upto,
           row_number() OVER w AS handed_upto
    FROM candidates AS c
    WINDOW w AS (ORDER BY c.seq ROWS UNBOUNDED PRECEDING)
)
SELECT o.seq, o.id, o.aggregate_type, o.aggregate_id, o.event_type, o.payload, o.headers,
       o.topic, CAST(round((julianday(o.created_at) - 2440587.5) * 86400000) AS INTEGER) AS created_ms,
       o.attempts,
       (SELECT w.epoch FROM owned AS w WHERE w.partition = o.partition) AS epoch
FROM measured AS m
JOIN outbox AS o ON o.seq = m.seq
WHERE m.bytes_upto <= ?6 OR m.handed_upto = 1
ORDER BY o.seq
