UPDATE {schema}.outbox_sequencer SET owner = ?, epoch = epoch + 1,
  beats = beats + 1, lease_until = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND
  WHERE id = 1 AND (owner IS NULL OR owner = ? OR lease_until < UTC_TIMESTAMP(6))
