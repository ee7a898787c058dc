INSERT INTO {schema}.outbox_sequence (seq, part, part_seq)
