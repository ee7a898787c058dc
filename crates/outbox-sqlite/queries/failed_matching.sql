-- The failed messages that match a filter (Store::failed_matching): how many in all, and one
-- page of them after a seq, oldest first; the first row carries the total even when the page is
-- empty (its message columns are then NULL). instr, not LIKE, so `%` and `_` typed by an
-- operator mean themselves; lower() folds ASCII letters.
-- ?1 the key, exactly, or NULL; ?2 part of `aggregate_type/event_type`, lower case, or NULL;
-- ?3 part of the last error, lower case, or NULL; ?4 only seqs above this, or NULL; ?5 at most
-- this many.
WITH matching AS (
    SELECT seq, id, aggregate_type, aggregate_id, event_type, payload, headers, topic,
           CAST(round((julianday(created_at) - 2440587.5) * 86400000) AS INTEGER) AS created_ms,
           attempts, last_error
    FROM outbox
    WHERE state = 'failed'
      AND (?1 IS NULL OR aggregate_id = ?1)
      AND (?2 IS NULL OR instr(lower(aggregate_type || '/' || event_type), ?2) > 0)
      AND (?3 IS NULL OR instr(lower(coalesce(last_error, '')), ?3) > 0)
), page AS (
    SELECT * FROM matching WHERE ?4 IS NULL OR seq > ?4 ORDER BY seq LIMIT ?5
)
SELECT t.total, p.*
FROM (SELECT count(*) AS total FROM matching) AS t
LEFT JOIN page AS p ON 1
ORDER BY p.seq
