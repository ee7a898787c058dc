SELECT EXISTS (SELECT 1 FROM {schema}.outbox_sequence WHERE seq = ?)
