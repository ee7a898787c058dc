SELECT seq FROM {schema}.outbox_sequence WHERE seq IN (
