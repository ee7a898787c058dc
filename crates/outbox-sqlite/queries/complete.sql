-- Records one batch of publish outcomes in one statement. Fenced: a row is changed only while
-- the member owns its partition at the epoch it claimed the row under, so a member that lost
-- the partition, even one that took it back since, records nothing (the owner delivers the row
-- again, with the same id).
-- ?1 member, ?2 outcomes as a JSON array of [seq, state, error or null, retry delay in ms,
-- epoch at claim]; state `deferred` (the sink was not tried) waits like `pending` but spends
-- no attempt,
-- ?3 now (unix ms), ?4 now (RFC 3339 text, for published_at)
UPDATE outbox AS o
SET state           = CASE WHEN r.state = 'deferred' THEN 'pending' ELSE r.state END,
    attempts        = o.attempts + CASE WHEN r.state = 'deferred' THEN 0 ELSE 1 END,
    next_attempt_at = CASE WHEN r.state IN ('pending', 'deferred') THEN ?3 + r.delay_ms END,
    last_error      = coalesce(r.error, o.last_error),
    published_at    = CASE WHEN r.state = 'published' THEN ?4 END
FROM (SELECT json_extract(j.value, '$[0]') AS seq,
             json_extract(j.value, '$[1]') AS state,
             json_extract(j.value, '$[2]') AS error,
             json_extract(j.value, '$[3]') AS delay_ms,
             json_extract(j.value, '$[4]') AS epoch
      FROM json_each(?2) AS j) AS r
WHERE o.seq = r.seq
  AND o.state = 'pending'
  AND EXISTS (SELECT 1 FROM outbox_partitions AS p
              WHERE p.partition = o.partition AND p.owner = ?1 AND p.epoch = r.epoch)
