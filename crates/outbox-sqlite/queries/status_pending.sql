-- Pending messages by partition, aggregate type, event type and topic, for `outbox status`,
-- with the age of each group's oldest message, oldest first; at most ?2 groups. Reads the
-- pending rows through the pending index. ?1 now (unix ms)
SELECT partition, aggregate_type, event_type, topic, count(*) AS pending,
       (?1 - (min(julianday(created_at)) - 2440587.5) * 86400000.0) / 1000.0
         AS oldest_pending_age_seconds
FROM outbox INDEXED BY outbox_pending_idx
WHERE state = 'pending'
GROUP BY partition, aggregate_type, event_type, topic
ORDER BY min(julianday(created_at))
LIMIT ?2
