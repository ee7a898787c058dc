WITH matching AS (
SELECT p.seq, o.id, o.aggregate_type, o.aggregate_id, o.event_type, p.attempts,
       p.last_error, o.created_at
FROM {schema}.outbox_parked AS p JOIN {schema}.outbox AS o ON o.seq = p.seq
WHERE p.state = 'failed'
  AND (? IS NULL OR p.aggregate_id = ?)
  AND (? IS NULL OR LOCATE(?, LOWER(CONCAT(o.aggregate_type, '/', o.event_type))) > 0)
  AND (? IS NULL OR LOCATE(?, LOWER(COALESCE(p.last_error, ''))) > 0)),
page AS (SELECT * FROM matching WHERE ? IS NULL OR seq > ? ORDER BY seq LIMIT ?)
SELECT t.total, m.seq, CAST(m.id AS CHAR) AS id,
     CAST(m.aggregate_type AS CHAR) AS aggregate_type,
     CAST(m.aggregate_id AS CHAR) AS aggregate_id,
     CAST(m.event_type AS CHAR) AS event_type, m.attempts,
     CAST(m.last_error AS CHAR) AS last_error, m.created_at
FROM (SELECT COUNT(*) AS total FROM matching) AS t LEFT JOIN page AS m ON TRUE
ORDER BY m.seq
