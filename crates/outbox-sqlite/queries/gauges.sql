-- The figures of a metrics scrape (`Store::gauges`), in one statement whose cost does not grow
-- with the backlog. Pending is counted through the partial pending index up to ?2 rows (a
-- scrape reads at most that many index entries); the oldest pending age reads the first
-- pending row in seq order (stats.sql's probe); retrying and failed rows through their own
-- small partial indexes. SQLite has no parked table: its parked messages are its retrying and
-- failed rows. ?1 now (unix ms), ?2 the pending cap.
SELECT
  (SELECT count(*) FROM (SELECT 1 FROM outbox INDEXED BY outbox_pending_idx
                         WHERE state = 'pending' LIMIT ?2)) AS pending,
  (SELECT (?1 - (julianday(created_at) - 2440587.5) * 86400000.0) / 1000.0
     FROM outbox INDEXED BY outbox_pending_idx
     WHERE state = 'pending' ORDER BY seq LIMIT 1) AS oldest_pending_age_seconds,
  (SELECT count(*) FROM outbox INDEXED BY outbox_waiting_idx
     WHERE state = 'pending' AND next_attempt_at IS NOT NULL) AS retrying,
  (SELECT count(*) FROM outbox INDEXED BY outbox_failed_idx WHERE state = 'failed') AS failed
