ALTER TABLE {schema}.outbox_sequence {partitioning}
