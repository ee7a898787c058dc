SELECT COUNT(*) FROM {schema}.outbox_positions AS p
  JOIN {schema}.outbox_sequence AS q ON q.part = p.part AND q.part_seq = p.passed + 1
  WHERE NOT EXISTS (SELECT 1 FROM {schema}.outbox AS o WHERE o.seq = q.seq)
