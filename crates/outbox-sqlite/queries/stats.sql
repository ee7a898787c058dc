-- Counts for `outbox status`. The oldest pending age reads the first pending row in seq order
-- through the pending index (insert order, so in practice the oldest); retrying rows are
-- counted through their own small index, not by scanning every pending row. Held back
-- (`waiting`): pending rows that wait for a retry, and those behind a waiting or failed row of
-- their key (each probes the two small indexes of such rows). ?1 now (unix ms)
WITH held AS (
    SELECT o.created_at
    FROM outbox AS o INDEXED BY outbox_pending_idx
    WHERE o.state = 'pending'
      AND (o.next_attempt_at IS NOT NULL
           OR EXISTS (SELECT 1 FROM outbox AS x INDEXED BY outbox_failed_idx
                      WHERE x.state = 'failed' AND x.partition = o.partition
                        AND x.aggregate_id = o.aggregate_id AND x.seq < o.seq)
           OR EXISTS (SELECT 1 FROM outbox AS x INDEXED BY outbox_waiting_idx
                      WHERE x.state = 'pending' AND x.next_attempt_at IS NOT NULL
                        AND x.partition = o.partition AND x.aggregate_id = o.aggregate_id
                        AND x.seq < o.seq))
)
SELECT
  (SELECT count(*) FROM outbox WHERE state = 'pending') AS pending,
  (SELECT (?1 - (julianday(created_at) - 2440587.5) * 86400000.0) / 1000.0
     FROM outbox INDEXED BY outbox_pending_idx
     WHERE state = 'pending' ORDER BY seq LIMIT 1) AS oldest_pending_age_seconds,
  (SELECT count(*) FROM outbox WHERE state = 'failed') AS failed,
  (SELECT count(*) FROM outbox WHERE state = 'published') AS published,
  (SELECT count(*) FROM outbox INDEXED BY outbox_waiting_idx
     WHERE state = 'pending' AND next_attempt_at IS NOT NULL) AS retrying,
  (SELECT count(DISTINCT aggregate_id) FROM (
      SELECT aggregate_id FROM outbox INDEXED BY outbox_waiting_idx
      WHERE state = 'pending' AND next_attempt_at IS NOT NULL
      UNION ALL
      SELECT aggregate_id FROM outbox WHERE state = 'failed')) AS blocked_keys,
  (SELECT count(*) FROM held) AS waiting,
  (SELECT (?1 - (min(julianday(created_at)) - 2440587.5) * 86400000.0) / 1000.0 FROM held)
    AS oldest_waiting_age_seconds
