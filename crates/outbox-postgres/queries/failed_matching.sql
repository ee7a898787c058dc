-- The failed messages that match a filter (Store::failed_matching): how many in all, and one
-- page of them after a sequence, oldest first. The console's failed list and redrive preview
-- filter here, so their answer is right at any number of failed messages. Reads only the small
-- parked table (capped per partition). The text tests are strpos, not LIKE, so `%` and `_` in
-- what an operator types mean themselves. The first row carries the total even when the page
-- is empty (its message columns are then NULL).
-- $1 the key, exactly, or NULL; $2 part of `aggregate_type/event_type`, lower case, or NULL;
-- $3 part of the last error, lower case, or NULL; $4 only sequences above this, or NULL;
-- $5 at most this many.
WITH matching AS (
    SELECT id, seq, aggregate_type, aggregate_id, event_type, attempts, last_error, created_at
    FROM {schema}.outbox_parked
    WHERE state = 'failed'
      AND ($1::text IS NULL OR aggregate_id = $1::text)
      AND ($2::text IS NULL OR strpos(lower(aggregate_type || '/' || event_type), $2::text) > 0)
      AND ($3::text IS NULL OR strpos(lower(coalesce(last_error, '')), $3::text) > 0)
), page AS (
    SELECT *
    FROM matching
    WHERE $4::int8 IS NULL OR seq > $4::int8
    ORDER BY seq
    LIMIT $5
)
SELECT t.total, p.id, p.seq, p.aggregate_type, p.aggregate_id, p.event_type, p.attempts,
       p.last_error, p.created_at
FROM (SELECT count(*) AS total FROM matching) AS t
LEFT JOIN page AS p ON true
ORDER BY p.seq
