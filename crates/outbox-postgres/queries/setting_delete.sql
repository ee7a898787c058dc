DELETE FROM {schema}.outbox_settings WHERE name = $1
