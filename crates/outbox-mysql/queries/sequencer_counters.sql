SELECT p.part, GREATEST(p.n, COALESCE((SELECT q.part_seq
  FROM {schema}.outbox_sequence AS q WHERE q.part = p.part
  ORDER BY q.part_seq DESC LIMIT 1), 0), COALESCE((SELECT r.passed
  FROM {schema}.outbox_positions AS r WHERE r.part = p.part), 0))
  FROM {schema}.outbox_part_seq AS p
