-- Counts for `outbox status`. The oldest pending age reads the first pending row in seq order
-- through the pending index (insert order, so in practice the oldest); retrying rows are
-- counted through their own small index, not by scanning every pending row. ?1 now (unix ms)
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
      SELECT aggregate_id FROM outbox WHERE state = 'failed')) AS blocked_keys
