SELECT COUNT(*) FROM {schema}.outbox_members
