SELECT (SELECT value FROM {schema}.outbox_settings WHERE name = 'range_seqs'),
  (SELECT value FROM {schema}.outbox_settings WHERE name = 'sealed_below'),
  (SELECT COALESCE(MAX(seq), 0) FROM {schema}.outbox)
