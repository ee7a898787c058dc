SELECT MAX(version) FROM {schema}.outbox_migrations
