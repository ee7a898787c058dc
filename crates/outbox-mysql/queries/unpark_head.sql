DELETE FROM {schema}.outbox_parked WHERE seq IN (
