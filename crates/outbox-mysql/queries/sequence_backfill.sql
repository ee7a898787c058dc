INSERT INTO {schema}.outbox_sequence (seq, part, part_seq)
  SELECT o.seq, o.part, o.part_seq FROM {schema}.outbox AS o
  WHERE o.seq >= ? AND o.seq < ? AND o.part >= 0 AND o.part_seq > 0
  AND NOT EXISTS (SELECT 1 FROM {schema}.outbox_sequence AS q WHERE q.seq = o.seq)
