SELECT max(version) FROM {schema}.outbox_migrations
