SELECT part FROM {schema}.outbox_part_seq
