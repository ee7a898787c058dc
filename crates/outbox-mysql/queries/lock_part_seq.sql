SELECT part FROM {schema}.outbox_part_seq ORDER BY part FOR UPDATE
