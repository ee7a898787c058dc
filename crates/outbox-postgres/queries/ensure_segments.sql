SELECT {schema}.outbox_ensure_segments($1)
