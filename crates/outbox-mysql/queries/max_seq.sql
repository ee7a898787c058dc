SELECT COALESCE(MAX(seq), 0) FROM {schema}.outbox
