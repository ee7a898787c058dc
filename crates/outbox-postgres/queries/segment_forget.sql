DELETE FROM {schema}.outbox_segments WHERE name = $1
