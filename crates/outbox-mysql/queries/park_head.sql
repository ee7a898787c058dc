INSERT INTO {schema}.outbox_parked
  (seq, part, part_seq, aggregate_id, state, attempts, next_attempt_at, last_error)
