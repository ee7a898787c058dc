-- Counts for `outbox status`. The oldest pending age reads each partition's head row through
-- the pending index.
SELECT
  (SELECT count(*) FROM {schema}.outbox WHERE state = 'pending') AS pending,
  (SELECT extract(epoch FROM now() - min(h.created_at))::float8
     FROM {schema}.outbox_partitions AS p
     CROSS JOIN LATERAL (SELECT created_at FROM {schema}.outbox
                         WHERE partition = p.partition AND state = 'pending'
                         ORDER BY seq LIMIT 1) AS h) AS oldest_pending_age_seconds,
  (SELECT count(*) FROM {schema}.outbox WHERE state = 'failed') AS failed,
  (SELECT count(*) FROM {schema}.outbox WHERE state = 'published') AS published,
  (SELECT count(*) FROM {schema}.outbox WHERE state = 'pending' AND attempts > 0) AS retrying,
  (SELECT count(DISTINCT aggregate_id) FROM (
      SELECT aggregate_id FROM {schema}.outbox WHERE state = 'pending' AND attempts > 0
      UNION ALL
      SELECT aggregate_id FROM {schema}.outbox WHERE state = 'failed') AS b) AS blocked_keys
