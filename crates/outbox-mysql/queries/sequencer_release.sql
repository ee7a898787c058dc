UPDATE {schema}.outbox_sequencer SET owner = NULL,
  lease_until = '1970-01-01 00:00:00' WHERE id = 1 AND owner = ?
