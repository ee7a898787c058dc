SELECT max(version) FROM outbox_migrations
