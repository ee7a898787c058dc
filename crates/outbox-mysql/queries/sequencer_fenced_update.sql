UPDATE {schema}.outbox_sequencer SET {set}, beats = beats + 1,
  lease_until = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND,
  updated_at = UTC_TIMESTAMP(6) WHERE id = 1 AND owner = ? AND epoch = ?
