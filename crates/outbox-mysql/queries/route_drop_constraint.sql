ALTER TABLE {schema}.outbox DROP CONSTRAINT outbox_positioned
