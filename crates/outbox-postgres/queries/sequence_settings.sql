SELECT seqcache, seqincrement, seqcycle
  FROM pg_sequence
  WHERE seqrelid = to_regclass('{schema}.outbox_seq_v2')
