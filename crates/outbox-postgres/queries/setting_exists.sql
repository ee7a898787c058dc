SELECT EXISTS (SELECT 1 FROM {schema}.outbox_settings WHERE name = $1)
