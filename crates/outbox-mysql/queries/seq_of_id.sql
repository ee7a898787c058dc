SELECT MAX(seq) FROM {schema}.outbox WHERE id = ?
