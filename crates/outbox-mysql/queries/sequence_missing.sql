SELECT o.seq, CAST(o.aggregate_id AS CHAR) FROM {schema}.outbox AS o
  WHERE o.seq >= ? AND o.seq < ?
  AND NOT EXISTS (SELECT 1 FROM {schema}.outbox_sequence AS q WHERE q.seq = o.seq)
  ORDER BY o.seq LIMIT ?
